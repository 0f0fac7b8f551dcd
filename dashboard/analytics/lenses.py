"""Read-time lenses (docs/analytics.md#lenses): the generated, vendored, lock and minified
files, and the bots' commits, that a report may leave out with ``exclude=…``, without any
re-analysis: every lens is a condition the analyses' SQL adds to the stored rows.

- **Path rules** are a data table (:data:`RULES`, version :data:`RULESET`), in the spirit
  of GitHub Linguist's vendored and generated lists, written here in three shapes a path
  can match: a directory name anywhere in it (``node_modules``), a file name anywhere
  (``yarn.lock``), or an ending of its file name (``.min.js``). Each shape is at once an
  SQL condition and a git glob pathspec (``**/node_modules/**``, ``**/yarn.lock``,
  ``**/*.min.js``), so ``git log -- . ':(exclude,glob)…'`` reproduces a lens.
- **Attributes**: ``linguist-generated`` and ``linguist-vendored`` in the ``.gitattributes``
  files at the analysed head, asked of git itself (``git check-attr`` over the head's tree
  in a throw-away index, on this host's mirror), once per head. Set (or ``=true``) adds a
  path to the lens; unset (``-linguist-…`` or ``=false``) takes it out of the lens even
  when a rule matches, as Linguist does.
- **Bots**: commits whose author (canonical name or e-mail) contains ``[bot]``
  (``dependabot[bot]``), or matches a pattern of ``GITWARD_BOT_AUTHORS``.
- **Identities**: ``GITWARD_IDENTITY_MAP`` maps more addresses to one canonical identity
  beyond ``.mailmap``; it is always applied (not a lens), to authors and co-authors alike.

Values from the operator's configuration and the rule table go into the SQL as quoted
literals (:func:`literal`); the attribute path lists are query parameters."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from workers import git

__all__ = [
    "LENSES",
    "PATH_LENSES",
    "RULES",
    "RULESET",
    "Attributes",
    "Lens",
    "Rule",
    "UnknownLens",
    "build_lens",
    "classify",
    "identity_map",
    "is_bot",
    "parse_exclude",
    "read_attributes",
    "rules_sql",
]

#: The version of :data:`RULES` and of the bot rule; it is in every report's provenance.
RULESET = "lenses-1"

#: Every lens, in the order pages and help list them.
LENSES = ("generated", "vendored", "lock", "minified", "bots")
#: The lenses that leave out files (the others leave out commits).
PATH_LENSES = ("generated", "vendored", "lock", "minified")

#: The ``.gitattributes`` attribute that adds to (or takes out of) each path lens.
ATTRIBUTES = {"generated": "linguist-generated", "vendored": "linguist-vendored"}

#: What every bot's name or e-mail holds (GitHub apps: ``name[bot]``).
BOT_MARK = "[bot]"


class UnknownLens(ValueError):
    """An ``exclude`` value that names no lens; the message names it and lists the lenses."""


@dataclass(frozen=True)
class Rule:
    """One path rule: ``kind`` is ``dir`` (a directory of that name at any depth),
    ``name`` (a file of that name at any depth) or ``suffix`` (a file name ending so)."""

    lens: str
    kind: str
    value: str

    def glob(self) -> str:
        """The git glob pathspec matching the same paths (``:(exclude,glob)`` it)."""
        if self.kind == "dir":
            return f"**/{self.value}/**"
        if self.kind == "name":
            return f"**/{self.value}"
        return f"**/*{self.value}"

    def matches(self, path: str) -> bool:
        """What the SQL condition computes, for one path (the tests compare the two)."""
        if self.kind == "dir":
            return f"/{self.value}/" in f"/{path}"
        if self.kind == "name":
            return path == self.value or path.endswith(f"/{self.value}")
        return path.endswith(self.value)


def _rules(lens: str, kind: str, values: str) -> list[Rule]:
    return [Rule(lens, kind, v) for v in values.split()]


#: The rule table, by lens. Our own selection, in the style of Linguist's lists: package
#: managers' install directories and copied third-party trees; lock files; minified
#: bundles; files that protocol-buffer, gRPC and UI-designer compilers and source maps
#: write. A path matching any rule of a lens is in it (unless an attribute says not).
RULES: tuple[Rule, ...] = (
    *_rules(
        "vendored",
        "dir",
        "node_modules bower_components jspm_packages vendor vendors third_party "
        "third-party thirdparty 3rdparty Pods Carthage",
    ),
    *_rules(
        "lock",
        "name",
        "package-lock.json npm-shrinkwrap.json yarn.lock pnpm-lock.yaml bun.lockb Cargo.lock "
        "poetry.lock Pipfile.lock pdm.lock uv.lock Gemfile.lock composer.lock go.sum "
        "Podfile.lock Package.resolved flake.lock mix.lock pubspec.lock packages.lock.json "
        "gradle.lockfile",
    ),
    *_rules("minified", "suffix", ".min.js .min.mjs .min.css -min.js -min.css"),
    *_rules(
        "generated",
        "suffix",
        ".pb.go .pb.gw.go .pb.cc .pb.h _pb2.py _pb2.pyi _pb2_grpc.py _pb.js _grpc_pb.js "
        ".pb.swift .designer.cs .g.dart .freezed.dart .js.map .css.map",
    ),
    *_rules("generated", "dir", "__generated__"),
)


def literal(value: str) -> str:
    """``value`` as an SQL string literal (standard quoting: a quote is doubled; neither
    SQLite nor PostgreSQL with its default ``standard_conforming_strings`` reads
    backslashes in it). For the rule table and the operator's configuration only."""
    if "\x00" in value:
        raise ValueError("an SQL literal cannot hold NUL")
    # Every analytics query is executed with a parameter list, so a "%" is written "%%".
    return "'" + value.replace("'", "''").replace("%", "%%") + "'"


