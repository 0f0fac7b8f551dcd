"""RQ entry points. Each one: claim the attempt → take the lock → call core → record.

Arguments are ids only: ``(run_id, attempt)``. The attempt is claimed in the database
first (``dashboard.runs.begin_attempt``), so a redelivered job does nothing; the work
itself is idempotent too, so a retry after a crash finds the work done (or half done
and not yet committed) and does exactly what is still missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rq import get_current_job

from dashboard import queues, runs
from dashboard.commits import write_chunk
from dashboard.fencing import check_token
from dashboard.live import publish_event, publish_repo_changed
from dashboard.models import Chunk, Commit, Repository
from dashboard.operations import EXTENSIONS_HASH, describe_resource
from dashboard.plans import complete_repository, plan_repository
from dashboard.repositories import current_fingerprint, validate_remote
from dashboard.summaries import repository_summary
from workers.analyzer import config_for
from workers.failpoints import failpoint
from workers.gitproc import GitError, ProcessGroups, Runner
from workers.history import CommitTooLarge, list_commits, stream_commits
from workers.locks import Lock, LockLost, LockNotAcquired
from workers.mirror import (
    HEAD_REF,
    RepositoryUnavailable,
    is_valid,
    mirror_path,
    pins_for,
    update_mirror,
)
from workers.remotes import InvalidRemote

log = logging.getLogger(__name__)


#: Failures that retrying cannot fix: the run is dead-lettered after one attempt.
PERMANENT: tuple[type[BaseException], ...] = (
    RepositoryUnavailable,
    InvalidRemote,
    CommitTooLarge,
)


def _lock_wait(exc: LockNotAcquired) -> float:
    """Seconds until the contended lease ends (its remaining TTL), plus jitter."""
    remaining = [
        info["ttl_ms"] / 1000.0
        for key in exc.keys
        if (info := queues.redlock().inspect(key)) is not None
    ]
    base = max(remaining) if remaining else settings.LOCK_TTL / 3
    return round(min(float(settings.LOCK_TTL), base + 0.05 + random.uniform(0, 0.25)), 3)


def mirror_lock_key(repo_id: int) -> str:
    return f"locks:git:repo:{repo_id}:mirror"


def _holder(attempt: runs.Attempt) -> dict[str, Any]:
    run = attempt.run
    return {
        "worker": attempt.worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": run.job_id,
        "attempt": attempt.number,
        "version": run.fingerprint or current_fingerprint(),
    }


def _execute(run_id: int, number: int, body: Callable[[runs.Attempt], str]) -> str:
    """Claim the attempt, run ``body``, record the outcome (DESIGN §5)."""
    job = get_current_job()
    worker = (job.worker_name if job else None) or f"{socket.gethostname()}.{os.getpid()}"
    attempt = runs.begin_attempt(run_id=run_id, number=number, worker=str(worker))
    if attempt is None:
        return "superseded: this attempt was already claimed or the run moved on"
    try:
        result = body(attempt)
    except LockNotAcquired as exc:
        delay = _lock_wait(exc)
        runs.defer_attempt(attempt, delay=delay, reason=f"waiting {delay:.1f}s for a lock: {exc}")
        return f"deferred {delay:.1f}s: lock held by another job"
    except PERMANENT as exc:
        runs.fail_attempt(attempt, exc, permanent=True, reason=str(exc))
        return f"failed: {exc}"
    except Exception as exc:
        runs.fail_attempt(attempt, exc)
        raise
    runs.succeed_attempt(attempt)
    return result


@contextlib.contextmanager
def _abort_on_loss(lock: Lock) -> Iterator[None]:
    """Report a failure inside a lost lease as what it is: the heartbeat lost the lock
    and killed git (so the git error is a symptom), and the job must write nothing."""
    try:
        yield
    except LockLost:
        raise
    except Exception as exc:
        if lock.lost.is_set():
            raise LockLost(f"lock lost while working ({type(exc).__name__}); job aborted") from exc
        raise


@contextlib.contextmanager
def _locked(key: str, attempt: runs.Attempt, groups: ProcessGroups, repo_id: int) -> Iterator[Lock]:
    """Hold ``key`` (heartbeat-extended) and tell the live view: acquired, extended,
    lost, released. A lost lease kills the job's git process groups at once."""
    conn = queues.connection()

    def extended(lock: Lock) -> None:
        conn.hset(EXTENSIONS_HASH, key, str(lock.extensions))
        publish_event(
            "lock.extended",
            {"key": key, "extensions": lock.extensions, "ttl_ms": int(lock.valid_for() * 1000)},
            repo_id=repo_id,
        )

    def lost(lock: Lock) -> None:
        groups.kill_all()
        publish_event("lock.lost", {"key": key, "job": attempt.run.job_id}, repo_id=repo_id)

    with (
        queues.redlock().hold(
            [key],
            ttl=settings.LOCK_TTL,
            holder=_holder(attempt),
            on_lost=lost,
            on_extended=extended,
        ) as lock,
        _abort_on_loss(lock),
    ):
        runs.record_phase(attempt, lock_key=key, token=lock.token, lock_acquired_at=timezone.now())
        publish_event(
            "lock.acquired",
            {
                **describe_resource(key),
                "worker": attempt.worker,
                "job": attempt.run.job_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "token": lock.token,
                "agreeing": lock.agreeing,
                "masters": len(settings.REDIS_URLS),
                "ttl_ms": int(lock.valid_for() * 1000),
                "extensions": 0,
                "stale": False,
            },
            repo_id=repo_id,
        )
        try:
            yield lock
        finally:
            conn.hdel(EXTENSIONS_HASH, key)
            publish_event("lock.released", {"key": key}, repo_id=repo_id)


