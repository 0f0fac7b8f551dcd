"""Repositories and what their analysis stores: chunks, commits, file changes,
summaries, page views."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from workers import locks
from workers.remotes import redact


class Repository(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        SYNCING = "syncing"
        ANALYZING = "analyzing"
        READY = "ready"
        FAILED = "failed"

    #: Normalised URL (``workers.remotes.parse``); with ``branch`` it identifies the repository.
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
    #: The push webhook's secret ("" none issued: webhooks off). Stored as is: verifying an
    #: HMAC needs the secret itself (docs/security.md#push-webhook-secrets).
    hook_secret = models.CharField(max_length=100, blank=True, default="")
    #: When the last verified push webhook arrived (docs/api.md#push-webhooks).
    pushed_at = models.DateTimeField(null=True, blank=True)
    #: The scheduled refresh (docs/lifecycle.md#scheduled-refresh): when it is next due,
    #: its current interval (seconds), the head when last scheduled, failures in a row.
    next_refresh_at = models.DateTimeField(null=True, blank=True, db_index=True)
    refresh_interval = models.FloatField(default=0.0)
    refresh_head = models.CharField(max_length=40, blank=True, default="")
    refresh_failures = models.IntegerField(default=0)
    #: The scheduling class of its current generation (docs/scheduling.md#classes):
    #: 0 interactive (a submission, a re-analyse), 1 scheduled refresh, 2 catch-up.
    priority = models.SmallIntegerField(default=0)
    #: How many of its runs may wait in one RQ queue at once (docs/scheduling.md#weights);
    #: None: ``GITWARD_FAIR_WEIGHT``.
    fair_weight = models.PositiveSmallIntegerField(null=True, blank=True)
    #: Its fairness group (docs/scheduling.md#group-weights); "" the owner its URL names.
    fair_group = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["url", "branch"], name="repository_url_branch_unique")
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def shown_url(self) -> str:
        """``url`` as pages, the API and events show it: userinfo redacted. Submissions
        refuse URL credentials, but a row from before that check may hold one."""
        return redact(self.url)

    @property
    def name(self) -> str:
        return self.name_of(self.url)

    @staticmethod
    def name_of(url: str) -> str:
        """The short name pages and live events show (``flask`` for ``…/flask.git``):
        taken from the redacted URL, so a credential never becomes a name."""
        shown = redact(url)
        tail = shown.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        return tail.removesuffix(".git") or shown

    @property
    def is_active(self) -> bool:
        return self.status in {self.Status.QUEUED, self.Status.SYNCING, self.Status.ANALYZING}

    def sync_job_id(self) -> str:
        return f"sync-{self.pk}-g{self.generation}"

    def lock_key(self) -> str:
        """The mirror lock: held by every write to this repository's mirror."""
        return locks.mirror(self.pk)

    def fail(
        self, reason: str, *, generation: int | None = None, fingerprint: str | None = None
    ) -> bool:
        """Mark the repository failed with a readable reason; True if it changed.

        A ready repository is left alone, and with ``generation`` only that generation
        is failed (a newer submission is not failed by an old job); with ``fingerprint``
        only a repository whose last plan was that version's (a chunk of another version
        never fails it: docs/lifecycle.md#statuses). One conditional UPDATE: a concurrent
        re-submission (which bumps the generation), re-plan or completion either
        happened before it, and the row does not match, or after it, and wins.
        """
        qs = Repository.objects.filter(pk=self.pk)
        if generation is not None:
            qs = qs.filter(generation=generation)
        if fingerprint is not None:
            qs = qs.filter(fingerprint=fingerprint)
        now = timezone.now()
        updated = qs.exclude(status=self.Status.READY).update(
            status=self.Status.FAILED, error=reason[:2000], updated_at=now
        )
        if updated:
            self.status, self.error, self.updated_at = self.Status.FAILED, reason[:2000], now
        return bool(updated)


