"""The cache-warming gate (docs/rollouts.md): what to warm, whether it is warm, what changed.

* :func:`select_warm_set` — the most-viewed repositories' most recent commits, read
  under the current version's fingerprint (``RepositoryView`` counts page views per
  day, counted by ``dashboard.repositories.view_counts``; repositories nobody viewed follow, most
  recently analysed first).
* :func:`verify_warm_set` — the gate's verdict for a new version on that set.
* :func:`diff_results` — per-commit numbers of two fingerprints on that set.

All three read ``Commit``/``FileChange`` rows, which are keyed by fingerprint; nothing
here writes results.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Max, Q, Sum
from django.utils import timezone

from dashboard import locks
from dashboard.models import (
    AnalyzerVersion,
    Chunk,
    Commit,
    FileChange,
    JobRun,
    Repository,
    Rollout,
    WorkerBeat,
)
from dashboard.repositories import flush_views, plan_shadow, plan_warm_set
from dashboard.repositories import record_view as record_view  # the page's call, counted there
from workers import locks as workers_locks
from workers.locks import LockNotAcquired

DEFAULT_REPOSITORIES = 20
DEFAULT_COMMITS_PER_REPOSITORY = 50
DEFAULT_THRESHOLD = 0.95
VIEW_WINDOW = timedelta(days=7)


def select_warm_set(
    *,
    fingerprint: str,
    repositories: int = DEFAULT_REPOSITORIES,
    commits_per_repository: int = DEFAULT_COMMITS_PER_REPOSITORY,
    threshold: float = DEFAULT_THRESHOLD,
    repository_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The warm set: up to ``repositories`` repositories ranked by views over the last
    7 days (then by most recent analysis), each with its ``commits_per_repository``
    newest commits stored under ``fingerprint`` (the current version's).

    ``repository_ids`` pins the repositories instead (configurable warm sets). Returns
    the spec stored on ``Rollout.warm_set``:
    ``{"base", "repositories", "commits_per_repository", "threshold", "items":
    [[repo_id, [sha, ...]], ...]}``.
    """
    if repositories < 1 or commits_per_repository < 1:
        raise ValueError("a warm set needs at least one repository and one commit")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], not {threshold}")
    # Views this process counted and has not written yet count too (those of the web
    # processes reach the table within ``view_counts.FLUSH_SECONDS`` of their next view).
    flush_views()
    with_results = Repository.objects.filter(
        pk__in=Commit.objects.filter(fingerprint=fingerprint).values("repository_id")
    )
    if repository_ids is not None:
        chosen = [pk for pk in repository_ids if with_results.filter(pk=pk).exists()][:repositories]
    else:
        since = timezone.localdate() - VIEW_WINDOW
        ranked = with_results.annotate(
            recent_views=Sum("page_views__views", filter=Q(page_views__day__gte=since)),
        ).order_by(
            F("recent_views").desc(nulls_last=True), F("analyzed_at").desc(nulls_last=True), "pk"
        )
        chosen = list(ranked.values_list("pk", flat=True)[:repositories])
    items: list[list[Any]] = []
    for pk in chosen:
        shas = list(
            Commit.objects.filter(repository_id=pk, fingerprint=fingerprint)
            .order_by("-committed_at", "-id")
            .values_list("sha", flat=True)[:commits_per_repository]
        )
        items.append([pk, shas])
    return {
        "base": fingerprint,
        "repositories": repositories,
        "commits_per_repository": commits_per_repository,
        "threshold": threshold,
        "items": items,
    }


def _items(warm_set: Mapping[str, Any]) -> list[tuple[int, list[str]]]:
    return [(int(pk), [str(s) for s in shas]) for pk, shas in warm_set.get("items") or []]


