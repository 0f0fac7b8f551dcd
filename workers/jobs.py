"""RQ entry points. Each one: resolve ids → take the lock → call core → record.

Arguments are ids and strings only. Every job is idempotent: a redelivery, a duplicate
enqueue or a retry after a crash finds the work done (or half done and not yet
committed) and does exactly what is still missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rq import get_current_job

from dashboard import queues
from dashboard.commits import write_chunk
from dashboard.fencing import check_token
from dashboard.models import Chunk, Commit, JobRun, Repository
from dashboard.plans import complete_repository, fail_repository, plan_repository
from dashboard.repositories import current_fingerprint, validate_remote
from workers.failpoints import failpoint
from workers.gitproc import GitError, ProcessGroups, Runner
from workers.history import list_commits, stream_commits
from workers.locks import Lock, LockLost
from workers.mirror import (
    HEAD_REF,
    RepositoryUnavailable,
    is_valid,
    mirror_path,
    pins_for,
    remove_stale_temporaries,
    sync_mirror,
)
from workers.remotes import InvalidRemote

log = logging.getLogger(__name__)


def mirror_lock_key(repo_id: int) -> str:
    return f"locks:git:repo:{repo_id}:mirror"


def _job_context(kind: str) -> tuple[str, str, int]:
    job = get_current_job()
    job_id = job.id if job else f"{kind}-inline"
    worker = (job.worker_name if job else None) or "inline"
    attempts = 1
    if job is not None and job.retries_left is not None:
        attempts = 1 + max(0, len(queues.RETRY.intervals) - job.retries_left)
    return job_id, str(worker), attempts


def _holder(job_id: str, worker: str, fingerprint: str) -> dict[str, Any]:
    return {
        "worker": worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": job_id,
        "version": fingerprint,
    }


def _last_attempt() -> bool:
    job = get_current_job()
    return job is None or not job.retries_left


def _record(job_id: str, **fields: Any) -> None:
    JobRun.objects.filter(job_id=job_id).update(**fields)


def _start_run(
    job_id: str,
    *,
    kind: str,
    queue: str,
    repo_id: int,
    chunk_id: int | None,
    fingerprint: str,
    worker: str,
    attempts: int,
) -> None:
    JobRun.objects.update_or_create(
        job_id=job_id,
        defaults={
            "kind": kind,
            "queue": queue,
            "repository_id": repo_id,
            "chunk_id": chunk_id,
            "fingerprint": fingerprint,
            "state": JobRun.State.RUNNING,
            "attempts": attempts,
            "worker": worker,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": timezone.now(),
            "error": "",
        },
    )


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


def _ensure_mirror(
    repo: Repository, *, holder: dict[str, Any], groups: ProcessGroups, need: str | None = None
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
    with (
        queues.redlock().hold(
            [key], ttl=settings.LOCK_TTL, holder=holder, on_lost=lambda _lock: groups.kill_all()
        ) as lock,
        _abort_on_loss(lock),
    ):
        remove_stale_temporaries(workspace, repo.pk)
        sync_mirror(
            workspace=workspace,
            repo_id=repo.pk,
            git_url=remote.git_url(),
            branch=repo.branch,
            runner=runner,
            timeout=settings.GIT_TIMEOUT,
            pinned=pins_for(remote),
        )
        lock.check()
    return path


def _has_commit(runner: Runner, path: Path, sha: str) -> bool:
    try:
        runner.run(["--git-dir", str(path), "cat-file", "-e", f"{sha}^{{commit}}"], timeout=60)
    except GitError:
        return False
    return True


def sync_repository(repo_id: int, generation: int) -> str:
    """Fetch the mirror, plan the chunks still to analyse, enqueue them.

    Holds ``locks:git:repo:{id}:mirror`` (heartbeat-extended) for the fetch and for the
    database write that records the new head and plan; that write checks the lock's
    fencing token in its own transaction.
    """
    fp = current_fingerprint()
    job_id, worker, attempts = _job_context("sync")
    # Only a queued/syncing repository of this generation is synced: a redelivery after
    # the plan was written, or a job of a superseded generation, ends here.
    claimed = Repository.objects.filter(
        pk=repo_id,
        generation=generation,
        status__in=[Repository.Status.QUEUED, Repository.Status.SYNCING],
    ).update(status=Repository.Status.SYNCING, updated_at=timezone.now())
    if not claimed:
        return "nothing to do"
    repo = Repository.objects.get(pk=repo_id)
    _start_run(
        job_id,
        kind="sync",
        queue=queues.SYNC_QUEUE,
        repo_id=repo_id,
        chunk_id=None,
        fingerprint=fp,
        worker=worker,
        attempts=attempts,
    )
    holder = _holder(job_id, worker, fp)
    groups = ProcessGroups()
    runner = Runner(groups=groups)
    workspace = Path(settings.WORKSPACE)
    key = mirror_lock_key(repo_id)
    try:
        remote = validate_remote(repo.fetch_url or repo.url)
        with (
            queues.redlock().hold(
                [key], ttl=settings.LOCK_TTL, holder=holder, on_lost=lambda _lock: groups.kill_all()
            ) as lock,
            _abort_on_loss(lock),
        ):
            _record(job_id, lock_key=key, token=lock.token, lock_acquired_at=timezone.now())
            failpoint("sync.locked")
            remove_stale_temporaries(workspace, repo_id)
            head = sync_mirror(
                workspace=workspace,
                repo_id=repo_id,
                git_url=remote.git_url(),
                branch=repo.branch,
                runner=runner,
                timeout=settings.GIT_TIMEOUT,
                pinned=pins_for(remote),
            )
            _record(job_id, fetched_at=timezone.now())
            failpoint("sync.fetched")
            path = mirror_path(workspace, repo_id)
            shas = list_commits(path, HEAD_REF, git=Runner(git_dir=path, groups=groups))
            lock.check()
            with transaction.atomic():
                check_token(key, lock.token)
                queued = plan_repository(
                    repo_id=repo_id, generation=generation, fingerprint=fp, head=head, shas=shas
                )
    except (RepositoryUnavailable, InvalidRemote) as exc:
        # Not retried: the remote will not appear by itself; the user re-submits.
        fail_repository(repo_id=repo_id, generation=generation, reason=str(exc))
        _record(job_id, state=JobRun.State.FAILED, error=str(exc), finished_at=timezone.now())
        return f"failed: {exc}"
    except Exception as exc:
        final = _last_attempt()
        _record(
            job_id,
            state=JobRun.State.DEAD if final else JobRun.State.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        if final:
            fail_repository(repo_id=repo_id, generation=generation, reason=_reason(exc))
        raise
    transaction.on_commit(lambda: enqueue_chunks(queued))
    _record(
        job_id, state=JobRun.State.SUCCEEDED, written_at=timezone.now(), finished_at=timezone.now()
    )
    return f"planned {len(queued)} chunks over {len(shas)} commits"


def enqueue_chunks(chunk_ids: list[int]) -> int:
    """Enqueue analyze jobs (deterministic ids); returns how many were new."""
    count = 0
    for chunk in Chunk.objects.filter(pk__in=chunk_ids).order_by("position"):
        q = queues.analysis_queue(chunk.fingerprint)
        if queues.enqueue_unique(q, "workers.jobs.analyze_chunk", chunk.pk, job_id=chunk.job_id()):
            count += 1
    return count


def analyze_chunk(chunk_id: int) -> str:
    """Analyse one chunk with one streaming git process; write it in one transaction.

    Holds ``locks:git:repo:{id}:commit:{first}..{last}``; if the lock is lost the
    heartbeat kills git's process group and ``lock.check()``/the fencing check stop any
    write. A chunk whose commits are all stored ends at once without touching git.
    """
    chunk = Chunk.objects.select_related("repository").filter(pk=chunk_id).first()
    if chunk is None:
        return "chunk gone"
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
    job_id, worker, attempts = _job_context("analyze")
    Chunk.objects.filter(pk=chunk.pk).exclude(state=Chunk.State.DONE).update(
        state=Chunk.State.RUNNING
    )
    _start_run(
        job_id,
        kind="analyze",
        queue=queues.analysis_queue(chunk.fingerprint).name,
        repo_id=repo.pk,
        chunk_id=chunk.pk,
        fingerprint=chunk.fingerprint,
        worker=worker,
        attempts=attempts,
    )
    holder = _holder(job_id, worker, chunk.fingerprint)
    groups = ProcessGroups()
    key = chunk.lock_key()
    try:
        failpoint("analyze.before_lock")
        path = _ensure_mirror(repo, holder=holder, groups=groups, need=shas[-1])
        with (
            queues.redlock().hold(
                [key], ttl=settings.LOCK_TTL, holder=holder, on_lost=lambda _lock: groups.kill_all()
            ) as lock,
            _abort_on_loss(lock),
        ):
            _record(job_id, lock_key=key, token=lock.token, lock_acquired_at=timezone.now())
            failpoint("analyze.locked")
            records = []
            for record in stream_commits(path, shas, git=Runner(git_dir=path, groups=groups)):
                records.append(record)
                if len(records) == 1:
                    failpoint("analyze.parsing")
            _record(job_id, analysed_at=timezone.now())
            lock.check()
            failpoint("analyze.before_write")
            written = write_chunk(chunk=chunk, records=records, token=lock.token)
    except Exception as exc:
        final = _last_attempt()
        error = f"{type(exc).__name__}: {exc}"[:2000]
        _record(
            job_id,
            state=JobRun.State.DEAD if final else JobRun.State.FAILED,
            error=error,
            finished_at=timezone.now(),
        )
        Chunk.objects.filter(pk=chunk.pk).exclude(state=Chunk.State.DONE).update(
            state=Chunk.State.FAILED if final else Chunk.State.QUEUED, error=error
        )
        if final:
            fail_repository(repo_id=repo.pk, generation=None, reason=_reason(exc))
        raise
    _record(
        job_id, state=JobRun.State.SUCCEEDED, written_at=timezone.now(), finished_at=timezone.now()
    )
    complete_repository(repo_id=repo.pk, fingerprint=chunk.fingerprint)
    return f"stored {written} commits"


def _reason(exc: BaseException) -> str:
    """A one-line reason fit for users (no traceback, no paths of the worker host)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]