def _rule_sql(rule: Rule, column: str) -> str:
    find = "instr" if connection.vendor == "sqlite" else "strpos"
    if rule.kind == "dir":
        return f"{find}('/' || {column}, {literal(f'/{rule.value}/')}) > 0"
    ending = rule.value if rule.kind == "suffix" else f"/{rule.value}"
    n = len(ending)
    tail = (
        f"substr({column}, -{n:d})" if connection.vendor == "sqlite" else f"right({column}, {n:d})"
    )
    if rule.kind == "suffix":
        return f"{tail} = {literal(ending)}"
    return f"({column} = {literal(rule.value)} OR {tail} = {literal(ending)})"


def rules_sql(lens: str, column: str) -> str:
    """The SQL condition "a rule of ``lens`` matches the path in ``column``" (no
    parameters: the rule table's values are literals)."""
    return "(" + " OR ".join(_rule_sql(r, column) for r in RULES if r.lens == lens) + ")"


def _in_list(column: str, paths: list[str]) -> tuple[str, list[Any]]:
    """``column`` is one of ``paths``: one parameter however many, read once per
    statement into a set the database probes per row (SQLite: ``json_each`` of a JSON
    array, an ephemeral index; PostgreSQL: ``unnest`` of an array, a hashed subplan)."""
    if connection.vendor == "postgresql":
        return f"{column} IN (SELECT unnest(%s::text[]))", [paths]
    return f"{column} IN (SELECT value FROM json_each(%s))", [json.dumps(paths)]  # noqa: S608


@dataclass(frozen=True)
class Attributes:
    """The paths ``.gitattributes`` at ``head`` marks, per path lens: ``marked`` (set or
    ``=true``) and ``unmarked`` (unset or ``=false``); ``source`` says where they come
    from (or why none were read)."""

    head: str = ""
    marked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unmarked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = "not read"


def pattern_sql(pattern: str) -> str:
    """A bot pattern (``*`` any text, ``?`` one character; case-insensitive) as an SQL
    ``LIKE`` literal with ``!`` as its escape."""
    out = []
    for ch in pattern.lower():
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch in "%_!":
            out.append("!" + ch)
        else:
            out.append(ch)
    return literal("".join(out))