def verify_warm_set(
    *,
    version: AnalyzerVersion,
    warm_set: Mapping[str, Any],
    worker_window: float | None = None,
) -> dict[str, Any]:
    """The gate's verdict for ``version`` on ``warm_set``; ``ok`` only if every check
    passes:

    * ``coverage`` — stored commits of the set under the new fingerprint / commits in
      the set ≥ ``warm_set["threshold"]`` (an empty set has nothing to vouch for: fails);
    * ``errors`` — no finally failed analysis run (dead-lettered or discarded: a run
      waiting for its retry is not final) and no failed chunk, of the new fingerprint
      on the set's repositories;
    * ``fingerprint`` — every file row of the new fingerprint's commits carries the new
      fingerprint, and no file row of the new fingerprint hangs off another's commit;
    * ``workers`` — at least one live worker (heartbeat within ``worker_window``,
      default ``WORKER_DEAD_AFTER``) reports the new fingerprint as its loaded version.

    Deterministic for a given database state; nothing is written.
    """
    fp = version.fingerprint
    items = _items(warm_set)
    threshold = float(warm_set.get("threshold", DEFAULT_THRESHOLD))
    repo_ids = [pk for pk, _ in items]
    expected = sum(len(shas) for _, shas in items)
    stored = 0
    missing: list[dict[str, Any]] = []
    for pk, shas in items:
        have = set(
            Commit.objects.filter(repository_id=pk, fingerprint=fp, sha__in=shas).values_list(
                "sha", flat=True
            )
        )
        stored += len(have)
        missing.extend({"repository": pk, "sha": s} for s in shas if s not in have)
    coverage = stored / expected if expected else 0.0
    # Only a run that is finally failed counts: dead-lettered (no retry left) or
    # discarded by an operator. A ``failed`` run failed one attempt and waits for its
    # retry (``runs.fail_attempt`` schedules it): it may still succeed, so it is not an
    # error yet — while it waits, its commits are missing from the coverage instead.
    failed_runs = JobRun.objects.filter(
        kind=JobRun.Kind.ANALYZE,
        fingerprint=fp,
        repository_id__in=repo_ids,
        state__in=[JobRun.State.DEAD, JobRun.State.DISCARDED],
    )
    failed_chunks = Chunk.objects.filter(
        fingerprint=fp, repository_id__in=repo_ids, state=Chunk.State.FAILED
    )
    errors = failed_runs.count() + failed_chunks.count()
    error_examples = [
        {"run": r.pk, "repository": r.repository_id, "error": r.error[:200]}
        for r in failed_runs.order_by("-pk")[:5]
    ]
    foreign = (
        FileChange.objects.filter(commit__fingerprint=fp, repository_id__in=repo_ids)
        .exclude(fingerprint=fp)
        .count()
        + FileChange.objects.filter(fingerprint=fp, repository_id__in=repo_ids)
        .exclude(commit__fingerprint=fp)
        .count()
    )
    window = settings.WORKER_DEAD_AFTER if worker_window is None else worker_window
    cutoff = timezone.now() - timedelta(seconds=window)
    workers = sorted(
        WorkerBeat.objects.filter(
            version=fp, stopped_at__isnull=True, last_seen__gte=cutoff
        ).values_list("name", flat=True)
    )
    checks = {
        "coverage": expected > 0 and coverage >= threshold,
        "errors": errors == 0,
        "fingerprint": foreign == 0,
        "workers": bool(workers),
    }
    ok = all(checks.values())
    summary = (
        f"coverage {stored}/{expected} ({coverage:.0%}, need {threshold:.0%}), "
        f"{errors} error(s), {foreign} row(s) with another fingerprint, "
        f"{len(workers)} worker(s) reporting {fp[:12]}"
    )
    return {
        "ok": ok,
        "fingerprint": fp,
        "checks": checks,
        "expected": expected,
        "stored": stored,
        "coverage": round(coverage, 4),
        "threshold": threshold,
        "missing": missing[:10],
        "errors": errors,
        "error_examples": error_examples,
        "foreign_rows": foreign,
        "workers": workers,
        "summary": ("passed: " if ok else "failed: ") + summary,
        "checked_at": timezone.now().isoformat(),
    }


# ---------------------------------------------------------------------------- result diff

_NUMBERS = ("files_changed", "insertions", "deletions")


def _commit_numbers(
    repo_id: int, fingerprint: str, shas: Iterable[str]
) -> dict[str, dict[str, Any]]:
    rows = {
        c["sha"]: {**c, "files": []}
        for c in Commit.objects.filter(
            repository_id=repo_id, fingerprint=fingerprint, sha__in=list(shas)
        ).values("id", "sha", "subject", *_NUMBERS)
    }
    by_id = {r["id"]: r for r in rows.values()}
    for f in FileChange.objects.filter(commit_id__in=list(by_id)).values_list(
        "commit_id", "path", "added", "deleted", "binary"
    ):
        by_id[f[0]]["files"].append(f[1:])
    for r in rows.values():
        r["files"].sort()
    return rows


