"""One verification pass (docs/analytics.md#verification): stored results re-derived through
a path independent of the analysis. A random sample of a repository's stored commits is
diffed again commit by commit (``git diff-tree --stdin --numstat``, each commit against its
first parent, where the analysis streams one ``git log`` over a range), and the repository's
non-merge totals are counted again at the stored head with ``git rev-list`` and ``git log``; every
difference names its commit. Read-only: it writes nothing, so it can run beside analysis.

Race: a sync may fetch into the mirror while this runs. It reads objects by sha and the stored
head, never a moving ref; git writes objects once and never changes them, so a concurrent
fetch cannot change what is read."""

from __future__ import annotations

import random
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone

from dashboard.analytics.reports import provenance
from dashboard.analytics.window import Window
from dashboard.models import Commit, FileChange, Repository
from dashboard.repositories import current_fingerprint
from workers import git
from workers.analysis import AnalyzerConfig


class CannotVerify(RuntimeError):
    """No mirror on this host, or git refused to read it; the message says which."""


def _git(mirror: Path, args: list[str], stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(
            git.command(["--git-dir", str(mirror), *args]),
            input=stdin,
            env=git.hardened_env(),
            capture_output=True,
            timeout=600,
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        line = exc.stderr.decode("utf-8", "replace").strip().splitlines()[:1]
        raise CannotVerify(f"git {args[0]} failed: {line[0] if line else exc.returncode}") from exc
    return done.stdout


def _diff_args(config: AnalyzerConfig) -> list[str]:
    args = ["-M" if config.detect_renames else "--no-renames"]
    if config.ignore_whitespace:
        args.append("-w")
    return args


def _pathspecs(config: AnalyzerConfig) -> list[str]:
    return (
        ["--", *(f":(exclude,glob){p}" for p in config.exclude_paths)]
        if config.exclude_paths
        else []
    )


def _numstat(raw: bytes) -> list[tuple[str, int, int, bool]]:
    """``--numstat -z`` output as sorted (path, added, deleted, binary); a rename's path is
    its new one, as the analysis stores it."""
    fields = raw.decode("utf-8", "surrogateescape").split("\0")
    rows, i = [], 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if not entry.strip():
            continue
        added, deleted, path = entry.lstrip("\n").split("\t", 2)
        if path == "":  # a rename: the old and the new path follow
            path = fields[i + 1]
            i += 2
        binary = added == "-"
        rows.append((path, 0 if binary else int(added), 0 if binary else int(deleted), binary))
    return sorted(rows)


#: Commits one ``git diff-tree --stdin`` process re-derives (bounds its output in memory).
BATCH = 1000


def _rederive(
    mirror: Path, config: AnalyzerConfig, commits: list[Commit]
) -> dict[str, list[tuple[str, int, int, bool]]]:
    """Each commit's rows as git prints them now: ``git diff-tree --stdin`` fed one line
    per commit, ``<sha> <first parent>`` (a root commit alone, diffed against the empty
    tree by ``--root``), so every commit is diffed on its own against its first parent,
    where the analysis streams one ``git log`` over a range. ``--always`` prints the
    header of a commit with an empty diff too; with ``-z`` a header is a field without a
    tab that is not one of the two paths following a rename's entry."""
    out: dict[str, list[tuple[str, int, int, bool]]] = {}
    for lo in range(0, len(commits), BATCH):
        lines = "".join(
            f"{c.sha} {c.parent_list()[0]}\n" if c.parent_list() else f"{c.sha}\n"
            for c in commits[lo : lo + BATCH]
        )
        raw = _git(
            mirror,
            ["diff-tree", "--stdin", "--root", "--always", "-r", "-z", "--numstat",
             "--no-ext-diff", "--no-textconv", *_diff_args(config), *_pathspecs(config)],
            stdin=lines.encode(),
        )  # fmt: skip
        sha, body, paths_due = "", bytearray(), 0
        for field in raw.split(b"\0"):
            text = field.lstrip(b"\n")
            if paths_due:  # a rename's old or new path
                body += field + b"\0"
                paths_due -= 1
            elif b"\t" in text:  # added, deleted, path (empty for a rename)
                body += field + b"\0"
                paths_due = 2 if text.endswith(b"\t") else 0
            elif text:  # the next commit's header
                if sha:
                    out[sha] = _numstat(bytes(body))
                sha, body = text.decode(), bytearray()
        if sha:
            out[sha] = _numstat(bytes(body))
    return out


#: The fields of a stored file row, in the order ``_numstat`` gives them after the path.
ROW_FIELDS = ("added", "deleted", "binary")


def differences(
    want: list[tuple[str, int, int, bool]], have: list[tuple[str, int, int, bool]]
) -> list[dict[str, Any]]:
    """Each difference between git's rows (``want``) and the stored ones (``have``) of
    one commit, by path and field: ``{path, field, git, stored}``, where ``field`` is
    ``added``, ``deleted`` or ``binary``, or ``row`` for a file only one side has (its
    values ``None`` on the other)."""
    by_git = {r[0]: r for r in want}
    by_db = {r[0]: r for r in have}
    out: list[dict[str, Any]] = []
    for path in sorted(by_git.keys() | by_db.keys()):
        g, d = by_git.get(path), by_db.get(path)
        if g is None or d is None:
            git_row = list(g[1:]) if g else None
            stored_row = list(d[1:]) if d else None
            out.append({"path": path, "field": "row", "git": git_row, "stored": stored_row})
            continue
        for i, name in enumerate(ROW_FIELDS, start=1):
            if g[i] != d[i]:
                out.append({"path": path, "field": name, "git": g[i], "stored": d[i]})
    return out


def verify_repository(
    repo: Repository, *, sample: int = 500, seed: int | None = None, fingerprint: str | None = None
) -> dict[str, Any]:
    """Re-derive ``sample`` random stored commits and the non-merge totals of ``repo``;
    ``CannotVerify`` when this host has no mirror of it."""
    fp = fingerprint or current_fingerprint()
    prov = provenance(repo, fp, Window())
    config = AnalyzerConfig.from_mapping(prov["config"])
    mirror = git.mirror_path(Path(settings.WORKSPACE), repo.pk)
    if not (mirror / "HEAD").exists():
        raise CannotVerify(f"no mirror of repository {repo.pk} on this host")
    stored = Commit.objects.filter(repository=repo, fingerprint=fp)
    ids = list(stored.values_list("id", flat=True))
    chosen = random.Random(seed).sample(ids, min(sample, len(ids)))
    commits = {c.pk: c for c in stored.filter(pk__in=chosen)}
    rows: dict[int, list[tuple[str, int, int, bool]]] = defaultdict(list)
    for cid, path, added, deleted, binary in FileChange.objects.filter(
        commit_id__in=chosen
    ).values_list("commit_id", "path", "added", "deleted", "binary"):
        rows[cid].append((path, added, deleted, binary))
    derived = _rederive(mirror, config, list(commits.values()))
    mismatches = []
    for cid, c in sorted(commits.items()):
        want, have = derived.get(c.sha, []), sorted(rows[cid])
        if want != have:
            only_git = sorted(set(want) - set(have))
            only_stored = sorted(set(have) - set(want))
            mismatches.append(
                {"sha": c.sha, "git": [list(r) for r in only_git][:20],
                 "stored": [list(r) for r in only_stored][:20],
                 "fields": differences(want, have)[:20]}
            )  # fmt: skip
    totals = _totals(repo, fp, mirror, config)
    return {
        "repository": repo.pk,
        "fingerprint": fp,
        "head": repo.head,
        "sampled": len(commits),
        "mismatches": mismatches,
        "totals": totals,
        "agrees": not mismatches and totals["stored"] == totals["git"],
        "checked_at": timezone.now().isoformat(),
        "provenance": prov,
    }


def _totals(repo: Repository, fp: str, mirror: Path, config: AnalyzerConfig) -> dict[str, Any]:
    """Non-merge commits, lines added and deleted: stored, and git's at the stored head."""
    agg = Commit.objects.filter(repository=repo, fingerprint=fp, is_merge=False).aggregate(
        commits=Count("id"), insertions=Sum("insertions"), deletions=Sum("deletions")
    )
    stored = {k: int(v or 0) for k, v in agg.items()}
    if not repo.head:
        return {"stored": stored, "git": None}
    count = int(_git(mirror, ["rev-list", "--count", "--no-merges", repo.head]).strip() or 0)
    out = _git(
        mirror,
        ["log", "--no-merges", "--numstat", "--format=", "--no-ext-diff", "--no-textconv",
         *_diff_args(config), repo.head, *_pathspecs(config)],
    )  # fmt: skip
    added = deleted = 0
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[0] != "-":
            added += int(parts[0])
            deleted += int(parts[1])
    return {"stored": stored, "git": {"commits": count, "insertions": added, "deletions": deleted}}
