from __future__ import annotations

from django.contrib import admin

from dashboard.models import (
    ApiToken,
    AuditEntry,
    BulkAction,
    Chunk,
    FairGroup,
    JobAttempt,
    JobRun,
    Repository,
    WorkerBeat,
)


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin):
    list_display = ("id", "url", "branch", "status", "commits_total", "fair_group", "updated_at")
    list_filter = ("status",)
    search_fields = ("url", "fair_group")


@admin.register(FairGroup)
class FairGroupAdmin(admin.ModelAdmin):
    """Group weights (docs/scheduling.md#group-weights); ``manage.py fair_group`` too."""

    list_display = ("name", "weight")
    search_fields = ("name",)


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    list_display = ("id", "repository", "key", "size", "state", "token")
    list_filter = ("state",)


class AttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("number", "outcome", "worker", "host", "pid", "version", "error",
                       "traceback", "started_at", "finished_at")  # fmt: skip


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):
    """Job runs; filter ``state = dead`` for the dead-letter queue, grouped by cause."""

    list_display = ("job_id", "kind", "state", "attempts", "cause", "worker", "token",
                    "finished_at")  # fmt: skip
    list_filter = ("state", "kind", "cause_key")
    search_fields = ("job_id", "cause", "error")
    inlines = [AttemptInline]


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor", "action", "target", "outcome")
    list_filter = ("action", "actor")
    search_fields = ("target", "outcome")

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False  # the audit log is append-only

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(WorkerBeat)
class WorkerBeatAdmin(admin.ModelAdmin):
    list_display = ("name", "host", "pid", "version", "current_run", "last_seen", "stopped_at")


@admin.register(BulkAction)
class BulkActionAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "state", "done", "total", "actor", "created_at")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "created_at", "last_used_at")
    readonly_fields = ("digest",)
