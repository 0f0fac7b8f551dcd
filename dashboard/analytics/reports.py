"""One analysis as the API, the pages and the CLI serve it (docs/analytics.md#api-cli-and-pages):
its parameters read from a request's query or a command's options, checked (``BadParameter``
names the first one that is wrong), and the report, with the window, the fingerprint it was
computed for and the ``git log`` command that reproduces its rows."""

from __future__ import annotations

import csv
import functools
import io
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from django.utils import timezone

from dashboard.analytics.age import directory_age, file_age
from dashboard.analytics.coupling import (
    Thresholds,
    coupled_with,
    directory_coupling,
    file_coupling,
)
from dashboard.analytics.hotspots import directory_hotspots, file_hotspots
from dashboard.analytics.lenses import LENSES, Lens, UnknownLens, build_lens, parse_exclude
from dashboard.analytics.ownership import directory_ownership, file_ownership, knowledge_at_risk
from dashboard.analytics.people import author_activity, authors, file_history
from dashboard.analytics.rows import MAX_DEPTH, Scope
from dashboard.analytics.window import BadWindow, Window, parse_window
from dashboard.models import AnalyzerVersion, Repository
from workers import analysis as core_analysis
from workers import git

#: The analyses, in the order pages and help list them.
KINDS = ("hotspots", "coupling", "ownership", "age", "authors", "files")

#: Each integer parameter: default, lowest and highest accepted value.
INTEGERS: dict[str, tuple[int, int, int]] = {
    "depth": (1, 1, MAX_DEPTH),
    "limit": (100, 1, 1000),
    "inactive_days": (90, 1, 36500),
    "min_revs": (5, 0, 1_000_000),
    "min_shared_revs": (5, 0, 1_000_000),
    "min_coupling": (30, 0, 100),
    "max_changeset_size": (30, 2, 1_000_000),
}


class BadParameter(ValueError):
    """A parameter the analyses cannot take; the message names it."""


class NotFound(LookupError):
    """The author or file asked for made no change inside the window."""


@dataclass(frozen=True)
class Params:
    window: Window = field(default_factory=Window)
    depth: int = 1
    limit: int = 100
    inactive_days: int = 90
    thresholds: Thresholds = field(default_factory=Thresholds)
    path: str = ""
    author: str = ""
    #: The lenses left out (docs/analytics.md#lenses).
    exclude: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        return {
            "exclude": [n for n in LENSES if n in self.exclude],
            **self.window.as_dict(),
            "depth": self.depth,
            "limit": self.limit,
            "inactive_days": self.inactive_days,
            **asdict(self.thresholds),
            "path": self.path,
            "author": self.author,
        }


