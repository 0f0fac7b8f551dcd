"""Push webhooks (docs/api.md#push-webhooks): a git host tells gitward a repository was
pushed to; after a quiet period (``GITWARD_HOOK_DEBOUNCE``) one sync fetches the head it
then has, however many pushes came in the burst.

- **Secrets**: one per repository, generated here and shown once (``issue_secret``);
  stored as is, because verifying an HMAC needs the secret itself
  (docs/security.md#push-webhook-secrets).
- **Verification** (``verify``): GitHub's ``X-Hub-Signature-256: sha256=<hex>``, Gitea's
  ``X-Gitea-Signature: <hex>`` and the generic ``X-Gitward-Signature: sha256=<hex>`` are an
  HMAC-SHA256 of the raw body; GitLab's ``X-Gitlab-Token`` is the secret itself. Every
  comparison is constant-time (``hmac.compare_digest``).
- **Debounce** (``schedule_sync``): the push is recorded on the row (``pushed_at``) and a
  maintenance job with a deterministic id per repository is scheduled ``DEBOUNCE`` seconds
  ahead; a push while it waits moves it back (a ``ZADD XX`` on RQ's schedule), up to
  ``HOOK_MAX_WAIT`` after the first. The job (``sync_after_push``) starts a sync unless the
  push is already covered by one that fetches after it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from dashboard import infra, runs
from dashboard.accounts import record_audit
from dashboard.models import JobRun, Repository
from dashboard.repositories.lifecycle import current_fingerprint, refresh_repository

log = logging.getLogger(__name__)

#: The RQ entry point of a debounced push (``workers.jobs``), called ``(repo_id, step)``.
PUSH_FUNC = "workers.jobs.sync_after_push"
#: Issuing a repository's secret: the permission re-analysing needs.
PERMISSION = "dashboard.change_repository"
#: What each provider's push looks like: (signature header, scheme, event header, push events).
PROVIDERS: dict[str, tuple[str, str, str, frozenset[str]]] = {
    "github": ("X-Hub-Signature-256", "hmac-prefixed", "X-GitHub-Event", frozenset({"push"})),
    "gitlab": (
        "X-Gitlab-Token",
        "token",
        "X-Gitlab-Event",
        frozenset({"Push Hook", "Tag Push Hook", "System Hook"}),
    ),
    "gitea": ("X-Gitea-Signature", "hmac-hex", "X-Gitea-Event", frozenset({"push"})),
    "generic": ("X-Gitward-Signature", "hmac-prefixed", "X-Gitward-Event", frozenset({"push"})),
}


class HookRefused(Exception):
    """The request is not a valid push for this repository: ``status`` and a message."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Push:
    """A verified push: who sent it, the event, the ref pushed ("" unknown)."""

    provider: str
    event: str
    ref: str


def issue_secret(repo: Repository, user: Any) -> str:
    """A new webhook secret for ``repo`` (the old one stops working); returned once,
    never shown again. Needs ``dashboard.change_repository``; audited without the secret.
    Raises ``HookRefused`` (403)."""
    target = f"repository {repo.name} (#{repo.pk}, {repo.shown_url})"
    if not getattr(user, "has_perm", lambda _p: False)(PERMISSION):
        record_audit(user=user, action="repo.hook_secret", target=target,
                     outcome="refused: permission denied")  # fmt: skip
        raise HookRefused("you do not have permission to manage this repository's webhook", 403)
    secret = "gwh_" + secrets.token_urlsafe(32)
    Repository.objects.filter(pk=repo.pk).update(hook_secret=secret)
    repo.hook_secret = secret
    record_audit(user=user, action="repo.hook_secret", target=target,
                 outcome="a new secret was issued; the previous one no longer works")  # fmt: skip
    return secret


def _header(headers: Any, name: str) -> str:
    return str(headers.get(name, "") or "")


def verify(repo: Repository, headers: Any, body: bytes) -> Push:
    """Check a push request's signature against the repository's secret. Raises
    ``HookRefused``: 403 when the repository has no secret (webhooks not enabled), 401 for
    a missing or wrong signature, 400 for a body that is not a JSON object."""
    if not repo.hook_secret:
        raise HookRefused("webhooks are not enabled for this repository", 403)
    found = [(name, spec) for name, spec in PROVIDERS.items() if _header(headers, spec[0])]
    if not found:
        raise HookRefused("missing signature", 401)
    provider, (sig_header, scheme, event_header, _) = found[0]
    given = _header(headers, sig_header).strip()
    key = repo.hook_secret.encode()
    if scheme == "token":
        ok = hmac.compare_digest(given.encode(), key)
    else:
        digest = hmac.new(key, body, hashlib.sha256).hexdigest()
        expected = f"sha256={digest}" if scheme == "hmac-prefixed" else digest
        ok = hmac.compare_digest(given.lower().encode(), expected.encode())
    if not ok:
        raise HookRefused("bad signature", 401)
    try:
        payload = json.loads(body.decode("utf-8")) if body.strip() else {}
    except (UnicodeDecodeError, ValueError):
        raise HookRefused("the body is not JSON", 400) from None
    if not isinstance(payload, dict):
        raise HookRefused("the body must be a JSON object", 400)
    ref = payload.get("ref")
    return Push(
        provider=provider,
        event=_header(headers, event_header) or "push",
        ref=ref if isinstance(ref, str) else "",
    )