def diff_results(
    *, base: str, new: str, warm_set: Mapping[str, Any], examples: int = 10
) -> dict[str, Any]:
    """How fingerprint ``new``'s results differ from ``base``'s on the warm set.

    A commit *changes* when its files_changed/insertions/deletions or its list of
    (path, added, deleted, binary) rows differ. Only commits stored under both
    fingerprints are compared; the others are counted under ``missing``. Returns
    ``{"base", "new", "compared", "missing": {"base", "new"}, "commits_changed",
    "totals": {"before", "after"}, "changed": {number: commits}, "examples": [...],
    "summary"}`` where totals sum the compared commits' numbers and file rows.
    """
    compared = changed = 0
    missing = {"base": 0, "new": 0}
    before = {k: 0 for k in (*_NUMBERS, "file_rows")}
    after = dict(before)
    changed_by = {k: 0 for k in (*_NUMBERS, "paths")}
    sample: list[dict[str, Any]] = []
    for repo_id, shas in _items(warm_set):
        old_rows = _commit_numbers(repo_id, base, shas)
        new_rows = _commit_numbers(repo_id, new, shas)
        for sha in shas:
            a, b = old_rows.get(sha), new_rows.get(sha)
            if a is None or b is None:
                missing["base" if a is None else "new"] += 1
                continue
            compared += 1
            for k in _NUMBERS:
                before[k] += a[k]
                after[k] += b[k]
            before["file_rows"] += len(a["files"])
            after["file_rows"] += len(b["files"])
            differs = [k for k in _NUMBERS if a[k] != b[k]]
            paths_a = {f[0] for f in a["files"]}
            paths_b = {f[0] for f in b["files"]}
            if paths_a != paths_b:
                differs.append("paths")
            if not differs and a["files"] == b["files"]:
                continue
            changed += 1
            for k in differs:
                changed_by[k] += 1
            if len(sample) < examples:
                sample.append(
                    {
                        "repository": repo_id,
                        "sha": sha,
                        "subject": a["subject"][:200],
                        "before": {k: a[k] for k in _NUMBERS},
                        "after": {k: b[k] for k in _NUMBERS},
                        "only_before": sorted(paths_a - paths_b)[:10],
                        "only_after": sorted(paths_b - paths_a)[:10],
                    }
                )
    parts = [f"{changed} of {compared} commits change"]
    for k in _NUMBERS:
        if before[k] != after[k]:
            parts.append(f"{k} {before[k]} → {after[k]}")
    return {
        "base": base,
        "new": new,
        "compared": compared,
        "missing": missing,
        "commits_changed": changed,
        "totals": {"before": before, "after": after},
        "changed": changed_by,
        "examples": sample,
        "summary": ", ".join(parts),
    }


def warm_progress(*, version: AnalyzerVersion, warm_set: Mapping[str, Any]) -> dict[str, Any]:
    """Stored / expected commits of the warm set under ``version`` (the page's bar)."""
    items = _items(warm_set)
    expected = sum(len(s) for _, s in items)
    stored = sum(
        Commit.objects.filter(
            repository_id=pk, fingerprint=version.fingerprint, sha__in=shas
        ).aggregate(n=Count("id"))["n"]
        for pk, shas in items
    )
    latest = Commit.objects.filter(fingerprint=version.fingerprint).aggregate(m=Max("id"))["m"]
    return {"expected": expected, "stored": stored, "latest_commit_id": latest}


def warm_rollout(rollout: Rollout) -> dict[str, Any]:
    """The driver's warmer: enqueue the analysis of the rollout's warm set under the new
    version's fingerprint, to its physical queue (its workers take it: the gate is open
    for a warming version, and no routed job goes there yet).

    Held under the warming lock ``lockkeys.warm(queue, fp)`` while planning, so two
    warmers (a driver and its takeover) never plan at once; and planning is idempotent
    (``chunk_plans.plan_warm_set``), so a second warmer after the first enqueues nothing:
    each warm commit is analysed once. Returns ``{"runs": n}`` or ``{"skipped": why}``.
    """
    version = rollout.version
    key = workers_locks.warm(rollout.queue, version.fingerprint)
    try:
        lock = locks.redlock().acquire(
            key,
            ttl=max(float(settings.LOCK_TTL), 10.0),
            holder={"worker": f"warmer-rollout-{rollout.pk}", "version": version.fingerprint},
        )
    except LockNotAcquired:
        return {"skipped": "another warmer holds the warming lock"}
    try:
        runs = plan_warm_set(fingerprint=version.fingerprint, items=_items(rollout.warm_set))
    finally:
        lock.release()
    return {"runs": len(runs), "expected": sum(len(s) for _, s in _items(rollout.warm_set))}