def _ensure_mirror(
    repo: Repository, *, attempt: runs.Attempt, groups: ProcessGroups, need: str | None = None
) -> Path:
    """The local mirror, fetched under the mirror lock if missing or lacking ``need``.

    Each worker host has its own workspace, so an analyze job may run where no sync
    ran: it then brings the mirror up to date itself, holding the same lock a sync would.
    """
    workspace = Path(settings.WORKSPACE)
    path = mirror_path(workspace, repo.pk)
    runner = Runner(groups=groups)
    if is_valid(path, runner) and (need is None or _has_commit(runner, path, need)):
        return path
    remote = validate_remote(repo.fetch_url or repo.url)
    key = mirror_lock_key(repo.pk)
    with _locked(key, attempt, groups, repo.pk) as lock:
        update_mirror(
            workspace=workspace,
            repo_id=repo.pk,
            git_url=remote.git_url(),
            branch=repo.branch,
            runner=runner,
            timeout=settings.GIT_TIMEOUT,
            pinned=pins_for(remote),
            check=lock.check,
        )
        lock.check()
    return path


def _has_commit(runner: Runner, path: Path, sha: str) -> bool:
    try:
        runner.run(["--git-dir", str(path), "cat-file", "-e", f"{sha}^{{commit}}"], timeout=60)
    except GitError:
        return False
    return True


def sync_repository(run_id: int, attempt: int) -> str:
    return _execute(run_id, attempt, _sync)


def analyze_chunk(run_id: int, attempt: int) -> str:
    return _execute(run_id, attempt, _analyze)


def run_bulk_action(action_id: int) -> str:
    from dashboard.deadletters import run_bulk

    action = run_bulk(action_id)
    return f"{action.kind}: {action.done}/{action.total}"