def wanted(repo: Repository, push: Push) -> str | None:
    """Why this verified push starts nothing ("ping", another branch), or None if it
    should sync the repository."""
    events = PROVIDERS[push.provider][3]
    if push.event not in events:
        return f"ignored: event {push.event[:50]!r} is not a push"
    if repo.branch and push.ref and push.ref != f"refs/heads/{repo.branch}":
        return f"ignored: {push.ref[:200]} is not the analysed branch {repo.branch}"
    return None


def job_id(repo_id: int, step: str = "") -> str:
    return f"hook-{repo_id}{'-' + step if step else ''}"


def schedule_sync(repo: Repository) -> str:
    """Record the push and (re)schedule the repository's debounced sync job; returns
    what was done: ``scheduled`` (a new job), ``delayed`` (the waiting job moved back),
    ``trailing`` (the job is already queued or running: a second one waits behind it).

    Race: the job's schedule entry moves while we look (a worker promotes it: a ``ZREM``
    first, ``infra.promote_due_jobs``). ``ZADD XX`` updates its time only if the entry is
    still in the schedule; if not, the push goes to the trailing job (``hook-<id>-next``).
    Every job decides from the database (``sync_after_push``): a push is covered by a
    sync that fetches after ``pushed_at``, so an extra job starts nothing. The one gap:
    a push arriving while both the job and its trailing job are running is only seen by
    the next push's job (``pushed_at`` is recorded either way)."""
    Repository.objects.filter(pk=repo.pk).update(pushed_at=timezone.now())
    q = infra.queue(infra.MAINTENANCE_QUEUE)
    for step in ("", "next"):
        outcome = _debounce(q, repo.pk, job_id(repo.pk, step))
        if outcome is not None:
            return outcome if not step else "trailing"
    return "pending"


def _debounce(q: Any, repo_id: int, key: str) -> str | None:
    """Schedule job ``key`` ``HOOK_DEBOUNCE`` seconds ahead, or move it back there if it
    waits in the schedule (never past ``HOOK_MAX_WAIT`` after it was created); None if it
    is queued or running (a job that no longer waits cannot be delayed)."""
    conn = q.connection
    delay = float(settings.HOOK_DEBOUNCE)
    registry = ScheduledJobRegistry(queue=q)
    job = Job.fetch_many([key], connection=conn)[0]
    status = job.get_status(refresh=False) if job is not None else None
    if status in {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED}:
        return None
    if status == JobStatus.SCHEDULED and job is not None and job.created_at is not None:
        cap = job.created_at.replace(tzinfo=UTC).timestamp() + float(settings.HOOK_MAX_WAIT)
        when = min(time.time() + delay, cap)
        # RQ's schedule is a sorted set of job ids scored by epoch seconds (read back
        # through RQ's own registry by tests/dashboard/repositories/test_webhooks.py).
        conn.zadd(registry.key, {key: when}, xx=True)
        if conn.zscore(registry.key, key) is not None:
            return "delayed"
        return None  # promoted meanwhile: queued now
    # none, or a finished or failed leftover: replaced
    # a push is refresh work (docs/scheduling.md#classes)
    infra.enqueue_unique(q, PUSH_FUNC, repo_id, 0, job_id=key, delay=delay, priority=runs.REFRESH)
    return "scheduled"


def sync_after_push(repo_id: int, step: int = 0) -> str:
    """The debounced job: start one sync of the repository unless its last push is
    covered (a sync of the current generation queued, or started at or after the push).
    A busy repository (its served analysis running) is looked at again after the
    debounce by a follow-up job (``hook-<id>-g<generation>-<step>``)."""
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None or repo.pushed_at is None:
        return "nothing to do"
    sync = (
        JobRun.objects.filter(
            repository_id=repo_id, kind=JobRun.Kind.SYNC, generation=repo.generation
        )
        .order_by("-pk")
        .first()
    )
    if sync is not None and (
        (sync.state == JobRun.State.QUEUED and sync.started_at is None)
        or (sync.started_at is not None and sync.started_at >= repo.pushed_at)
    ):
        return f"covered by {sync.job_id}"
    if refresh_repository(
        repo_id=repo_id, fingerprint=current_fingerprint(), priority=runs.REFRESH
    ):
        return "sync queued"
    nxt = job_id(repo_id, f"g{repo.generation}-{step + 1}")
    infra.enqueue_unique(infra.queue(infra.MAINTENANCE_QUEUE), PUSH_FUNC, repo_id, step + 1,
                         job_id=nxt, delay=float(settings.HOOK_DEBOUNCE),
                         priority=runs.REFRESH)  # fmt: skip
    return f"busy: looked at again by {nxt}"


def results_lag(*, now: Any = None, limit: int = 50) -> tuple[list[tuple[int, str, float]], int]:
    """How far repositories' results lag their remote, as far as gitward knows it: a
    repository whose last push webhook (``pushed_at``) is not reflected yet — not ready,
    or last analysed before that push — lags by the time since the push. Returns the
    ``limit`` most lagging as ``(id, name, seconds)``, most first, and how many lag in
    all. A repository without webhooks never lags here: its remote head is unknown
    until a sync fetches it (docs/operations.md#observability)."""
    now = now or timezone.now()
    lagging = Repository.objects.filter(pushed_at__isnull=False).filter(
        ~Q(status=Repository.Status.READY)
        | Q(analyzed_at__isnull=True)
        | Q(analyzed_at__lt=F("pushed_at"))
    )
    rows = [
        (pk, Repository.name_of(url), max(0.0, (now - pushed).total_seconds()))
        for pk, url, pushed in lagging.order_by("pushed_at").values_list("pk", "url", "pushed_at")[
            :limit
        ]
    ]
    return rows, lagging.count()
