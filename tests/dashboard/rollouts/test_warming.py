"""The warming gate on real analysed repositories: the pipeline analyses them under the
current fingerprint, then rows for a second version are written the way its analyzer
writes them (``stream_commits`` with that version's config → ``write_chunk`` under a
fenced chunk lock). The verdicts and the result diff are compared with git itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from dashboard.models import (
    Commit,
    FileChange,
    JobRun,
    Repository,
    Rollout,
    WorkerBeat,
)
from dashboard.repositories.view_counts import flush_views, record_view
from dashboard.rollouts import start, steps
from dashboard.rollouts.warming import diff_results, select_warm_set, verify_warm_set
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.gitrepo import GitRepo
from tests.support.rollouts import (  # noqa: F401 (fixture)
    _release_drivers,
    analyse_as,
    analysed,
    report_worker,
    verify,
)
from tests.support.rollouts import start as support_start

pytestmark = pytest.mark.django_db(transaction=True)


def git_numbers(origin: GitRepo, sha: str, *flags: str) -> tuple[int, int, int, bool]:
    parents = origin.git("show", "-s", "--format=%P", sha).split()
    base = parents[0] if parents else "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    out = origin.git("diff-tree", "-r", "--numstat", *flags, base, sha)
    lines = [ln for ln in out.splitlines() if ln]
    rows = [ln.split("\t", 2) for ln in lines]
    return (
        len(rows),
        sum(int(a) for a, _, _ in rows if a != "-"),
        sum(int(d) for _, d, _ in rows if d != "-"),
        any(" => " in p for _, _, p in rows),
    )


def test_the_warm_set_is_the_most_viewed_repositories_newest_commits(tmp_path: Path) -> None:
    base = ensure_baseline(actor="t")
    quiet, _ = analysed(tmp_path, "quiet")
    popular, origin = analysed(tmp_path, "popular")
    for _ in range(3):
        record_view(popular.pk)
    record_view(quiet.pk)
    spec = select_warm_set(fingerprint=base.fingerprint, repositories=2, commits_per_repository=3)
    assert [pk for pk, _ in spec["items"]] == [popular.pk, quiet.pk]
    newest = origin.git("rev-list", "--max-count=3", "HEAD").split()
    assert spec["items"][0][1] == newest
    assert spec["threshold"] == 0.95 and spec["base"] == base.fingerprint
    only = select_warm_set(fingerprint=base.fingerprint, repositories=1, commits_per_repository=2)
    assert [pk for pk, _ in only["items"]] == [popular.pk]
    pinned = select_warm_set(fingerprint=base.fingerprint, repository_ids=[quiet.pk])
    assert [pk for pk, _ in pinned["items"]] == [quiet.pk] and len(pinned["items"][0][1]) == 5
    # Nothing stored under another fingerprint: an empty warm set.
    assert select_warm_set(fingerprint="0" * 16)["items"] == []
    with pytest.raises(ValueError):
        select_warm_set(fingerprint=base.fingerprint, threshold=0)


def test_views_not_yet_written_count_toward_the_warm_set(tmp_path: Path) -> None:
    """Views are counted in memory and written in batches (``dashboard.repositories.view_counts``):
    choosing the warm set writes this process's first, so a repository viewed a moment
    ago ranks above one analysed later and never viewed."""
    base = ensure_baseline(actor="t")
    viewed, _ = analysed(tmp_path, "viewed")
    later, _ = analysed(tmp_path, "later")  # analysed last: first when nobody viewed any
    record_view(viewed.pk)
    spec = select_warm_set(fingerprint=base.fingerprint, repositories=2, commits_per_repository=1)
    assert [pk for pk, _ in spec["items"]] == [viewed.pk, later.pk]


def test_the_gate_verdict_checks_coverage_errors_fingerprints_and_workers(tmp_path: Path) -> None:
    base = ensure_baseline(actor="t")
    repo, origin = analysed(tmp_path, "r")
    new = state_machine.register_version(config={"detect_renames": True}, actor="t")
    spec = select_warm_set(fingerprint=base.fingerprint, commits_per_repository=4)
    warm = spec["items"][0][1]

    cold = verify_warm_set(version=new, warm_set=spec)
    assert not cold["ok"] and cold["checks"]["coverage"] is False
    assert (cold["expected"], cold["stored"], cold["coverage"]) == (4, 0, 0.0)

    analyse_as(new, repo, list(reversed(warm[1:])))  # 3 of 4: 75 % < 95 %
    partial = verify_warm_set(version=new, warm_set=spec)
    assert partial["coverage"] == 0.75 and not partial["checks"]["coverage"]
    assert partial["missing"] == [{"repository": repo.pk, "sha": warm[0]}]
    analyse_as(new, repo, [warm[0]])
    no_workers = verify_warm_set(version=new, warm_set=spec)
    assert no_workers["checks"] == {
        "coverage": True, "errors": True, "fingerprint": True, "workers": False,
    }  # fmt: skip
    assert not no_workers["ok"]
    report_worker(base)  # a worker of the *old* version does not count
    assert not verify_warm_set(version=new, warm_set=spec)["checks"]["workers"]
    report_worker(new)
    passed = verify_warm_set(version=new, warm_set=spec)
    assert passed["ok"], passed["summary"]
    assert passed["workers"] == [f"w-{new.fp12}"] and passed["summary"].startswith("passed")

    # A stale worker heartbeat does not count.
    WorkerBeat.objects.filter(version=new.fingerprint).update(
        last_seen=timezone.now() - timezone.timedelta(seconds=settings.WORKER_DEAD_AFTER + 5)
    )
    assert not verify_warm_set(version=new, warm_set=spec)["checks"]["workers"]
    WorkerBeat.objects.filter(version=new.fingerprint).update(last_seen=timezone.now())

    # One file row carrying another fingerprint fails the gate …
    row = FileChange.objects.filter(fingerprint=new.fingerprint).first()
    FileChange.objects.filter(pk=row.pk).update(fingerprint=base.fingerprint)
    foreign = verify_warm_set(version=new, warm_set=spec)
    assert not foreign["ok"] and foreign["foreign_rows"] == 1
    FileChange.objects.filter(pk=row.pk).update(fingerprint=new.fingerprint)
    # … and so does one dead analysis run of the new fingerprint on the warm set.
    JobRun.objects.create(
        job_id="analyze-x", kind="analyze", queue="q", repository=repo,
        fingerprint=new.fingerprint, state=JobRun.State.DEAD, error="boom",
    )  # fmt: skip
    broken = verify_warm_set(version=new, warm_set=spec)
    assert not broken["ok"] and broken["errors"] == 1
    assert broken["error_examples"][0]["error"] == "boom"
    # An empty warm set vouches for nothing.
    assert not verify_warm_set(version=new, warm_set={"items": []})["ok"]
    assert origin  # the origin stays alive for the mirror's sake


def test_the_result_diff_shows_exactly_the_commits_git_counts_differently(tmp_path: Path) -> None:
    base = ensure_baseline(actor="t")
    repo, origin = analysed(tmp_path, "r")
    new = state_machine.register_version(config={"detect_renames": True}, actor="t")
    shas = list(reversed(origin.shas()))
    analyse_as(new, repo, shas)
    spec = select_warm_set(fingerprint=base.fingerprint)
    diff = diff_results(base=base.fingerprint, new=new.fingerprint, warm_set=spec)

    want_changed = {
        sha
        for sha in shas
        if git_numbers(origin, sha, "--no-renames") != git_numbers(origin, sha, "-M")
    }
    assert want_changed  # the fixture does contain renames
    assert diff["compared"] == len(shas) and diff["missing"] == {"base": 0, "new": 0}
    assert diff["commits_changed"] == len(want_changed)
    assert {e["sha"] for e in diff["examples"]} == want_changed
    before = [git_numbers(origin, s, "--no-renames") for s in shas]
    after = [git_numbers(origin, s, "-M") for s in shas]
    totals = diff["totals"]
    assert totals["before"]["files_changed"] == sum(n[0] for n in before)
    assert totals["after"]["files_changed"] == sum(n[0] for n in after)
    assert totals["before"]["insertions"] == sum(n[1] for n in before)
    assert totals["after"]["insertions"] == sum(n[1] for n in after)
    assert totals["after"]["deletions"] == sum(n[2] for n in after)
    renamed = next(e for e in diff["examples"] if e["subject"] == "rename a")
    assert (renamed["before"]["files_changed"], renamed["after"]["files_changed"]) == (2, 1)
    # The rename is one row under its new path: the old path is gone.
    assert (renamed["only_before"], renamed["only_after"]) == (["src/a.py"], [])
    assert diff["summary"].startswith(f"{len(want_changed)} of {len(shas)} commits change")
    # The same fingerprint on both sides: nothing changes.
    same = diff_results(base=base.fingerprint, new=base.fingerprint, warm_set=spec)
    assert same["commits_changed"] == 0 and same["examples"] == []
    # Commits the new version has not analysed yet are counted, not compared.
    Commit.objects.filter(fingerprint=new.fingerprint, sha=shas[0]).delete()
    part = diff_results(base=base.fingerprint, new=new.fingerprint, warm_set=spec)
    assert part["missing"] == {"base": 0, "new": 1} and part["compared"] == len(shas) - 1


def test_views_are_counted_per_day_without_losing_any() -> None:
    from dashboard.models import RepositoryView

    repo = Repository.objects.create(url="https://example.com/x.git")
    for _ in range(5):
        record_view(repo.pk)
    flush_views()  # counted in memory, written in batches
    # (tests/dashboard/repositories/test_view_counts.py)
    assert RepositoryView.objects.get(repository=repo).views == 5


def test_warming_runs_once_under_its_own_lock(tmp_path: Path) -> None:
    """The warmer plans under ``locks:queue:{q}:warm:{fp}`` — a second warmer
    while it holds the lock plans nothing, and one after it enqueues nothing new."""
    from dashboard.infra import queues
    from dashboard.locks import leases
    from dashboard.rollouts.warming import warm_rollout
    from workers.locks import keys

    base = ensure_baseline(actor="t")
    repo, _ = analysed(tmp_path, "warm")
    ro = start.start_rollout(
        config={"detect_renames": True}, actor="t", enqueue_driver=False,
        warm_set=select_warm_set(fingerprint=base.fingerprint, repositories=1),
    )  # fmt: skip
    fp = ro.version.fingerprint
    physical = queues.queue(state_machine.physical_queue("analysis", fp))
    held = leases.redlock().acquire(keys.warm("analysis", fp), ttl=30, holder={"t": 1})
    try:
        assert warm_rollout(ro) == {"skipped": "another warmer holds the warming lock"}
        assert physical.count == 0 and not JobRun.objects.filter(fingerprint=fp).exists()
    finally:
        held.release()
    first = warm_rollout(ro)
    assert first["runs"] >= 1 and first["expected"] == 5
    queued = sorted(physical.job_ids)
    runs = JobRun.objects.filter(fingerprint=fp).count()
    again = warm_rollout(ro)  # a takeover's warmer, after the first one
    assert (
        sorted(physical.job_ids) == queued and JobRun.objects.filter(fingerprint=fp).count() == runs
    )
    assert again["expected"] == 5
    assert leases.redlock().inspect(keys.warm("analysis", fp)) is None  # released
    assert repo.pk == ro.warm_set["items"][0][0]


def test_shadow_samples_are_real_unstored_commits_outside_the_warm_set_first(
    tmp_path: Path,
) -> None:
    """docs/rollouts.md#shadow-samples: ``select_shadow_sample`` takes commits stored
    under the base and not under the new version, repositories outside the warm set
    first, newest first, round-robin, at most ``count``; the same state gives the same
    sample; ``shadow_rollout`` plans each as its own run on the new version's queue."""
    from dashboard.infra import queues
    from dashboard.models import Chunk
    from dashboard.rollouts.warming import select_shadow_sample, shadow_rollout

    base = ensure_baseline(actor="t")
    warm_repo, warm_origin = analysed(tmp_path, "warm")
    other, other_origin = analysed(tmp_path, "other")
    warm_set = select_warm_set(
        fingerprint=base.fingerprint, repositories=1, repository_ids=[warm_repo.pk]
    )
    ro, driver = support_start(warm_set=warm_set)  # ramping: its gate is open
    verify(ro, driver)
    steps.set_ramp(rollout=ro, percent=10, token=int(driver.token or 0), actor="t")
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    new = ro.version
    newest_warm = warm_origin.git("rev-list", "HEAD").split()  # newest first
    newest_other = other_origin.git("rev-list", "HEAD").split()
    analyse_as(new, other, [newest_other[0]])  # already stored under the new version
    sample = select_shadow_sample(
        base=base.fingerprint, new=new.fingerprint, warm_set=warm_set, count=5
    )
    assert sample == [
        (other.pk, newest_other[1]),
        (warm_repo.pk, newest_warm[0]),
        (other.pk, newest_other[2]),
        (warm_repo.pk, newest_warm[1]),
        (other.pk, newest_other[3]),
    ]
    assert sample == select_shadow_sample(
        base=base.fingerprint, new=new.fingerprint, warm_set=warm_set, count=5
    )
    assert (
        select_shadow_sample(base=base.fingerprint, new=new.fingerprint, warm_set=warm_set, count=0)
        == []
    )
    everything = select_shadow_sample(
        base=base.fingerprint, new=new.fingerprint, warm_set=warm_set, count=100
    )
    # Bounded by the data: every commit once, the one stored already last (analysed again).
    assert len(everything) == len(set(everything)) == len(newest_warm) + len(newest_other)
    assert everything[-1] == (other.pk, newest_other[0])

    planned = shadow_rollout(ro, 3)
    assert (planned["commits"], planned["repositories"], planned["reanalysed"]) == (3, 2, 0)
    assert planned["items"] == [list(x) for x in sample[:3]]
    # (both fixtures have the same history, so the same shas: compare with repositories)
    shadow_chunks = Chunk.objects.filter(fingerprint=new.fingerprint, key__startswith="shadow-")
    assert sorted((c.repository_id, c.key, c.shas, c.size) for c in shadow_chunks) == sorted(
        (pk, f"shadow-{ro.pk}-0-{s}", s, 1) for pk, s in sample[:3]
    )
    runs = JobRun.objects.filter(fingerprint=new.fingerprint, kind="analyze")
    shadow_runs = {r.rq_id() for r in runs.filter(chunk__in=shadow_chunks)}
    assert len(shadow_runs) == 3  # one run (one sample) per commit
    physical = queues.queue(state_machine.physical_queue("analysis", new.fingerprint))
    assert shadow_runs <= set(physical.job_ids)
    queued = sorted(physical.job_ids)
    again = shadow_rollout(ro, 3)  # the same commits: open chunks, nothing new enqueued
    assert again["items"] == planned["items"] and sorted(physical.job_ids) == queued


