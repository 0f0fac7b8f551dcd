"""Rollouts (docs/rollouts.md): analyzer versions, rollouts and their timelines."""

from __future__ import annotations

from django.db import models


class AnalyzerVersion(models.Model):
    """One analyzer version (code version + config) of one logical queue.

    State changes go through ``dashboard.rollouts.start.do_transition`` only; the constraints
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
    #: What the version's code declares it changes in the stored results against the code
    #: before it (``workers.analysis.DECLARED_EFFECT``), as its workers reported it when
    #: gitward learned the code; the result contract reads it (docs/rollouts.md#result-contract).
    declared_effect = models.JSONField(default=list, blank=True)
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
    #: The result contract's state (docs/rollouts.md#result-contract): what the change may
    #: do, what was checked, and the commits and fields it could not explain.
    contract = models.JSONField(default=dict, blank=True)
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


class FreezeSwitch(models.Model):
    """The global stop-the-line switch (docs/rollouts.md#freeze-windows): one row (pk 1).

    While ``on``, starting, ramping and promoting rollouts are refused; rollback and abort
    stay allowed. Flipped by ``dashboard.rollouts.freeze.set_stop_the_line`` (audited).
    """

    on = models.BooleanField(default=False)
    reason = models.TextField(blank=True, default="")
    actor = models.CharField(max_length=150, blank=True, default="")
    changed_at = models.DateTimeField(null=True, blank=True)


class RolloutNotification(models.Model):
    """The notification outbox (docs/rollouts.md#notifications): one row per timeline event
    worth announcing and per configured webhook endpoint, written in the same transaction as
    the event, so a committed transition is never left unannounced and a rolled-back one is
    never announced. ``dashboard.rollouts.notifications`` delivers them in ``id`` order per
    rollout and endpoint."""

    event = models.ForeignKey(RolloutEvent, on_delete=models.CASCADE, related_name="notifications")
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="notifications")
    #: The endpoint's ``name`` in ``GITWARD_ROLLOUT_WEBHOOKS``.
    endpoint = models.CharField(max_length=100)
    attempts = models.PositiveIntegerField(default=0)
    #: Not before this; a sender claims a row by moving it forward (a lease).
    next_attempt_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["endpoint", "rollout", "id"],
                condition=models.Q(delivered_at__isnull=True),
                name="notification_undelivered",
            )
        ]


class RolloutMeasurement(models.Model):
    """One measurement of a ramp step (docs/rollouts.md#checks-and-gates): an operator-defined
    check's PromQL value against its conditions, or a gate webhook's answer. Written by
    ``dashboard.rollouts.checks``; the step's verdict is decided from these rows."""

    class Kind(models.TextChoices):
        CHECK = "check"
        GATE = "gate"

    class Outcome(models.TextChoices):
        SUCCESS = "success"
        FAILURE = "failure"
        INCONCLUSIVE = "inconclusive"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="measurements")
    step_index = models.SmallIntegerField()
    percent = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    #: The check's or gate's ``name``.
    name = models.CharField(max_length=100)
    #: The check's PromQL query, or the gate's URL.
    target = models.TextField(blank=True, default="")
    #: The conditions the value was judged by (``success: result < 0.05``), or the gate's policy.
    condition = models.TextField(blank=True, default="")
    value = models.FloatField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    #: Recorded only: a dry-run check never blocks a step.
    dry_run = models.BooleanField(default=False)
    #: Why (``HTTP 409: not now``, ``empty vector``, ``timed out``), shown beside the outcome.
    message = models.TextField(blank=True, default="")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["rollout", "step_index", "name"], name="measurement_step")]


class RolloutPin(models.Model):
    """A repository an operator pinned to a rollout's ramping version
    (docs/rollouts.md#pinning): ``dashboard.versions.canary.version_for`` routes it to that
    version whatever its hash bucket, while the rollout is active and its version ramping."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="pins")
    repository = models.ForeignKey(
        "dashboard.Repository", on_delete=models.CASCADE, related_name="rollout_pins"
    )
    pinned_by = models.CharField(max_length=150)
    pinned_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "repository"], name="pin_once_per_rollout")
        ]
