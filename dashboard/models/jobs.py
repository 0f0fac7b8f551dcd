"""Jobs: runs and their attempts, fencing tokens, worker heartbeats, bulk actions,
queue samples."""

from __future__ import annotations

from django.db import models

from dashboard.models.repositories import Chunk, Repository


class FenceToken(models.Model):
    """The newest fencing token issued for one lock resource (docs/locks.md)."""

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
    #: Kept in the database by the dispatcher, not in RQ: its repository already has its
    #: fair share of runs waiting in this queue (docs/scheduling.md#fairness). Only a
    #: ``queued`` run is parked; ``runs.release_parked`` enqueues it when a slot frees.
    parked = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["state", "kind"]),
            models.Index(
                fields=["repository", "queue", "state", "parked"], name="jobrun_dispatch_idx"
            ),
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
    #: The attempt's trace (``dashboard.observability.traces``): ``[{name, start, end, attrs}]``,
    #: epoch seconds, in the order the spans began, the attempt's own span last. NULL for rows
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
    #: The worker's analysis code version (``workers.analysis.CODE_VERSION``): which
    #: versions it can load (docs/rollouts.md#code-rollouts-bluegreen).
    code_version = models.CharField(max_length=64, blank=True, default="")
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