class FairGroup(models.Model):
    """The fairness weight of a group of repositories (docs/scheduling.md#group-weights):
    each repository of the group without a weight of its own may have ``weight`` analyze
    runs waiting in one RQ queue at once."""

    #: ``host/owner`` (``github.com/pallets``), a local parent directory, or a name given
    #: to repositories by their ``fair_group``.
    name = models.CharField(max_length=200, unique=True)
    weight = models.PositiveSmallIntegerField()

    def __str__(self) -> str:
        return f"{self.name} (weight {self.weight})"


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
        #: A rewritten history left one of its commits unreachable from the head: the
        #: chunk is never analysed (again); its commits that are still reachable are
        #: planned anew (``chunk_plans._drop_unreachable``).
        DROPPED = "dropped"

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
        return locks.chunk(self.repository_id, self.key)

    def job_id(self) -> str:
        # RQ ids allow letters, digits, "-" and "_" only: "first..last" becomes "first-last".
        return f"analyze-{self.repository_id}-{self.fingerprint[:12]}-{self.key.replace('..', '-')}"


class Commit(models.Model):
    """One analysed commit (docs/analysis.md#analysis-semantics), stored once per
    (repository, sha, fingerprint)."""

    #: No index of its own: the unique (repository, fingerprint, sha) index and the page
    #: index both lead with it, so every lookup by repository uses one of those, and a
    #: third B-tree would only cost every chunk write an insertion per commit.
    repository = models.ForeignKey(
        Repository, on_delete=models.CASCADE, related_name="commits", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    sha = models.CharField(max_length=40)
    parents = models.TextField(blank=True, default="")  # git has no limit: Linux has 66
    #: Identities are stored whole, as git keeps them (git has no length limit).
    author_name = models.TextField()
    author_email = models.TextField()
    author_canonical_name = models.TextField()
    author_canonical_email = models.TextField()
    authored_at = models.DateTimeField()
    author_tz = models.SmallIntegerField(default=0)  # UTC offset in minutes
    committer_name = models.TextField()
    committer_email = models.TextField()
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


class CommitCount(models.Model):
    """How many commits are stored for one (repository, fingerprint): ``COUNT(*)`` of
    those ``Commit`` rows, kept on a row so no page scans a million index entries to
    show it (``dashboard.repositories.commit_counts``). Only ``write_chunk`` stores commits, and it
    adds what it inserted in the same transaction; only a plan after a rewritten history
    deletes some (those no longer reachable), and it subtracts them in its own
    transaction and adds them to ``pruned``."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    commits = models.BigIntegerField(default=0)
    #: Commits ever deleted because a rewrite made them unreachable: only grows, so a
    #: summary computed meanwhile can tell it may hold dropped commits.
    pruned = models.BigIntegerField(default=0, db_default=0)  # raw upserts omit it

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint"], name="commitcount_repo_fp_unique"
            )
        ]


class FileChange(models.Model):
    """One file of one commit's first-parent diff (docs/analysis.md#analysis-semantics)."""

    commit = models.ForeignKey(Commit, on_delete=models.CASCADE, related_name="files")
    #: Denormalised so per-repository aggregates need no join. No index of its own (like
    #: ``Commit.repository``): both composite indexes below lead with it. No database
    #: constraint either (migration 0011): the row's commit is constrained to exist, and
    #: the commit to its repository, so this one only re-checked what those do, once per
    #: file row at every chunk's commit (PostgreSQL's deferred trigger: ~145 ms of server
    #: time per 54,000 rows, as much as their COPY). ``write_chunk`` is the only writer and
    #: copies the commit's repository; deleting a repository still cascades here (Django's
    #: ``on_delete``).
    repository = models.ForeignKey(
        Repository,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
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


class CoAuthor(models.Model):
    """One ``Co-authored-by:`` trailer of one analysed commit, as the analysis read it
    (docs/analytics.md#co-authors): the name and e-mail written in the trailer. Versions
    analysed before the trailers were stored have none, and credit no co-author."""

    commit = models.ForeignKey(Commit, on_delete=models.CASCADE, related_name="co_authors")
    name = models.TextField(blank=True, default="")
    email = models.TextField()


class Summary(models.Model):
    """Cached aggregates of one repository for one fingerprint, valid while
    ``commits`` equals the number of stored commits (a plan that deletes commits a
    rewrite dropped deletes this row in its transaction)."""

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


class RepositoryView(models.Model):
    """Page views of one repository per day: what "most viewed" means for the warm set."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="page_views")
    day = models.DateField()
    views = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["repository", "day"], name="repositoryview_day_unique")
        ]


class Verification(models.Model):
    """The scheduled verifier's record for one repository and analyzer fingerprint
    (docs/analytics.md#verification): its last pass (what it sampled, the head it
    verified, every mismatch it found, naming the commit and field), its schedule and
    whether a pass is in flight, and whether the results are withheld for a mismatch.

    ``sampled_total`` and ``mismatches_total`` only grow: Prometheus counters."""

    class State(models.TextChoices):
        PENDING = "pending"  # never verified yet
        OK = "ok"
        MISMATCH = "mismatch"  # open: in the integrity group
        CLEARED = "cleared"  # a mismatch an admin cleared (or a re-analysis lifted)

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    generation = models.IntegerField(default=0)  # the repository's sync generation verified
    head = models.CharField(max_length=40, blank=True, default="")
    sampled = models.IntegerField(default=0)
    mismatch_count = models.IntegerField(default=0)
    mismatches = models.JSONField(default=list)  # [{sha, field, path, git, stored}], bounded
    totals = models.JSONField(default=dict)  # {stored, git}: the totals compared
    accepted = models.JSONField(default=list)  # "sha:path:field" keys an admin cleared
    withheld = models.BooleanField(default=False)
    checked_at = models.DateTimeField(null=True, blank=True)
    next_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)  # a pass in flight since
    cleared_by = models.CharField(max_length=150, blank=True, default="")
    cleared_at = models.DateTimeField(null=True, blank=True)
    sampled_total = models.BigIntegerField(default=0)
    mismatches_total = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint"], name="verification_repo_fp_unique"
            )
        ]
        indexes = [
            models.Index(fields=["state"], name="verification_state_idx"),  # the group
            # each reconciler round's due passes (docs/analytics.md#the-scheduled-verifier)
            models.Index(fields=["fingerprint", "next_at"], name="verification_due_idx"),
        ]


class MonthStamp(models.Model):
    """The version of one UTC calendar month of one (repository, fingerprint)'s stored
    commits (docs/analytics.md#performance): every write that adds or deletes commits
    of the month bumps ``version`` in its own transaction; ``aggregated`` is the version
    the month's ``MonthAggregate`` rows were computed at (null: none yet). The rows are
    current exactly when the two are equal."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    month = models.DateField()  # its first day
    version = models.BigIntegerField(default=0, db_default=0)  # raw upserts omit it
    aggregated = models.BigIntegerField(null=True, blank=True)
    #: On a January's stamp: the sum of its year's twelve month versions when the year's
    #: aggregates (``MonthAggregate.span`` 12) were computed. Versions only grow, so the
    #: year's rows are current exactly while the sum is unchanged.
    year_aggregated = models.BigIntegerField(null=True, blank=True)
    #: The same two records for the month's and the year's ``DirAggregate`` rows (kept
    #: apart: the file and the directory aggregates are computed by different views).
    dir_aggregated = models.BigIntegerField(null=True, blank=True)
    dir_year_aggregated = models.BigIntegerField(null=True, blank=True)
    #: As ``aggregated`` and ``year_aggregated``, for the ``AuthorMonth`` rows (computed
    #: apart: a view needing one kind does not compute the other).
    authors_aggregated = models.BigIntegerField(null=True, blank=True)
    authors_year_aggregated = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint", "month"], name="monthstamp_repo_fp_unique"
            )
        ]


class MonthAggregate(models.Model):
    """The non-merge file rows of one month (or one calendar year) of one (repository,
    fingerprint), summed per path and author (docs/analytics.md#performance): what the
    file views need of a whole month or year, kept with the path and the author's
    canonical identity so that a lens filters these rows as it filters the stored ones."""

    repository = models.ForeignKey(
        Repository, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    #: 1: the rows of ``month``; 12: of the calendar year ``month`` (a January) starts;
    #: 12 × 2^k (24, 48, 96, …): of the aligned block of 2^k years it starts, its year a
    #: multiple of 2^k (``coupling_aggregates.blocks``).
    span = models.SmallIntegerField(default=1)
    month = models.DateField()
    path = models.TextField()
    author_canonical_email = models.TextField()
    author_canonical_name = models.TextField()
    revisions = models.IntegerField()
    added = models.BigIntegerField()
    deleted = models.BigIntegerField()
    last_at = models.DateTimeField()
    #: The file rows' language (the analyzer derives it from the path, so a path has one
    #: under a fingerprint; rows of another would be a row of their own): one author's
    #: languages read from these rows, not from a stored row per path.
    language = models.CharField(max_length=40, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(
                fields=["repository", "fingerprint", "span", "month"],
                name="monthagg_repo_fp_month_idx",
            ),
            # One file's sums (the one-file view, docs/analytics.md#performance).
            models.Index(
                fields=["repository", "fingerprint", "path", "span", "month"],
                name="monthagg_repo_fp_path_idx",
            ),
        ]


class AuthorMonth(models.Model):
    """The non-merge commits of one month (or one calendar year) of one (repository,
    fingerprint), summed per author (docs/analytics.md#performance): commits (each
    once), their lines as stored, first and last committer date. Kept with the author's
    canonical identity so that the ``bots`` lens and the identity map apply to these rows
    as to the stored ones; current while ``MonthStamp.authors_aggregated`` (or, for a
    year, ``authors_year_aggregated``) is the version they were computed at."""

    repository = models.ForeignKey(
        Repository, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    #: 1: the commits of ``month``; 12: of the calendar year ``month`` (a January) starts.
    span = models.SmallIntegerField(default=1)
    month = models.DateField()
    author_canonical_email = models.TextField()
    author_canonical_name = models.TextField()
    commits = models.IntegerField()
    insertions = models.BigIntegerField()
    deletions = models.BigIntegerField()
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(
                fields=["repository", "fingerprint", "span", "month"],
                name="authormonth_repo_fp_month_idx",
            )
        ]


class AuthorWeek(models.Model):
    """The non-merge commits of one month of one (repository, fingerprint), summed per
    author and week (its Monday, UTC, as ``YYYY-MM-DD``; a week across two months has a
    row in each): what one author's page needs per week (docs/analytics.md#performance).
    Computed and kept current with the month's ``AuthorMonth`` rows."""

    repository = models.ForeignKey(
        Repository, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    month = models.DateField()
    week = models.CharField(max_length=10)
    author_canonical_email = models.TextField()
    author_canonical_name = models.TextField()
    commits = models.IntegerField()
    insertions = models.BigIntegerField()
    deletions = models.BigIntegerField()
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(
                fields=["repository", "fingerprint", "month"], name="authorweek_repo_fp_month_idx"
            )
        ]


class DirAggregate(models.Model):
    """The non-merge commits of one month (or one calendar year) of one (repository,
    fingerprint), per directory at each depth and author (docs/analytics.md#performance):
    ``revisions`` counts the distinct commits that changed a file in the directory (a
    commit changing two of its files counts once), which sums of ``MonthAggregate`` rows
    cannot give. Depth 0 (``dir`` empty) holds every commit of the author, with or
    without file rows: the authors' names of the ownership view."""

    repository = models.ForeignKey(
        Repository, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    #: 1: the commits of ``month``; 12: of the calendar year ``month`` (a January) starts.
    span = models.SmallIntegerField(default=1)
    month = models.DateField()
    depth = models.SmallIntegerField()
    dir = models.TextField()
    author_canonical_email = models.TextField()
    author_canonical_name = models.TextField()
    revisions = models.IntegerField()
    added = models.BigIntegerField()
    deleted = models.BigIntegerField()
    last_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(
                fields=["repository", "fingerprint", "depth", "span", "month"],
                name="diragg_repo_fp_depth_idx",
            )
        ]


class CouplingAggregate(models.Model):
    """The change-coupling counts of one month (or one calendar year) of one (repository,
    fingerprint) (docs/analytics.md#performance): for ``depth`` 0 the files, for ``depth``
    N the directories N levels deep; with ``eb`` null, the revisions that changed ``ea``;
    else those that changed both ``ea`` and ``eb`` (``ea`` < ``eb``). Column ``leK`` counts
    the revisions of at most K files (K = 2 … ``coupling_aggregates.CAP``), so a
    ``max_changeset_size`` up to it reads one column: one row per pair and period, not
    one per change-set size."""

    repository = models.ForeignKey(
        Repository, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    fingerprint = models.CharField(max_length=64)
    depth = models.SmallIntegerField()
    #: 1: the rows of ``month``; 12: of the calendar year ``month`` (a January) starts;
    #: 12 × 2^k (24, 48, 96, …): of the aligned block of 2^k years it starts, its year a
    #: multiple of 2^k (``coupling_aggregates.blocks``).
    span = models.SmallIntegerField(default=1)
    month = models.DateField()
    ea = models.TextField()
    eb = models.TextField(null=True, blank=True)
    le2 = models.IntegerField()
    le3 = models.IntegerField()
    le4 = models.IntegerField()
    le5 = models.IntegerField()
    le6 = models.IntegerField()
    le7 = models.IntegerField()
    le8 = models.IntegerField()
    le9 = models.IntegerField()
    le10 = models.IntegerField()
    le11 = models.IntegerField()
    le12 = models.IntegerField()
    le13 = models.IntegerField()
    le14 = models.IntegerField()
    le15 = models.IntegerField()
    le16 = models.IntegerField()
    le17 = models.IntegerField()
    le18 = models.IntegerField()
    le19 = models.IntegerField()
    le20 = models.IntegerField()
    le21 = models.IntegerField()
    le22 = models.IntegerField()
    le23 = models.IntegerField()
    le24 = models.IntegerField()
    le25 = models.IntegerField()
    le26 = models.IntegerField()
    le27 = models.IntegerField()
    le28 = models.IntegerField()
    le29 = models.IntegerField()
    le30 = models.IntegerField()

    class Meta:
        indexes = [
            models.Index(
                fields=["repository", "fingerprint", "depth", "span", "month"],
                name="couplingagg_repo_fp_month_idx",
            )
        ]


class CouplingBlockStamp(models.Model):
    """Which sum of ``MonthStamp`` versions one aligned block of years' ``CouplingAggregate``
    rows of one depth were computed at (``aggregated``): the sum over every month of the
    block, which changes when any of them is written, as a year's record does
    (docs/analytics.md#performance). ``span`` in months (24, 48, 96, …), ``month`` its first
    January."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    depth = models.SmallIntegerField()
    span = models.SmallIntegerField()
    month = models.DateField()
    aggregated = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint", "depth", "span", "month"],
                name="couplingblockstamp_unique",
            )
        ]


class CouplingStamp(models.Model):
    """Which ``MonthStamp`` version one month's ``CouplingAggregate`` rows of one depth
    were computed at (``aggregated``), and on a January the sum of its year's twelve
    versions the year's rows were (``year_aggregated``): the coupling's own record,
    beside the file aggregates' on ``MonthStamp`` (docs/analytics.md#performance)."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    fingerprint = models.CharField(max_length=64)
    month = models.DateField()
    depth = models.SmallIntegerField()
    aggregated = models.BigIntegerField(null=True, blank=True)
    year_aggregated = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "fingerprint", "month", "depth"],
                name="couplingstamp_repo_fp_unique",
            )
        ]
