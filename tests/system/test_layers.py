"""The house (docs/architecture.md): every package of dashboard/ and workers/ sits in exactly
one layer of the import-linter contract (pyproject.toml), has a docstring and a public
surface, is imported only through that surface from outside, is named on the
architecture page, and every module arrives with its own test module."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Django's discovery points and the job entry points stay at the top (the rest is in packages).
TOP_LIMIT = {"dashboard": 12, "workers": 6}
#: Packages tested as a whole: their modules are thin (commands, resources, filters, models)
#: or one algorithm spread over modules (the Redlock).
UNITS = {
    "dashboard.api",
    "dashboard.management",
    "dashboard.models",
    "dashboard.templatetags",
    "workers.locks",
}
#: Modules whose focused tests live in a test module named after the feature they serve.
TESTED_UNDER = {
    "dashboard.templatetags": "dashboard/web/test_pages",  # the filters, through the pages
    "dashboard.infra.events": "dashboard/live/test_live_view",  # published, then received
    "dashboard.repositories.reanalysis": "dashboard/repositories/test_one_commit",
    "dashboard.web.commits": "dashboard/repositories/test_one_commit",
    "dashboard.rollouts.drains": "dashboard/rollouts/test_start",
    "dashboard.rollouts.buttons": "dashboard/rollouts/test_board",
    "dashboard.rollouts.rollback_offers": "dashboard/rollouts/test_board",
    "dashboard.rollouts.steps": "dashboard/rollouts/test_driver",
    "dashboard.server.request_threads": "dashboard/test_asgi",  # the ASGI handler's threads
    "dashboard.web.ops": "dashboard/web/test_pages",  # the operations pages, as read
    "dashboard.web.runs": "dashboard/web/test_pages",
    "workers.analysis.numstat": "workers/analysis/test_history",  # the stream history reads
    "workers.git.fetch_errors": "workers/git/test_hardening",  # refused fetches, limits
    "workers.git.mirror_limits": "workers/git/test_hardening",
    "workers.remotes.branches": "workers/remotes/test_parse",  # the URL grammar's parts
    "workers.remotes.hosts": "workers/remotes/test_parse",
    "workers.remotes.policy": "workers/remotes/test_parse",
    "workers.remotes.redaction": "workers/remotes/test_parse",
}


def _contracts() -> list[dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["importlinter"]["contracts"]


def _layers() -> list[list[str]]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in layers["layers"]]


def _units() -> set[str]:
    """The top-level modules and packages of dashboard/ and workers/."""
    names = set()
    for top in ("dashboard", "workers"):
        for path in (ROOT / top).iterdir():
            if path.suffix == ".py" and path.stem != "__init__":
                names.add(f"{top}.{path.stem}")
            elif (path / "__init__.py").exists() and path.name != "migrations":
                names.add(f"{top}.{path.name}")
    return names


def _packages() -> set[str]:
    return {u for u in _units() if (ROOT / u.replace(".", "/") / "__init__.py").exists()}


def _surfaced() -> set[str]:
    """Packages reached only through their ``__init__``: every layer below the interfaces."""
    return {name for layer in _layers()[1:] for name in layer} & _packages()


def _modules(package: str) -> list[str]:
    base = ROOT / package.replace(".", "/")
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in base.rglob("*.py")
        if p.name != "__init__.py" and "migrations" not in p.parts
    )


def test_it_places_every_package_and_top_module_in_one_layer() -> None:
    placed = [m for layer in _layers() for m in layer]
    assert len(placed) == len(set(placed)), "a name is listed in two layers"
    assert set(placed) - _units() == set(), "the contract names what does not exist"
    missing = _units() - set(placed)
    assert not missing, f"in no layer of the import-linter contract: {sorted(missing)}"


def test_the_top_of_each_tree_stays_small() -> None:
    for top, limit in TOP_LIMIT.items():
        modules = [p for p in (ROOT / top).glob("*.py")]
        assert len(modules) <= limit, f"{top}/ has {len(modules)} top-level modules"


def test_it_forbids_django_in_every_core_package() -> None:
    core = {m for layer in _layers() for m in layer if m.startswith("workers.")} - {
        "workers.jobs",
        "workers.pool",
    }
    (forbidden,) = [c for c in _contracts() if c["type"] == "forbidden"]
    assert core == set(forbidden["source_modules"])
    assert {"django", "dashboard", "channels", "rq"} <= set(forbidden["forbidden_modules"])


def test_every_package_has_a_docstring_and_a_public_surface() -> None:
    for package in sorted(_packages()):
        tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"{package} has no docstring"
        if package in _surfaced() or package.startswith("workers."):
            exported = [
                node
                for node in tree.body
                if isinstance(node, ast.Assign)
                and any(getattr(t, "id", "") == "__all__" for t in node.targets)
            ]
            assert exported, f"{package} has no __all__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports (``from a.b import c`` counts as a.b.c when c is a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (ROOT / (full.replace(".", "/") + ".py")).exists() or (
                    ROOT / full.replace(".", "/") / "__init__.py"
                ).exists()
                found.append((node.lineno, full if is_module else node.module))
    return found


def test_a_context_is_imported_only_through_its_package_from_outside() -> None:
    surfaced = _surfaced()
    wrong = []
    for top in ("dashboard", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            me = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for line, module in _imports(path):
                parts = module.split(".")
                package = ".".join(parts[:2])
                if package in surfaced and len(parts) > 2 and not me.startswith(package + "."):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "reach past a package's surface:\n" + "\n".join(wrong)


def test_the_check_above_sees_an_import_past_a_surface(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from dashboard.locks.leases import redlock\nfrom dashboard import locks\n")
    assert [m for _, m in _imports(bad)] == ["dashboard.locks.leases", "dashboard.locks"]


def test_the_architecture_page_names_every_package() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        p for p in sorted(_packages()) if f"{p.replace('.', '/')}/" not in page and p not in page
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_module_has_a_test_module() -> None:
    """Tests mirror the code (docs/testing.md): tests/<package path>/test_<module>.py."""
    missing = []
    for unit in sorted(_units()):
        if unit in UNITS and unit in TESTED_UNDER:
            if not (ROOT / "tests" / f"{TESTED_UNDER[unit]}.py").exists():
                missing.append(unit)
            continue
        if unit in UNITS:
            folder = ROOT / "tests" / unit.replace(".", "/")
            if not list(folder.glob("test_*.py")):
                missing.append(unit)
            continue
        modules = _modules(unit) if unit in _packages() else [unit]
        for module in modules:
            parts = module.split(".")
            name = TESTED_UNDER.get(module, "/".join(parts[:-1]) + f"/test_{parts[-1]}")
            if not (ROOT / "tests" / f"{name}.py").exists():
                missing.append(module)
    assert not missing, f"modules without a test module: {missing}"