def _integer(values: Mapping[str, Any], name: str) -> int:
    default, lo, hi = INTEGERS[name]
    raw = values.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BadParameter(f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise BadParameter(f"{name} must be between {lo} and {hi}")
    return value


def parse_params(values: Mapping[str, Any]) -> Params:
    """Params from a query dict or a command's options (absent or empty: the default)."""
    try:
        window = parse_window(
            _text(values, "since"), _text(values, "until"), _text(values, "last") or None
        )
    except BadWindow as exc:
        raise BadParameter(str(exc)) from None
    ints = {name: _integer(values, name) for name in INTEGERS}
    path = _text(values, "path") or ""
    if len(path) > 4096 or "\x00" in path:
        raise BadParameter("path must be a repository path")
    author = _text(values, "author") or ""
    if len(author) > 512 or "\x00" in author:
        raise BadParameter("author must be an e-mail address as stored")
    raw_exclude = values.get("exclude")
    if isinstance(raw_exclude, list | tuple):  # the CLI's repeated --exclude
        raw_exclude = ",".join(str(v) for v in raw_exclude)
    try:
        exclude = parse_exclude(None if raw_exclude is None else str(raw_exclude)[:200])
    except UnknownLens as exc:
        raise BadParameter(str(exc)) from None
    return Params(
        exclude=exclude,
        window=window,
        depth=ints["depth"],
        limit=ints["limit"],
        inactive_days=ints["inactive_days"],
        thresholds=Thresholds(
            min_revs=ints["min_revs"],
            min_shared_revs=ints["min_shared_revs"],
            min_coupling=ints["min_coupling"],
            max_changeset_size=ints["max_changeset_size"],
        ),
        path=path,
        author=author,
    )


def _text(values: Mapping[str, Any], name: str) -> str | None:
    raw = values.get(name)
    return None if raw is None else str(raw).strip()[: 100 if name != "path" else 4097]


@functools.cache
def git_version() -> str:
    """``git --version`` of this host (asked once per process; docs/analytics.md#provenance)."""
    try:
        done = subprocess.run(
            git.command(["--version"]),
            env=git.hardened_env(),
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip().removeprefix("git version ")


def reproduce(window: Window, lens: Lens, head: str = "") -> str:
    """The ``git log`` command printing the rows a report is computed from: the window,
    the bots lens as an author filter, ``head``, and the path lenses as pathspecs."""
    command = ["git log --no-merges --no-renames --numstat", *window.git_args()]
    if "bots" in lens.exclude:
        command.append(f"--perl-regexp --regexp-ignore-case --author='{bot_regexp(lens)}'")
    if head:
        command.append(head)
    specs = lens.pathspecs()
    if specs:
        command += ["--", *(f"'{s}'" for s in specs)]
    return " ".join(command)


def bot_regexp(lens: Lens) -> str:
    """A PCRE for ``git log --perl-regexp --author`` matching the authors the bots lens
    keeps (``Name <email>`` lines where neither is a bot)."""
    import fnmatch

    alternatives = [r".*\[bot\]"]
    for pattern in lens.bot_patterns:
        body = fnmatch.translate(pattern).removeprefix("(?s:").removesuffix(r")\Z")
        body = body.replace("'", ".")  # the command is single-quoted
        alternatives += [f"(?:{body}) <", f".*<(?:{body})>$"]
    regexp = f"^(?!{'|'.join(alternatives)})"
    return regexp


def provenance(
    repo: Repository, fingerprint: str, window: Window, lens: Lens | None = None
) -> dict[str, Any]:
    """Where a report's numbers come from: the analyzer version (fingerprint, code version,
    configuration), the analysed head and branch, this host's git, the lenses, and the
    command that prints the rows they are computed from at that head."""
    lens = lens or Lens()
    version = (
        AnalyzerVersion.objects.filter(fingerprint=fingerprint)
        .values("code_version", "config")
        .first()
    )
    if version is None:  # the deployed default, before any rollout registered a version
        version = {"code_version": "", "config": core_analysis.DEFAULT.to_dict()}
    return {
        "fingerprint": fingerprint,
        "code_version": version["code_version"],
        "config": version["config"],
        "head": repo.head,
        "branch": repo.branch or "(default)",
        "git_version": git_version(),
        "command": reproduce(window, lens, repo.head),
        "mailmap": "the .mailmap at the analysed head, as git log's %aN/%aE apply it",
        "lenses": lens.as_dict(),
        "co_authors": "Co-authored-by: trailers as the analysis stored them (a version "
        "analysed before they were stored credits none)",
    }


def report(kind: str, repo: Repository, params: Params) -> dict[str, Any]:
    """The ``kind`` analysis of ``repo`` under the served fingerprint; ``BadParameter``
    for an unknown kind or a missing ``path``, ``NotFound`` for an author or file with no
    change in the window."""
    if kind not in KINDS:
        raise BadParameter(f"unknown analysis {kind!r}: one of {', '.join(KINDS)}")
    fingerprint = Scope.of(repo, params.window).fingerprint
    lens = build_lens(params.exclude, repo, fingerprint)
    scope = Scope.of(repo, params.window, fingerprint, lens)
    body: dict[str, Any] = {
        "repository": repo.pk,
        "name": repo.name,
        "analysis": kind,
        "fingerprint": scope.fingerprint,
        "window": params.window.as_dict(),
        "parameters": params.as_dict(),
        "exclude": [n for n in LENSES if n in params.exclude],
        "reproduce": reproduce(params.window, lens),
        "computed_at": timezone.now().isoformat(),
        "provenance": provenance(repo, scope.fingerprint, params.window, lens),
    }
    t, depth, limit = params.thresholds, params.depth, params.limit
    if kind == "coupling":
        if params.path:
            body["path"] = params.path
            body["coupled"] = coupled_with(scope, params.path, t, limit=limit)
        else:
            body["files"] = file_coupling(scope, t, limit=limit)
            body["directories"] = directory_coupling(scope, t, depth=depth, limit=limit)
    elif kind == "ownership":
        body["files"] = file_ownership(scope, limit=limit)
        body["directories"] = directory_ownership(scope, depth=depth)[:limit]
        risk = knowledge_at_risk(scope, inactive_days=params.inactive_days)
        body["knowledge_at_risk"] = risk
        gone = {a["author"] for a in risk["authors"]}
        for row in (*body["files"], *body["directories"]):
            row["main_dev_inactive"] = row["main_dev"] in gone  # "who left"
    elif kind == "age":
        body["files"] = file_age(scope)[:limit]
        body["directories"] = directory_age(scope, depth=depth)[:limit]
    elif kind == "authors":
        if params.author:
            found = author_activity(scope, params.author, limit=limit)
            if found is None:
                raise NotFound(f"no commit by {params.author} in this window")
            body["activity"] = found
        else:
            body["authors"] = authors(scope, limit=limit)
    elif kind == "files":
        if not params.path:
            raise BadParameter("path is required: the file whose history to show")
        history = file_history(scope, params.path, t, limit=limit)
        if history is None:
            raise NotFound(f"no commit changed {params.path} in this window")
        body["history"] = history
    else:
        body["files"] = file_hotspots(scope, limit=limit)
        body["directories"] = directory_hotspots(scope, depth=depth, limit=limit)
    return body


def tables(body: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The report's tables by name, for CSV export (docs/analytics.md#export): each list of
    rows at its top level or in ``activity``/``history``, with ``knowledge_at_risk``
    flattened to one row per inactive author and file. Nested values are left out of a
    row (a directory's ``by_author`` is its own analysis: ``authors``)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for holder in (body, body.get("activity") or {}, body.get("history") or {}):
        for name, value in holder.items():
            if name == "exclude":  # the lenses left out: a list of names, no table
                continue
            if isinstance(value, list) and all(isinstance(r, dict) for r in value):
                found[name] = value
    risk = body.get("knowledge_at_risk")
    if risk:
        found["at_risk"] = [
            {"author": a["author"], "name": a["name"], "last_commit_at": a["last_commit_at"],
             "path": path}
            for a in risk["authors"]
            for path in a["files"] or [""]
        ]  # fmt: skip
    return {
        name: [{k: v for k, v in r.items() if not isinstance(v, (list, dict))} for r in rows]
        for name, rows in found.items()
    }


def csv_lines(rows: list[dict[str, Any]]) -> Iterator[str]:
    """``rows`` as CSV, one line at a time (a header from the first row; none when empty)."""
    if not rows:
        return
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()