def _sync(attempt: runs.Attempt) -> str:
    """Fetch the mirror, plan the chunks still to analyse, enqueue them.

    Holds ``locks:git:repo:{id}:mirror`` (heartbeat-extended) for the fetch and for the
    database write that records the new head and plan; that write checks the lock's
    fencing token in its own transaction.
    """
    run = attempt.run
    repo_id, generation = run.repository_id, run.generation
    fp = current_fingerprint()
    # Only a queued/syncing repository of this generation is synced: a job of a
    # superseded generation ends here.
    claimed = Repository.objects.filter(
        pk=repo_id,
        generation=generation,
        status__in=[Repository.Status.QUEUED, Repository.Status.SYNCING],
    ).update(status=Repository.Status.SYNCING, updated_at=timezone.now())
    if not claimed:
        return "nothing to do"
    repo = Repository.objects.get(pk=repo_id)
    groups = ProcessGroups()
    runner = Runner(groups=groups)
    workspace = Path(settings.WORKSPACE)
    key = mirror_lock_key(repo_id)
    remote = validate_remote(repo.fetch_url or repo.url)
    with _locked(key, attempt, groups, repo_id) as lock:
        failpoint("sync.locked", repo.name)
        head = update_mirror(
            workspace=workspace,
            repo_id=repo_id,
            git_url=remote.git_url(),
            branch=repo.branch,
            runner=runner,
            timeout=settings.GIT_TIMEOUT,
            pinned=pins_for(remote),
            check=lock.check,
        )
        runs.record_phase(attempt, fetched_at=timezone.now())
        failpoint("sync.fetched", repo.name)
        path = mirror_path(workspace, repo_id)
        shas = list_commits(path, HEAD_REF, git=Runner(git_dir=path, groups=groups))
        lock.check()
        with transaction.atomic():
            check_token(key, lock.token)
            planned = plan_repository(
                repo_id=repo_id, generation=generation, fingerprint=fp, head=head, shas=shas
            )
    runs.record_phase(attempt, written_at=timezone.now())
    publish_repo_changed(repo_id)
    return f"planned {len(planned)} chunks over {len(shas)} commits"


def _analyze(attempt: runs.Attempt) -> str:
    """Analyse one chunk with one streaming git process; write it in one transaction.

    Holds ``locks:git:repo:{id}:commit:{first}..{last}``; if the lock is lost the
    heartbeat kills git's process group and ``lock.check()``/the fencing check stop any
    write. A chunk whose commits are all stored ends at once without touching git.
    """
    chunk = Chunk.objects.select_related("repository").get(pk=attempt.run.chunk_id)
    repo = chunk.repository
    if chunk.state == Chunk.State.DONE:
        complete_repository(repo_id=repo.pk, fingerprint=chunk.fingerprint)
        return "already done"
    shas = chunk.sha_list()
    stored = Commit.objects.filter(
        repository=repo, fingerprint=chunk.fingerprint, sha__in=shas
    ).count()
    if stored == len(shas):
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.DONE, finished_at=timezone.now())
        complete_repository(repo_id=repo.pk, fingerprint=chunk.fingerprint)
        return "already stored"
    Chunk.objects.filter(pk=chunk.pk).exclude(state=Chunk.State.DONE).update(
        state=Chunk.State.RUNNING
    )
    config = config_for(chunk.fingerprint)  # exactly the version it was planned for, or refuse
    groups = ProcessGroups()
    key = chunk.lock_key()
    failpoint("analyze.before_lock", repo.name)
    path = _ensure_mirror(repo, attempt=attempt, groups=groups, need=shas[-1])
    with _locked(key, attempt, groups, repo.pk) as lock:
        failpoint("analyze.locked", repo.name)
        records = []
        for record in stream_commits(
            path, shas, config=config, git=Runner(git_dir=path, groups=groups)
        ):
            records.append(record)
            if len(records) == 1:
                failpoint("analyze.parsing", repo.name)
        runs.record_phase(attempt, analysed_at=timezone.now())
        lock.check()
        failpoint("analyze.before_write", repo.name)
        written = write_chunk(chunk=chunk, records=records, token=lock.token)
    runs.record_phase(attempt, written_at=timezone.now())
    analyzed = Commit.objects.filter(repository=repo, fingerprint=chunk.fingerprint).count()
    publish_event(
        "job.progress",
        {"repo": repo.pk, "analyzed": analyzed, "total": repo.commits_total},
        repo_id=repo.pk,
    )
    if complete_repository(repo_id=repo.pk, fingerprint=chunk.fingerprint):
        # Aggregates are computed once, here, so no page load pays for them.
        repository_summary(Repository.objects.get(pk=repo.pk), chunk.fingerprint)
        publish_repo_changed(repo.pk)
    return f"stored {written} commits"
