"""gitward's tables. Behaviour of one row lives here; multi-model work lives in the
``dashboard/<noun>.py`` modules."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from workers import lockkeys


class Repository(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        SYNCING = "syncing"
        ANALYZING = "analyzing"
        READY = "ready"
        FAILED = "failed"

    #: Normalised URL (``workers.remotes``); with ``branch`` it identifies the repository.
    url = models.CharField(max_length=2048)
    #: The URL handed to git (the submitted form, validated); ``url`` is only the dedup key.
    fetch_url = models.CharField(max_length=2048, blank=True, default="")
    #: Branch to analyse; "" means the remote's default branch (its HEAD).
    branch = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    error = models.TextField(blank=True, default="")
    head = models.CharField(max_length=40, blank=True, default="")
    #: Analyzer fingerprint the last sync planned work for.
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    commits_total = models.IntegerField(default=0)
    #: Bumped by every accepted (re)submission; part of the sync job id so that one
    #: generation is synced at most once however often it is submitted.
    generation = models.IntegerField(default=1)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    analyzed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["url", "branch"], name="repository_url_branch_unique")
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        tail = self.url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        return tail.removesuffix(".git") or self.url

    @property
    def is_active(self) -> bool:
        return self.status in {self.Status.QUEUED, self.Status.SYNCING, self.Status.ANALYZING}

    def sync_job_id(self) -> str:
        return f"sync-{self.pk}-g{self.generation}"

    def lock_key(self) -> str:
        """The mirror lock: held by every write to this repository's mirror."""
        return lockkeys.mirror(self.pk)

    def fail(self, reason: str, *, generation: int | None = None) -> bool:
        """Mark the repository failed with a readable reason; True if it changed.

        A ready repository is left alone, and with ``generation`` only that generation
        is failed (a newer submission is not failed by an old job). One conditional
        UPDATE: a concurrent re-submission (which bumps the generation) or completion
        either happened before it, and the row does not match, or after it, and wins.
        """
        qs = Repository.objects.filter(pk=self.pk)
        if generation is not None:
            qs = qs.filter(generation=generation)
        now = timezone.now()
        updated = qs.exclude(status=self.Status.READY).update(
            status=self.Status.FAILED, error=reason[:2000], updated_at=now
        )
        if updated:
            self.status, self.error, self.updated_at = self.Status.FAILED, reason[:2000], now
        return bool(updated)


class Chunk(models.Model):
    """A planned slice of one repository's history for one analyzer fingerprint.

    Boundaries are content-defined (``dashboard.chunks``), so re-planning the same
    pending commits yields the same keys and therefore the same job ids.
    """

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="chunks")
    fingerprint = models.CharField(max_length=64)
    #: ``{first_sha}..{last_sha}``, or the sha of a single-commit chunk.
    key = models.CharField(max_length=100)
    shas = models.TextField()
    size = models.IntegerField()
    position = models.IntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    token = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint", "key"], name="chunk_repo_fp_key_unique"
            )
        ]
        indexes = [models.Index(fields=["repository", "fingerprint", "state"])]

    def sha_list(self) -> list[str]:
        return self.shas.split()

    def lock_key(self) -> str:
        return lockkeys.chunk(self.repository_id, self.key)

    def job_id(self) -> str:
        # RQ ids allow letters, digits, "-" and "_" only: "first..last" becomes "first-last".
        return f"analyze-{self.repository_id}-{self.fingerprint[:12]}-{self.key.replace('..', '-')}"


