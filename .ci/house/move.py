#!/usr/bin/env python3
"""Move gitward from the flat layout to context packages, from `.ci/house/mapping.toml`.

Run from the repository root on a clean tree that still has the flat layout:

    python .ci/house/move.py            # moves, rewrites, writes the package surfaces
    python .ci/house/move.py --report   # only says what it would do

What it does, in order (docs/architecture.md explains the result):

1. `git mv` every module to its package (two modules merged into one where the map says),
   every test to `tests/<package path>/test_<module>.py`, helpers to `tests/support/`.
2. Rewrites every import in Python files with `ast` positions, never by guessing:
   * inside a context package, and in tests and bench scripts, an import names the module
     that defines the name (`from dashboard.locks.leases import acquire`), so a test's
     `monkeypatch.setattr(module, ...)` patches the module that reads the name;
   * from outside a context, an import names the package (`from dashboard.locks import
     acquire`, or `from dashboard import locks` and `locks.acquire(...)`), and the name is
     added to the package's `__all__`.
   A module imported whole keeps working under its new name: the file's uses of the old
   name are renamed at their `ast` positions (with an alias where the new name is taken).
3. Rewrites dotted paths (`dashboard.leases.acquire`) and file paths (`dashboard/leases.py`,
   `tests/test_leases.py`) in every tracked text file.
4. Writes each new package's `__init__.py`: its docstring from the map and its public
   surface (the names other packages use), imported from their defining modules.

It never leaves a module behind as a re-export shim: an old path either moves or is gone.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = tomllib.loads((ROOT / ".ci" / "house" / "mapping.toml").read_text())
REPORT = "--report" in sys.argv

# --- the map -------------------------------------------------------------------------

#: old dotted module -> new dotted module
MODULES: dict[str, str] = {}
#: new package -> kind ("context" | "interface" | "core")
KIND: dict[str, str] = {}
for package, spec in MAP["packages"].items():
    KIND[package] = spec["kind"]
    top = package.split(".")[0]
    for old, new in spec["modules"].items():
        MODULES[f"{top}.{old}"] = f"{package}.{new}"

#: a module RQ names by a dotted path stored in Redis, moved to the jobs module
FUNCTION_MOVES = {"dashboard.deploylock.drive_rollout": "workers.jobs.drive_rollout"}


def package_of(module: str | None) -> str | None:
    """The context/interface/core package a (new) module belongs to, if any."""
    if module is None:
        return None
    parts = module.split(".")
    if len(parts) >= 2 and ".".join(parts[:2]) in KIND:
        return ".".join(parts[:2])
    return None


def path_of(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def test_moves() -> dict[str, str]:
    """tests/<old>.py -> tests/<new>.py (relative to tests/)."""
    moves: dict[str, str] = {}
    explicit = MAP["tests"]
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        stem = path.stem
        if stem in explicit:
            moves[path.name] = explicit[stem]
            continue
        name = stem.removeprefix("test_")
        found = None
        for top in ("dashboard", "workers"):
            old = f"{top}.{name}"
            if old in MODULES:
                new = MODULES[old]
                found = "/".join(new.split(".")[:-1]) + f"/test_{new.rsplit('.', 1)[1]}.py"
            elif (ROOT / top / f"{name}.py").exists():
                found = f"{top}/test_{name}.py"
            if found:
                break
        if found is None:
            sys.exit(f"no place for tests/{path.name}: add it to [tests] in the mapping")
        moves[path.name] = found
    for old, new in MAP["support"].items():
        moves[f"{old}.py"] = f"support/{new}.py"
    return moves


TESTS = test_moves()
#: old test-helper module (tests.x) -> new (tests.support.y); test modules too
TEST_MODULES = {
    "tests." + old.removesuffix(".py"): "tests." + new.removesuffix(".py").replace("/", ".")
    for old, new in TESTS.items()
}


# --- step 1: moves -------------------------------------------------------------------


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def move_files() -> None:
    merged = MAP["merge"]
    merge_targets = {target: spec for target, spec in merged.items()}
    for old, new in MODULES.items():
        if new in merge_targets:
            continue
        src, dst = path_of(old), path_of(new)
        dst.parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(src.relative_to(ROOT)), str(dst.relative_to(ROOT)))
    for target, spec in merge_targets.items():
        top = target.split(".")[0]
        sources = [path_of(f"{top}.{name}") for name in spec["order"]]
        path_of(target).parent.mkdir(parents=True, exist_ok=True)
        first, *rest = sources
        git("mv", str(first.relative_to(ROOT)), str(path_of(target).relative_to(ROOT)))
        texts = [path_of(target).read_text()] + [p.read_text() for p in rest]
        path_of(target).write_text(merge_modules(spec["doc"], texts))
        for p in rest:
            git("rm", "-q", str(p.relative_to(ROOT)))
    for package in KIND:
        init = path_of(package + ".__init__")
        if not init.exists():
            init.write_text('"""(written below)"""\n')
            git("add", str(init.relative_to(ROOT)))
    # tests
    for old, new in TESTS.items():
        dst = ROOT / "tests" / new
        dst.parent.mkdir(parents=True, exist_ok=True)
        git("mv", f"tests/{old}", f"tests/{new}")
    git("mv", "tests/fixtures", "tests/support/fixtures")
    for directory in sorted({(ROOT / "tests" / new).parent for new in TESTS.values()}):
        d = directory
        while d != ROOT / "tests":
            init = d / "__init__.py"
            if not init.exists():
                init.write_text("")
                git("add", str(init.relative_to(ROOT)))
            d = d.parent


def merge_modules(doc: str, texts: list[str]) -> str:
    """One module from several: the map's docstring, every import once, then each body,
    with one ``__all__`` listing every name the parts exported."""
    imports: list[str] = []
    bodies: list[str] = []
    exported: list[str] = []
    for text in texts:
        tree = ast.parse(text)
        lines = text.splitlines(keepends=True)
        body_start = None
        for node in tree.body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            segment = "".join(lines[node.lineno - 1 : node.end_lineno])
            if isinstance(node, ast.Import | ast.ImportFrom):
                if segment not in imports:
                    imports.append(segment)
                continue
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__all__"
            ):
                exported += ast.literal_eval(node.value)
                continue
            if body_start is None:
                body_start = node.lineno
        if body_start is not None:
            bodies.append("".join(lines[body_start - 1 :]))
        for node in tree.body:
            public = isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name[0] != "_"
            if public and node.name not in exported:
                exported.append(node.name)
    future = [i for i in imports if "__future__" in i]
    rest = [i for i in imports if "__future__" not in i]
    names = ", ".join(f'"{n}"' for n in sorted(set(exported)))
    return (
        f'"""{doc}"""\n\n'
        + "".join(future)
        + "\n"
        + "".join(rest)
        + f"\n__all__ = [{names}]\n\n\n"
        + "\n\n".join(b.rstrip("\n") + "\n" for b in bodies)
    )


# --- step 2: imports -------------------------------------------------------------------

#: package -> {name: defining module}, the public surface other packages use
SURFACE: dict[str, dict[str, str]] = defaultdict(dict)
PROBLEMS: list[str] = []


def new_module_name(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    if rel.parts[0] not in ("dashboard", "workers"):
        return None
    name = ".".join(rel.with_suffix("").parts)
    return name.removesuffix(".__init__")


def defining_module(old_module: str, name: str, seen: int = 0) -> str:
    """The old module that defines ``name`` when ``old_module`` exports it (re-exports
    followed), so the surface imports it from where it lives."""
    path = ROOT / (old_module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / old_module.replace(".", "/") / "__init__.py"
    if not path.exists() or seen > 5:
        return old_module
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name and node.module in MODULES | {
                    m: m for m in MODULES.values()
                }:
                    return defining_module(node.module, alias.name, seen + 1)
    return old_module


def bound_names(tree: ast.AST) -> set[str]:
    """Identifiers a file binds other than by importing a module that moves: a new local
    name must not collide with one of them. (A class body's own fields do not count:
    they never hide a module's name from its methods.)"""
    names: set[str] = set()
    fields = {
        id(target)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for statement in cls.body
        if isinstance(statement, ast.AnnAssign)
        for target in [statement.target]
    }
    for node in ast.walk(tree):
        if id(node) in fields:
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full not in MODULES and full not in TEST_MODULES:
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


class Edits:
    """Replacements at (line, col) spans of one file, applied back to front."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.offsets = [0]
        for line in self.lines:
            self.offsets.append(self.offsets[-1] + len(line))
        self.text = text
        self.spans: list[tuple[int, int, str]] = []

    def pos(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        raw = self.lines[line - 1].encode()[:col].decode()
        return self.offsets[line - 1] + len(raw)

    def replace(self, node: ast.AST, text: str, whole_lines: bool = False) -> None:
        if whole_lines:
            start = self.offsets[node.lineno - 1] + (
                len(self.lines[node.lineno - 1]) - len(self.lines[node.lineno - 1].lstrip())
            )
        else:
            start = self.pos(node.lineno, node.col_offset)
        end = self.pos(node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
        self.spans.append((start, end, text))

    def apply(self, between: Callable[[str], str] = lambda t: t) -> str:
        """The edited text; ``between`` rewrites the text outside the edited spans."""
        out: list[str] = []
        at = 0
        for start, end, text in sorted(self.spans):
            out += [between(self.text[at:start]), text]
            at = end
        out.append(between(self.text[at:]))
        return "".join(out)


def old_of(module: str) -> str | None:
    """The map's old name for an imported module path, if it moved."""
    if module in MODULES:
        return module
    return None


def rewrite_imports(path: Path) -> str | None:
    text = path.read_text()
    tree = ast.parse(text)
    me = new_module_name(path)
    my_package = package_of(me)
    # Code outside a context package imports contexts through their packages; tests and
    # bench scripts name the defining module (white-box, and patches land where read).
    is_code = me is not None
    edits = Edits(text)
    taken = bound_names(tree)
    locals_: dict[str, str] = {}  # imported package or module -> its local name here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in KIND and full not in MODULES:
                    locals_[full] = alias.asname or alias.name
    emitted: list[str] = []  # import lines the import being rewritten gains

    def local_for(target: str) -> str:
        """The local name of a package or module this file now imports whole."""
        if target in locals_:
            return locals_[target]
        parent, leaf = target.rsplit(".", 1)
        name = leaf
        if name in taken or name in locals_.values():
            name = parent.rsplit(".", 1)[-1] + "_" + leaf
            PROBLEMS.append(f"{path}: {leaf} taken, aliased {name}")
            if name in taken or name in locals_.values():
                sys.exit(f"{path}: no free local name for {target}")
        locals_[target] = name
        emitted.append(f"from {parent} import {leaf}" + (f" as {name}" if name != leaf else ""))
        return name

    def name_target(old: str, name: str) -> tuple[str, str]:
        """Where ``name``, imported from old module ``old``, is imported from now:
        (module or package, defining module)."""
        new = MODULES.get(old) or TEST_MODULES.get(old, old)
        defining = MODULES.get(defining_module(old, name), new)
        package = package_of(defining)
        if crosses(is_code, package, my_package):
            assert package is not None
            return package, defining
        return defining, defining

    removed: list[ast.ImportFrom] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if old_of(alias.name) or alias.name in TEST_MODULES:
                        PROBLEMS.append(f"{path}:{node.lineno}: plain `import {alias.name}`")
            continue
        statements: list[str] = []
        keep: list[ast.alias] = []
        grouped: dict[str, list[str]] = {}  # names imported from one module, together
        touched = False
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            local = alias.asname or alias.name
            if full in MODULES or full in TEST_MODULES:
                # a module imported whole: each use goes to where its name lives now
                touched = True
                new = MODULES.get(full) or TEST_MODULES[full]
                for ref, attr in module_refs(tree, local):
                    if attr is None:
                        package = package_of(new)
                        if crosses(is_code, package, my_package):
                            PROBLEMS.append(f"{path}: module {local} used bare")
                        edits.replace(ref, local_for(new) if not alias.asname else local)
                        continue
                    target, defining = name_target(full, attr)
                    if target != defining:
                        SURFACE[target][attr] = defining
                    if alias.asname and target == new:
                        continue  # an alias the file chose keeps its name
                    edits.replace(ref, local_for(target))
                if alias.asname:
                    parent, leaf = new.rsplit(".", 1)
                    statements.append(f"from {parent} import {leaf} as {alias.asname}")
            elif node.module in MODULES or node.module in TEST_MODULES:
                touched = True
                target, defining = name_target(node.module, alias.name)
                if target != defining:
                    SURFACE[target][alias.name] = defining
                grouped.setdefault(target, []).append(as_text(alias))
            else:
                keep.append(alias)
        if not touched:
            continue
        statements += [f"from {t} import {', '.join(names)}" for t, names in grouped.items()]
        if keep:
            statements.insert(0, f"from {node.module} import {', '.join(map(as_text, keep))}")
        statements += [e for e in emitted if e not in statements]
        emitted.clear()
        removed.append(node)
        node._statements = statements  # type: ignore[attr-defined]

    for node in removed:
        statements = node._statements  # type: ignore[attr-defined]
        indent = " " * node.col_offset
        start = edits.pos(node.lineno, node.col_offset)
        end = edits.pos(node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
        comment = re.search(r"#\s*noqa[^\n]*", edits.text[start:end])
        if comment:  # a comment inside the parentheses stays after the opening one
            statements = [
                st.replace(" import ", f" import (  {comment.group(0)}\n{indent}    ", 1)
                + f",\n{indent})"
                for st in statements
            ]
        line_end = edits.offsets[node.end_lineno]  # type: ignore[index]
        trailing = re.search(r"#\s*noqa[^\n]*", edits.text[end:line_end])
        if trailing:  # the last line keeps the file's own comment; the new ones get it too
            statements = [f"{st}  {trailing.group(0)}" for st in statements[:-1]] + statements[-1:]
        edits.replace(node, ("\n" + indent).join(statements))
    updated = edits.apply(between=rewrite_text)
    return updated if updated != text else None


def module_refs(tree: ast.AST, name: str) -> list[tuple[ast.Name, str | None]]:
    """The file's reads of the module-level ``name`` (with the attribute read from it),
    leaving out functions that bind ``name`` themselves."""
    shadowed: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = list(ast.walk(fn))
            if any(
                (isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load))
                or (isinstance(n, ast.arg) and n.arg == name)
                for n in inner
            ):
                shadowed.update(id(n) for n in inner)
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Name)
            and n.id == name
            and not isinstance(n.ctx, ast.Load)
            and id(n) not in shadowed
            and not _in_class_body(tree, n)
        ):
            PROBLEMS.append(f"module-level rebinding of {name}")
    attrs = {
        id(n.value): n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    return [
        (n, attrs.get(id(n)))
        for n in ast.walk(tree)
        if isinstance(n, ast.Name)
        and n.id == name
        and isinstance(n.ctx, ast.Load)
        and id(n) not in shadowed
    ]


def _in_class_body(tree: ast.AST, target: ast.AST) -> bool:
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any(n is target for n in ast.walk(cls)):
            return True
    return False


def crosses(is_code: bool, target: str | None, mine: str | None) -> bool:
    """Whether code in package ``mine`` must import ``target`` through its surface: code
    (not tests or bench scripts) reaching into another context or core package."""
    return bool(is_code and target and target != mine and KIND[target] != "interface")


def as_text(alias: ast.alias) -> str:
    return alias.name + (f" as {alias.asname}" if alias.asname else "")


# --- step 3: dotted and file paths in text ----------------------------------------------


def text_rewrites() -> list[tuple[re.Pattern[str], str]]:
    pairs: dict[str, str] = dict(FUNCTION_MOVES)
    for old, new in MODULES.items():
        pairs[old] = new
    for old, new in TEST_MODULES.items():
        pairs[old] = new
    rules = []
    dotted = sorted(pairs, key=len, reverse=True)
    rules.append(
        (
            re.compile(r"(?<![\w.])(" + "|".join(re.escape(d) for d in dotted) + r")(?![\w])"),
            pairs,
        )
    )
    slashed = {}
    for old, new in MODULES.items():
        slashed[old.replace(".", "/") + ".py"] = new.replace(".", "/") + ".py"
    for old, new in TESTS.items():
        slashed[f"tests/{old}"] = f"tests/{new}"
    slashed["tests/fixtures/"] = "tests/support/fixtures/"
    rules.append(
        (
            re.compile(
                r"(?<![\w./])("
                + "|".join(re.escape(s) for s in sorted(slashed, key=len, reverse=True))
                + r")"
            ),
            slashed,
        )
    )
    return rules  # type: ignore[return-value]


RULES = text_rewrites()


def rewrite_text(text: str) -> str:
    for pattern, table in RULES:
        text = pattern.sub(lambda m, table=table: table[m.group(1)], text)  # type: ignore[misc]
    return text


# --- step 4: package surfaces -------------------------------------------------------------


def write_surfaces() -> None:
    for package, names in SURFACE.items():
        # importing a module sets it on its package, where it would hide a lazy name
        clash = {n for n in names if f"{package}.{n}" in MODULES.values()}
        if clash:
            sys.exit(f"{package}: public names equal to its module names: {sorted(clash)}")
    for package in KIND:
        init = path_of(package + ".__init__")
        doc = MAP["packages"][package]["doc"]
        names = SURFACE.get(package, {})
        by_module: dict[str, list[str]] = defaultdict(list)
        for name, module in sorted(names.items()):
            by_module[module].append(name)
        if package == "workers.locks":
            # an existing package: keep its docstring and imports, extend its surface
            text = init.read_text()
            tree = ast.parse(text)
            existing = set()
            for node in tree.body:
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
                    existing = set(ast.literal_eval(node.value))
            extra = {n: m for n, m in names.items() if n not in existing}
            if extra:
                lines = [
                    f"from {module} import {', '.join(sorted(ns))}\n"
                    for module, ns in sorted(_group(extra).items())
                ]
                head, _, tail = text.partition("\n__all__ = [")
                text = head.rstrip("\n") + "\n" + "".join(lines) + "\n__all__ = [" + tail
                allnames = sorted(existing | set(extra))
                text = re.sub(
                    r"__all__ = \[.*?\]",
                    "__all__ = [" + ", ".join(f'"{n}"' for n in allnames) + "]",
                    text,
                    flags=re.S,
                )
                init.write_text(text)
            continue
        if KIND[package] == "interface":
            # an interface's surface is its modules, named by urls.py, asgi.py and settings
            modules = sorted(
                {m.rsplit(".", 1)[1] for m in MODULES.values() if package_of(m) == package}
            )
            listed = ", ".join(f'"{m}"' for m in modules)
            init.write_text(f'"""{doc}"""\n\n__all__ = [{listed}]\n')
            continue
        exported = "__all__ = [" + ", ".join(f'"{n}"' for n in sorted(names)) + "]\n"
        if package.startswith("workers."):
            # Django-free: the surface is imported at once.
            lines = [f'"""{doc}"""\n\n', "from __future__ import annotations\n\n"]
            for module, ns in sorted(by_module.items()):
                lines.append(f"from {module} import {', '.join(ns)}\n")
            lines.append("\n" + exported)
            init.write_text("".join(lines))
            continue
        lines = [
            f'"""{doc}"""\n\n',
            "from __future__ import annotations\n\n",
            "import importlib\n",
            "from typing import TYPE_CHECKING\n\n",
            "if TYPE_CHECKING:\n",
        ]
        for module, ns in sorted(by_module.items()):
            lines.append(f"    from {module} import {', '.join(ns)}\n")
        if not by_module:
            lines.append("    pass\n")
        lines.append("\n" + exported + "\n")
        lines.append(SURFACE_NOTE)
        lines.append("_SURFACE: dict[str, str] = {\n")
        for module, ns in sorted(by_module.items()):
            for n in ns:
                lines.append(f'    "{n}": "{module}",\n')
        lines.append("}\n\n\n")
        lines.append(LAZY_GETATTR)
        init.write_text("".join(lines))


SURFACE_NOTE = """\
#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
"""

LAZY_GETATTR = """\
def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
"""


def _group(names: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for n, m in names.items():
        out[m].append(n)
    return out


# --- main ---------------------------------------------------------------------------------


def tracked_files() -> list[Path]:
    return [ROOT / p for p in git("ls-files").splitlines()]


def main() -> None:
    if not REPORT and git("status", "--porcelain", "--untracked-files=no").strip():
        sys.exit("the tree has changes: commit or stash them first")
    # Imports first, on the flat tree (defining modules are read at their old paths).
    python = [
        p
        for p in tracked_files()
        if p.suffix == ".py" and "migrations" not in p.parts and ".ci" not in p.parts
    ]
    new_texts: dict[Path, str] = {}
    for path in python:
        # the path the file will have, so it knows its package
        moved = future_path(path)
        text = rewrite_imports_at(path, moved)
        if text is not None:
            new_texts[path] = text
    if REPORT:
        for problem in PROBLEMS:
            print("PROBLEM", problem)
        for package, names in sorted(SURFACE.items()):
            print(package, len(names), sorted(names))
        return
    for path, text in new_texts.items():
        path.write_text(text)
    done = {future_path(p) for p in python}
    move_files()
    for path in tracked_files():
        if not path.is_file() or path.suffix in (".png", ".ico", ".woff2", ".gz"):
            continue
        if ".ci" in path.relative_to(ROOT).parts[:1] and path.name in ("move.py", "mapping.toml"):
            continue
        if "migrations" in path.parts or path in done:
            updated = fix_roots(path, path.read_text()) if path.suffix == ".py" else None
            if updated is not None and updated != path.read_text():
                path.write_text(updated)
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        updated = rewrite_text(text)
        updated = fix_roots(path, updated)
        if updated != text:
            path.write_text(updated)
    write_surfaces()
    git("add", "-A", "dashboard", "workers", "tests")
    for problem in PROBLEMS:
        print("PROBLEM", problem)


def future_path(path: Path) -> Path:
    rel = path.relative_to(ROOT)
    module = ".".join(rel.with_suffix("").parts)
    if module in MODULES:
        return path_of(MODULES[module])
    if rel.parts[0] == "tests" and len(rel.parts) == 2 and rel.name in TESTS:
        return ROOT / "tests" / TESTS[rel.name]
    return path


def rewrite_imports_at(path: Path, moved: Path) -> str | None:
    """rewrite_imports for ``path`` as if it already lived at ``moved``."""
    global new_module_name
    original = new_module_name

    def at_new_place(p: Path) -> str | None:
        return original(moved) if p == path else original(p)

    new_module_name = at_new_place  # type: ignore[assignment]
    try:
        return rewrite_imports(path)
    finally:
        new_module_name = original  # type: ignore[assignment]


def fix_roots(path: Path, text: str) -> str:
    """Tests and helpers one level deeper or more: their repository root and fixtures."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] != "tests" or len(rel.parts) <= 2:
        return text
    depth = len(rel.parts) - 1  # tests/a/b/x.py -> parents[3] is the root
    text = text.replace(
        "Path(__file__).resolve().parent.parent", f"Path(__file__).resolve().parents[{depth}]"
    )
    text = text.replace(
        'Path(__file__).resolve().parent / "fixtures"',
        f'Path(__file__).resolve().parents[{depth - 1}] / "support" / "fixtures"',
    )
    return text


if __name__ == "__main__":
    main()
