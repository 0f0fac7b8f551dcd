from __future__ import annotations

from django.contrib import admin

from dashboard.models import ApiToken, Chunk, JobRun, Repository


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin):
    list_display = ("id", "url", "branch", "status", "commits_total", "updated_at")
    list_filter = ("status",)
    search_fields = ("url",)


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    list_display = ("id", "repository", "key", "size", "state", "token")
    list_filter = ("state",)


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):
    list_display = ("job_id", "kind", "state", "attempts", "worker", "token", "finished_at")
    list_filter = ("state", "kind")
    search_fields = ("job_id",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "created_at", "last_used_at")
    readonly_fields = ("digest",)