class Commit(models.Model):
    """One analysed commit (DESIGN §3), stored once per (repository, sha, fingerprint)."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="commits")
    fingerprint = models.CharField(max_length=64)
    sha = models.CharField(max_length=40)
    parents = models.TextField(blank=True, default="")  # git has no limit: Linux has 66
    author_name = models.CharField(max_length=512)
    author_email = models.CharField(max_length=512)
    author_canonical_name = models.CharField(max_length=512)
    author_canonical_email = models.CharField(max_length=512)
    authored_at = models.DateTimeField()
    author_tz = models.SmallIntegerField(default=0)  # UTC offset in minutes
    committer_name = models.CharField(max_length=512)
    committer_email = models.CharField(max_length=512)
    committed_at = models.DateTimeField()
    committer_tz = models.SmallIntegerField(default=0)
    subject = models.TextField()
    is_merge = models.BooleanField(default=False)
    files_changed = models.IntegerField(default=0)
    insertions = models.IntegerField(default=0)
    deletions = models.IntegerField(default=0)
    #: Fencing token of the chunk lock that wrote this row.
    token = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint", "sha"], name="commit_repo_fp_sha_unique"
            )
        ]
        indexes = [
            # Keyset pagination: newest first, ties broken by id.
            models.Index(
                fields=["repository", "fingerprint", "-committed_at", "-id"],
                name="commit_page_idx",
            )
        ]

    def parent_list(self) -> list[str]:
        return self.parents.split()


class FileChange(models.Model):
    """One file of one commit's first-parent diff (DESIGN §3)."""

    commit = models.ForeignKey(Commit, on_delete=models.CASCADE, related_name="files")
    #: Denormalised so per-repository aggregates need no join.
    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    path = models.TextField()
    added = models.IntegerField(default=0)
    deleted = models.IntegerField(default=0)
    binary = models.BooleanField(default=False)
    language = models.CharField(max_length=40, blank=True, default="")

    class Meta:
        indexes = [
            # Hotspots and languages group from these indexes without reading rows.
            models.Index(
                fields=["repository", "fingerprint", "path", "added", "deleted"],
                name="file_repo_fp_path_idx",
            ),
            models.Index(
                fields=["repository", "fingerprint", "language", "added", "deleted"],
                name="file_repo_fp_lang_idx",
            ),
        ]


class Summary(models.Model):
    """Cached aggregates of one repository for one fingerprint, valid while
    ``commits`` equals the number of stored commits."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    commits = models.IntegerField()
    data = models.JSONField()
    computed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint"], name="summary_repo_fp_unique"
            )
        ]


class FenceToken(models.Model):
    """The newest fencing token issued for one lock resource (DESIGN §4)."""

    resource = models.CharField(max_length=255, unique=True)
    token = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)


class JobRun(models.Model):
    """One logical job (a sync generation, or one chunk for one fingerprint).

    The database is the source of truth; RQ is only the transport. Every execution is
    a ``JobAttempt``; the RQ id of attempt n is ``{job_id}-a{n}``, so a redelivery of
    the same attempt is recognised and a retry never collides with its predecessor.
    """

    class Kind(models.TextChoices):
        SYNC = "sync"
        ANALYZE = "analyze"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"  # an attempt failed; the next one is scheduled
        DEAD = "dead"  # in the dead-letter queue
        DISCARDED = "discarded"  # dead, and an operator decided not to retry

    job_id = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    queue = models.CharField(max_length=100)
    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="runs")
    chunk = models.ForeignKey(Chunk, null=True, blank=True, on_delete=models.CASCADE)
    generation = models.IntegerField(default=0)
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    #: Attempts started in total; ``attempts - budget_base`` counts against the budget.
    attempts = models.IntegerField(default=0)
    budget_base = models.IntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True, default="")
    host = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    version = models.CharField(max_length=64, blank=True, default="")
    lock_key = models.CharField(max_length=255, blank=True, default="")
    token = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    #: Root cause of the last failure: type + normalised message + top frame.
    cause_key = models.CharField(max_length=32, blank=True, default="", db_index=True)
    cause = models.CharField(max_length=500, blank=True, default="")
    enqueued_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    lock_acquired_at = models.DateTimeField(null=True, blank=True)
    fetched_at = models.DateTimeField(null=True, blank=True)
    analysed_at = models.DateTimeField(null=True, blank=True)
    written_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["state", "kind"]),
            # Covers the DLQ grouping (count, first/last seen, repositories, versions)
            # so 100,000 dead letters are grouped from the index alone.
            models.Index(
                fields=["state", "cause_key", "finished_at", "repository", "fingerprint"],
                name="jobrun_dead_cause_idx",
            ),
        ]
        permissions = [
            ("retry_jobrun", "Can retry dead jobs"),
            ("discard_jobrun", "Can discard dead jobs"),
            ("force_release_lock", "Can force-release a lock"),
            ("pause_queue", "Can pause and resume queues"),
        ]

    def rq_id(self, attempt: int | None = None) -> str:
        return f"{self.job_id}-a{attempt if attempt is not None else self.attempts + 1}"

    @property
    def budget_used(self) -> int:
        return self.attempts - self.budget_base


class JobAttempt(models.Model):
    """One execution of a ``JobRun``: who ran it, how it ended, why."""

    class Outcome(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CRASHED = "crashed"  # the worker died (SIGKILL, OOM, host loss)
        DEFERRED = "deferred"  # the lock was held by another job: waited, not counted

    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.IntegerField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    worker = models.CharField(max_length=200, blank=True, default="")
    host = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    version = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    #: The attempt's trace (``dashboard.traces``): ``[{name, start, end, attrs}]``, epoch
    #: seconds, in the order the spans began, the attempt's own span last. NULL for rows
    #: written without it (raw inserts, rows from before traces): no spans.
    spans = models.JSONField(default=list, blank=True, null=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_run_number_unique")
        ]
        ordering = ["run", "number"]
        indexes = [
            # The operations view's one-hour windows (rates, series, contention).
            models.Index(fields=["started_at", "outcome"], name="attempt_started_idx"),
            models.Index(fields=["finished_at", "outcome"], name="attempt_finished_idx"),
        ]


class WorkerBeat(models.Model):
    """A worker process's heartbeat, in the database so it survives a Redis flush."""

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    version = models.CharField(max_length=64, blank=True, default="")
    queues = models.CharField(max_length=500, blank=True, default="")
    current_run = models.ForeignKey(JobRun, null=True, blank=True, on_delete=models.SET_NULL)
    #: Resident memory of the worker and its work horse(s), bytes, at the last beat.
    rss = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)