@dataclass(frozen=True)
class Lens:
    """What a report leaves out (``exclude``), with what the lenses need to do it."""

    exclude: frozenset[str] = frozenset()
    bot_patterns: tuple[str, ...] = ()
    identities: tuple[tuple[str, str], ...] = ()
    attributes: Attributes = field(default_factory=Attributes)
    #: The stored paths the path lenses leave out (:func:`excluded_paths`), sorted.
    paths: tuple[str, ...] = ()

    @property
    def path_lenses(self) -> tuple[str, ...]:
        return tuple(n for n in PATH_LENSES if n in self.exclude)

    @property
    def excludes_paths(self) -> bool:
        return bool(self.path_lenses)

    def excluded_sql(self, column: str) -> tuple[str, list[Any]]:
        """The SQL condition "the path in ``column`` is left out" and its parameters:
        one of :attr:`paths`, classified once per request, not per row."""
        if not self.paths:
            return "(1 = 0)", []
        sql, params = _in_list(column, list(self.paths))
        return f"({sql})", params

    def bot_sql(self, name: str, email: str) -> str:
        """The SQL condition "this identity is a bot" (the ``bots`` lens)."""
        terms = []
        for pattern in (f"*{BOT_MARK}*", *self.bot_patterns):
            like = pattern_sql(pattern)
            terms += [
                f"lower({name}) LIKE {like} ESCAPE '!'",
                f"lower({email}) LIKE {like} ESCAPE '!'",
            ]
        return "(" + " OR ".join(terms) + ")"

    def person_sql(self, email: str) -> str:
        """The identity an e-mail is credited as: the identity map's, else itself."""
        if not self.identities:
            return email
        whens = " ".join(f"WHEN {literal(a)} THEN {literal(b)}" for a, b in self.identities)
        return f"(CASE lower({email}) {whens} ELSE {email} END)"

    def as_dict(self) -> dict[str, Any]:
        """The provenance of the lenses (docs/analytics.md#lenses)."""
        return {
            "ruleset": RULESET,
            "excluded": [n for n in LENSES if n in self.exclude],
            "attributes": self.attributes.source,
            "bot_patterns": [f"*{BOT_MARK}*", *self.bot_patterns],
            "identity_map": len(self.identities),
        }

    def pathspecs(self) -> list[str]:
        """The git pathspecs leaving out the same files (for ``reproduce``): each rule's
        glob, and the attribute as git's own ``attr:`` magic (it reads the work tree's
        ``.gitattributes``, so run it in a clone checked out at the head)."""
        if not self.excludes_paths:
            return []
        specs = ["."]
        for lens in self.path_lenses:
            specs += [f":(exclude,glob){r.glob()}" for r in RULES if r.lens == lens]
            if lens in ATTRIBUTES:
                specs.append(f":(exclude,attr:{ATTRIBUTES[lens]})")
        return specs


def parse_exclude(raw: str | Iterable[str] | None) -> frozenset[str]:
    """The lenses of an ``exclude`` value (comma-separated, or repeated); empty: none."""
    if raw is None:
        return frozenset()
    items = raw.split(",") if isinstance(raw, str) else [p for r in raw for p in str(r).split(",")]
    names = frozenset(i.strip().lower() for i in items if i.strip())
    unknown = sorted(names - set(LENSES))
    if unknown:
        shown = unknown[0][:40]
        raise UnknownLens(f"exclude: unknown lens {shown!r} (one of {', '.join(LENSES)})")
    return names