# ---------------------------------------------------------------------------- shadow samples


def select_shadow_sample(
    *, base: str, new: str, warm_set: Mapping[str, Any], count: int
) -> list[tuple[int, str]]:
    """Up to ``count`` commits to send to the canary as shadow work
    (docs/rollouts.md#shadow-samples): ``[(repo_id, sha), …]``.

    Commits stored under ``base`` (the current version's results: real, analysed work)
    of ready repositories; repositories outside the warm set first (their work has not
    been seen by the new version yet), then the warm set's own (so a system with one
    repository still gives samples), each ranked by most recent analysis then id;
    newest commits first, taken round-robin across them. First the commits not yet
    stored under ``new``; if they are fewer than ``count``, then commits it stored
    already, in the same order (analysed again: a small system still gives the
    samples). Deterministic: the same database state gives the same list. Nothing is
    written.
    """
    if count < 1:
        return []
    warm = {pk for pk, _ in _items(warm_set)}
    repos = list(
        Repository.objects.filter(
            status=Repository.Status.READY,
            pk__in=Commit.objects.filter(fingerprint=base).values("repository_id"),
        )
        .order_by(F("analyzed_at").desc(nulls_last=True), "pk")
        .values_list("pk", flat=True)
    )
    ordered = [pk for pk in repos if pk not in warm] + [pk for pk in repos if pk in warm]
    chosen: list[tuple[int, str]] = []
    for stored in (False, True):
        per_repo: list[tuple[int, list[str]]] = []
        for pk in ordered:
            done = Commit.objects.filter(repository_id=pk, fingerprint=new).values("sha")
            rows = Commit.objects.filter(repository_id=pk, fingerprint=base)
            rows = rows.filter(sha__in=done) if stored else rows.exclude(sha__in=done)
            shas = list(rows.order_by("-committed_at", "-id").values_list("sha", flat=True)[:count])
            if shas:
                per_repo.append((pk, shas))
        depth = 0
        while len(chosen) < count and any(depth < len(s) for _, s in per_repo):
            for pk, shas in per_repo:
                if depth < len(shas) and len(chosen) < count:
                    chosen.append((pk, shas[depth]))
            depth += 1
    return chosen


def shadow_rollout(rollout: Rollout, count: int) -> dict[str, Any]:
    """Send up to ``count`` commits (``select_shadow_sample``) to the rollout's new
    version as shadow work for its current step: planned like the warm set
    (``plan_shadow``: on the new version's physical queue, results stored under its
    fingerprint and never served before promotion), one commit per chunk keyed
    ``shadow-<rollout>-<step>-<sha>`` so that each is one run — one sample of the
    canary's health check. Under the warming lock, like :func:`warm_rollout`; planning
    is idempotent per step (the keys), so a second planner enqueues nothing new.
    Returns ``{"commits", "repositories", "reanalysed", "items"}`` or ``{"skipped": why}``.
    """
    version = rollout.version
    base = rollout.previous.fingerprint if rollout.previous is not None else None
    if base is None:
        return {"skipped": "no previous version to take real work from"}
    chosen = select_shadow_sample(
        base=base, new=version.fingerprint, warm_set=rollout.warm_set, count=count
    )
    key = workers_locks.warm(rollout.queue, version.fingerprint)
    try:
        lock = locks.redlock().acquire(
            key,
            ttl=max(float(settings.LOCK_TTL), 10.0),
            holder={"worker": f"shadow-rollout-{rollout.pk}", "version": version.fingerprint},
        )
    except LockNotAcquired:
        return {"skipped": "another planner holds the warming lock"}
    try:
        stored = {
            (pk, sha)
            for pk, sha in Commit.objects.filter(
                fingerprint=version.fingerprint, sha__in=[s for _, s in chosen]
            ).values_list("repository_id", "sha")
        }
        plan_shadow(
            fingerprint=version.fingerprint,
            items=chosen,
            tag=f"shadow-{rollout.pk}-{rollout.step_index}",
        )
    finally:
        lock.release()
    return {
        "commits": len(chosen),
        "repositories": len({pk for pk, _ in chosen}),
        "reanalysed": sum(1 for c in chosen if c in stored),
        "items": [[pk, sha] for pk, sha in chosen],
    }