class BulkAction(models.Model):
    """A tracked background operation over many dead letters (retry or discard)."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    kind = models.CharField(max_length=16)  # retry | discard
    selector = models.JSONField()  # {"group": key} | {"all": true} | {"runs": [...]}
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    total = models.IntegerField(default=0)
    done = models.IntegerField(default=0)
    actor = models.CharField(max_length=150, blank=True, default="")
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)


class QueueSample(models.Model):
    """A queue's backlog at one moment (the overview's one-hour backlog chart)."""

    queue = models.CharField(max_length=100)
    at = models.DateTimeField(db_index=True)
    backlog = models.IntegerField()
    running = models.IntegerField(default=0)


class AuditEntry(models.Model):
    """Who did what to what, when, and how it ended."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=500)
    outcome = models.CharField(max_length=500)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"


class ApiToken(models.Model):
    """A bearer token for the JSON API; only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def issue(cls, user: object) -> tuple[ApiToken, str]:
        raw = "gw_" + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, digest=cls.hash(raw), prefix=raw[:10])
        return token, raw


# ---------------------------------------------------------------------------- rollouts (DESIGN §7)


class AnalyzerVersion(models.Model):
    """One analyzer version (code version + config) of one logical queue.

    State changes go through ``dashboard.rollouts.do_transition`` only; the constraints
    below repeat its invariants so that even a raw ORM write cannot break them.
    """

    class State(models.TextChoices):
        REGISTERED = "registered"
        WARMING = "warming"
        WARM_FAILED = "warm_failed"
        VERIFIED = "verified"
        RAMPING = "ramping"
        CURRENT = "current"
        DRAINING = "draining"
        DRAINED = "drained"
        RETIRED = "retired"

    #: The logical queue (``analysis``); the physical one is ``{queue}@{fingerprint[:8]}``.
    queue = models.CharField(max_length=100, default="analysis")
    fingerprint = models.CharField(max_length=64)
    code_version = models.CharField(max_length=64)
    #: The normalised analyzer config the fingerprint was computed from.
    config = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices, default=State.REGISTERED)
    #: Share of new work routed here; non-zero only while ``ramping``.
    ramp_percent = models.PositiveSmallIntegerField(default=0)
    #: Set when the warming gate passed: routing never reaches a version without it.
    verified_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "fingerprint"], name="analyzerversion_queue_fp_unique"
            ),
            models.UniqueConstraint(
                fields=["queue"],
                condition=models.Q(state="current"),
                name="analyzerversion_one_current_per_queue",
            ),
            models.UniqueConstraint(
                fields=["queue"],
                condition=models.Q(state="ramping"),
                name="analyzerversion_one_ramping_per_queue",
            ),
            models.CheckConstraint(
                condition=models.Q(ramp_percent__gte=0, ramp_percent__lte=100),
                name="analyzerversion_ramp_0_100",
            ),
            models.CheckConstraint(
                condition=models.Q(state="ramping") | models.Q(ramp_percent=0),
                name="analyzerversion_ramp_only_when_ramping",
            ),
            models.CheckConstraint(
                condition=~models.Q(state__in=["verified", "ramping"])
                | models.Q(verified_at__isnull=False),
                name="analyzerversion_routable_only_when_verified",
            ),
        ]
        ordering = ["queue", "-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.queue}@{self.fingerprint[:12]} ({self.state})"

    @property
    def fp12(self) -> str:
        return self.fingerprint[:12]


class Rollout(models.Model):
    """One attempt to bring a version live on a queue; owns the queue's deploy lock.

    ``lock_holder``/``lock_token``/``lock_since``/``heartbeat_at`` describe the driver
    that holds ``locks:queue:{queue}:deploy`` (Redlock + fencing token); a newer token
    (takeover) makes every routing change presenting the older one fail.
    """

    class State(models.TextChoices):
        PENDING = "pending"  # created, its driver has not taken the deploy lock yet
        ACTIVE = "active"  # lock held; the version's state says where it is
        ROLLING_BACK = "rolling_back"  # routed back; waiting for the bad version to drain
        COMPLETED = "completed"
        ROLLED_BACK = "rolled_back"
        FAILED = "failed"
        ABORTED = "aborted"

    ACTIVE_STATES = ("pending", "active", "rolling_back")

    queue = models.CharField(max_length=100, default="analysis")
    version = models.ForeignKey(AnalyzerVersion, on_delete=models.PROTECT, related_name="rollouts")
    previous = models.ForeignKey(
        AnalyzerVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    #: Ramp percentages, e.g. ``[10, 50, 100]``; ``step_index`` is the one applied last.
    steps = models.JSONField(default=list)
    step_index = models.SmallIntegerField(default=-1)
    step_started_at = models.DateTimeField(null=True, blank=True)
    auto = models.BooleanField(default=False)
    #: Driver knobs: ``step_pause`` (s between automatic steps), ``min_samples`` (canary
    #: attempts before a health verdict), ``warm_timeout`` (s before warming gives up).
    options = models.JSONField(default=dict)
    started_by = models.CharField(max_length=150)
    lock_holder = models.CharField(max_length=255, blank=True, default="")
    lock_token = models.BigIntegerField(null=True, blank=True)
    lock_since = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    #: An operator's request to the driver: ``{"action": "promote", "actor": ..., "id": n}``.
    pending_action = models.JSONField(null=True, blank=True)
    #: What to warm: ``{"repositories": n, "commits_per_repository": k, "threshold": f,
    #: "items": [[repo_id, [sha, ...]], ...]}``.
    warm_set = models.JSONField(default=dict)
    verdict = models.JSONField(default=dict)
    diff = models.JSONField(default=dict)
    outcome = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue"],
                condition=models.Q(state__in=["pending", "active", "rolling_back"]),
                name="rollout_one_active_per_queue",
            )
        ]
        ordering = ["-created_at", "-id"]
        permissions = [
            ("start_rollout", "Can start a rollout"),
            ("rollback_rollout", "Can roll back, abort or take over a rollout"),
        ]

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES


class RolloutEvent(models.Model):
    """One step of a rollout: a version transition, a lock event, a verdict, an action.

    The rollout page's timeline and the release checklist are both read from here.
    """

    rollout = models.ForeignKey(
        Rollout, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    version = models.ForeignKey(
        AnalyzerVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    #: ``transition`` (of ``version``), ``rollout`` (of the rollout's own state),
    #: ``lock.taken``, ``lock.released``, ``lock.lost``, ``takeover``, ``verdict``,
    #: ``diff``, ``action.requested``, ``drain.check``, ``note``.
    action = models.CharField(max_length=40)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    actor = models.CharField(max_length=150)
    reason = models.TextField(blank=True, default="")
    token = models.BigIntegerField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["at", "id"]


class RepositoryView(models.Model):
    """Page views of one repository per day: what "most viewed" means for the warm set."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="page_views")
    day = models.DateField()
    views = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["repository", "day"], name="repositoryview_day_unique")
        ]