def identity_map(data: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``GITWARD_IDENTITY_MAP`` (settings read it as a JSON object of strings) as sorted
    ``(alias, canonical)`` pairs; aliases are matched case-insensitively."""
    return tuple(sorted((k.strip().lower(), v.strip()) for k, v in data.items()))


def is_bot(name: str, email: str, patterns: Iterable[str] = ()) -> bool:
    """What :meth:`Lens.bot_sql` computes, for one identity (the tests compare the two)."""
    for pattern in (f"*{BOT_MARK}*", *patterns):
        p = pattern.lower()
        for value in (name.lower(), email.lower()):
            # fnmatchcase: "[" is literal only when escaped; bots' patterns use * and ?
            if fnmatch.fnmatchcase(value, p.replace("[", "[[]")):
                return True
    return False


# ------------------------------------------------------------------------ attributes

_CACHE: dict[tuple[int, str, str], Attributes] = {}
_CACHE_LIMIT = 64
_CACHE_LOCK = threading.Lock()


def _git(
    mirror: Path, args: list[str], *, stdin: bytes = b"", env: dict[str, str] | None = None
) -> bytes:
    done = subprocess.run(
        git.command(["--git-dir", str(mirror), *args]),
        env=git.hardened_env(env or {}),
        input=stdin,
        capture_output=True,
        timeout=settings.GIT_TIMEOUT,
        check=True,
    )
    return done.stdout


def read_attributes(repo: Any, fingerprint: str, paths: Iterable[str] | None = None) -> Attributes:
    """The ``linguist-generated``/``linguist-vendored`` marks of the repository's stored
    paths (or ``paths``) by the ``.gitattributes`` at its analysed head, cached per
    (repository, fingerprint, head): a head's attributes never change, and a new head is
    a new key. Without a mirror on this host, or a head, none (``source`` says so).

    Race: a sync may fetch into the mirror meanwhile; this reads the tree of the stored
    head by its sha (objects never change), never a moving ref. Two requests may compute
    one key at once: both get the same answer, and the cache keeps either."""
    mirror = git.mirror_path(Path(settings.WORKSPACE), repo.pk)
    if not repo.head:
        return Attributes(source="not read: the repository has no analysed head")
    if not (mirror / "HEAD").exists():
        return Attributes(
            source="not read: no mirror of the repository on this host (path rules only)"
        )
    key = (repo.pk, fingerprint, repo.head)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None and paths is None:
        return hit
    found = _check_attr(repo, fingerprint, mirror, paths)
    if paths is None:
        with _CACHE_LOCK:
            if len(_CACHE) >= _CACHE_LIMIT:
                _CACHE.clear()
            _CACHE[key] = found
    return found


def _mentions_linguist(mirror: Path, head: str) -> bool:
    """Whether any ``.gitattributes`` of the head's tree (the first 1,000) names a
    ``linguist-`` attribute: most do not, and then no path needs asking."""
    names = _git(mirror, ["ls-tree", "-r", "-z", "--name-only", head]).split(b"\0")
    found = [n for n in names if n == b".gitattributes" or n.endswith(b"/.gitattributes")]
    for name in found[:1000]:
        spec = f"{head}:{name.decode('utf-8', 'surrogateescape')}"
        if b"linguist-" in _git(mirror, ["cat-file", "blob", spec]):
            return True
    return False


def _check_attr(
    repo: Any, fingerprint: str, mirror: Path, paths: Iterable[str] | None
) -> Attributes:
    head = repo.head
    try:
        if not _mentions_linguist(mirror, head):
            return Attributes(head, source=f".gitattributes at {head[:12]}: no linguist attributes")
        if paths is None:
            from dashboard.models import FileChange

            paths = (
                FileChange.objects.filter(repository_id=repo.pk, fingerprint=fingerprint)
                .values_list("path", flat=True)
                .distinct()
                .iterator()
            )
        wanted = sorted(set(paths))
        with tempfile.TemporaryDirectory(prefix="gitward-attr-") as tmp:
            index = os.path.join(tmp, "index")
            _git(mirror, ["read-tree", head], env={"GIT_INDEX_FILE": index})
            out = _git(
                mirror,
                ["check-attr", "--cached", "-z", "--stdin", *ATTRIBUTES.values()],
                stdin=b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in wanted),
                env={"GIT_INDEX_FILE": index},
            )
    except (OSError, subprocess.SubprocessError) as exc:
        return Attributes(head, source=f"not read: git failed ({type(exc).__name__})")
    marked: dict[str, list[str]] = {lens: [] for lens in ATTRIBUTES}
    unmarked: dict[str, list[str]] = {lens: [] for lens in ATTRIBUTES}
    lens_of = {attr: lens for lens, attr in ATTRIBUTES.items()}
    parts = out.split(b"\0")
    for i in range(0, len(parts) - 2, 3):
        path, attr, value = (p.decode("utf-8", "surrogateescape") for p in parts[i : i + 3])
        lens = lens_of.get(attr)
        if lens is None:
            continue
        if value in ("set", "true"):
            marked[lens].append(path)
        elif value in ("unset", "false"):
            unmarked[lens].append(path)
    return Attributes(
        head,
        {k: tuple(v) for k, v in marked.items() if v},
        {k: tuple(v) for k, v in unmarked.items() if v},
        source=f".gitattributes at {head[:12]}",
    )


def classify(
    repo_id: int, fingerprint: str, lenses: Iterable[str], attributes: Attributes
) -> tuple[str, ...]:
    """The stored paths of (repository, fingerprint) that ``lenses`` leave out: those a
    rule of a lens matches, less those its attribute unsets, plus those it sets. One
    scan of the distinct paths (the file rows' (repository, fingerprint, path) index),
    each rule evaluated once per path, not once per file row of every report."""
    wanted = [lens for lens in PATH_LENSES if lens in set(lenses)]
    if not wanted:
        return ()
    from dashboard.models import FileChange

    cols = ", ".join(f"CASE WHEN {rules_sql(lens, 'f.path')} THEN 1 ELSE 0 END" for lens in wanted)
    sql = (
        f"SELECT f.path, {cols} FROM {FileChange._meta.db_table} f "  # noqa: S608
        "WHERE f.repository_id = %s AND f.fingerprint = %s GROUP BY f.path"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [repo_id, fingerprint])
        rows = cursor.fetchall()
    unmarked = {lens: set(attributes.unmarked.get(lens, ())) for lens in wanted}
    marked = {lens: set(attributes.marked.get(lens, ())) for lens in wanted}
    found = set()
    for path, *hits in rows:
        for lens, hit in zip(wanted, hits, strict=True):
            if (hit and path not in unmarked[lens]) or path in marked[lens]:
                found.add(path)
                break
    return tuple(sorted(found))


_PATHS: dict[tuple[Any, ...], tuple[str, ...]] = {}


def build_lens(exclude: Iterable[str], repo: Any, fingerprint: str) -> Lens:
    """The lens of a report: ``exclude`` (already parsed), the configured bot patterns
    and identity map, the head's attributes when a lens reads them, and the stored paths
    the path lenses leave out, cached per (repository, fingerprint, head, lenses, stored
    and pruned commit counts): new rows, a new head or a rewrite is a new key.

    Race: chunks may be written meanwhile. The counts are read before the paths are
    classified, so the paths cover at least the rows counted; a chunk that commits after
    the classification can show its new paths unfiltered in that one answer, and the next
    request, seeing the new count, classifies again. Two requests may classify one key
    at once: both compute the same answer."""
    from dashboard.models import CommitCount

    names = frozenset(exclude)
    attributes = Attributes()
    if names & set(ATTRIBUTES):
        attributes = read_attributes(repo, fingerprint)
    paths: tuple[str, ...] = ()
    wanted = tuple(lens for lens in PATH_LENSES if lens in names)
    if wanted:
        counts = (
            CommitCount.objects.filter(repository_id=repo.pk, fingerprint=fingerprint)
            .values_list("commits", "pruned")
            .first()
        )
        key = (repo.pk, fingerprint, repo.head, wanted, counts, attributes.source)
        with _CACHE_LOCK:
            hit = _PATHS.get(key)
        if hit is None:
            hit = classify(repo.pk, fingerprint, wanted, attributes)
            with _CACHE_LOCK:
                if len(_PATHS) >= _CACHE_LIMIT:
                    _PATHS.clear()
                _PATHS[key] = hit
        paths = hit
    return Lens(
        exclude=names,
        bot_patterns=tuple(settings.BOT_AUTHORS),
        identities=identity_map(settings.IDENTITY_MAP),
        attributes=attributes,
        paths=paths,
    )