def test_a_commit_the_canary_stored_already_is_analysed_again_and_stored_once(
    tmp_path: Path,
) -> None:
    """A small system (every commit warmed): the shadow sample analyses stored commits
    again, as real work on the canary's queue, and ``write_chunk`` stores nothing twice."""
    from dashboard.infra import queues
    from dashboard.rollouts.warming import shadow_rollout
    from tests.support.rollout_workers import run_version_workers

    base = ensure_baseline(actor="t")
    repo, origin = analysed(tmp_path, "small")
    ro, driver = support_start(
        warm_set=select_warm_set(fingerprint=base.fingerprint, repositories=1)
    )
    verify(ro, driver)
    new = Rollout.objects.select_related("version").get(pk=ro.pk).version
    shas = origin.git("rev-list", "HEAD").split()
    analyse_as(new, repo, list(reversed(shas)))  # every commit stored under the new version
    steps.set_ramp(rollout=ro, percent=10, token=int(driver.token or 0), actor="t")
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    planned = shadow_rollout(ro, 3)
    assert (planned["commits"], planned["reanalysed"]) == (3, 3)
    assert planned["items"] == [[repo.pk, s] for s in shas[:3]]
    physical = queues.queue(state_machine.physical_queue("analysis", new.fingerprint))
    # One repository's three runs: its fair share waits in RQ, the rest parked in the
    # database until a claim releases them (docs/scheduling.md#fairness).
    shadow = JobRun.objects.filter(fingerprint=new.fingerprint, chunk__key__startswith="shadow-")
    in_rq = min(3, settings.FAIR_WEIGHT)
    assert physical.count == in_rq
    assert shadow.filter(state="queued", parked=True).count() == 3 - in_rq
    run_version_workers()
    runs = JobRun.objects.filter(fingerprint=new.fingerprint, chunk__key__startswith="shadow-")
    assert sorted(runs.values_list("state", flat=True)) == ["succeeded"] * 3
    assert Commit.objects.filter(repository=repo, fingerprint=new.fingerprint).count() == len(shas)
    assert shadow_rollout(ro, 3)["items"] == planned["items"] and physical.count == 0
