from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import api
from dashboard.web import analytics, commits, ops, probes, repositories, rollouts, runs

urlpatterns = [
    path("", ops.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("repos/", repositories.repositories, name="repositories"),
    path("repos/<id:repo_id>/", repositories.repository, name="repository"),
    path("repos/<id:repo_id>/commits/<str:sha>/", commits.commit, name="commit"),
    path(
        "repos/<id:repo_id>/analytics/<str:analysis>/",
        analytics.repository_analytics,
        name="repository-analytics",
    ),
    path("runs/<id:run_id>/", runs.run, name="run"),
    path("runs/job/<str:job_id>/", runs.run_by_job, name="run-by-job"),
    path("locks/", ops.locks, name="locks"),
    path("workers/", ops.workers, name="workers"),
    path("dead-letters/", ops.dead_letters, name="dead-letters"),
    path("rollouts/", rollouts.rollouts_index, name="rollouts"),
    path("rollouts/start/", rollouts.rollout_start, name="rollout-start"),
    path("rollouts/offers/", rollouts.rollout_offers, name="rollout-offers"),
    path("rollouts/freeze/", rollouts.rollouts_freeze, name="rollouts-freeze"),
    path(
        "rollouts/versions/<id:version_id>/retire/",
        rollouts.version_retire,
        name="version-retire",
    ),
    path("rollouts/<id:rollout_id>/", rollouts.rollout_detail, name="rollout"),
    path(
        "rollouts/<id:rollout_id>/checklist.md",
        rollouts.rollout_checklist_md,
        name="rollout-checklist",
    ),
    path("rollouts/<id:rollout_id>/pins/", rollouts.rollout_pins, name="rollout-pins"),
    path("rollouts/<id:rollout_id>/<str:verb>/", rollouts.rollout_action, name="rollout-action"),
    path("audit/", ops.audit, name="audit"),
    path("runs/", runs.runs, name="runs"),
    path("favicon.ico", probes.favicon, name="favicon"),
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("api/openapi.json", api.openapi_document, name="api-openapi"),
    path("api/repos", api.repos, name="api-repos"),
    path("api/repos/<id:repo_id>", api.repo_detail, name="api-repo"),
    path("api/repos/<id:repo_id>/commits", api.repo_commits, name="api-repo-commits"),
    path(
        "api/repos/<id:repo_id>/commits/<str:sha>",
        api.commit_detail,
        name="api-repo-commit",
    ),
    path("api/repos/<id:repo_id>/reanalyse", api.repo_reanalyse, name="api-repo-reanalyse"),
    path("api/repos/<id:repo_id>/cancel", api.repo_cancel, name="api-repo-cancel"),
    path("api/repos/<id:repo_id>/hook-secret", api.repo_hook_secret, name="api-repo-hook-secret"),
    path("api/hooks/push/<id:repo_id>", api.push_hook, name="api-hook-push"),
    path("api/repos/<id:repo_id>/hotspots", api.repo_hotspots, name="api-repo-hotspots"),
    path("api/repos/<id:repo_id>/coupling", api.repo_coupling, name="api-repo-coupling"),
    path("api/repos/<id:repo_id>/ownership", api.repo_ownership, name="api-repo-ownership"),
    path("api/repos/<id:repo_id>/age", api.repo_age, name="api-repo-age"),
    path("api/repos/<id:repo_id>/authors", api.repo_authors, name="api-repo-authors"),
    path("api/repos/<id:repo_id>/authors/<str:identity>", api.repo_author, name="api-repo-author"),
    path("api/repos/<id:repo_id>/files", api.repo_files, name="api-repo-files"),
    path("api/repos/<id:repo_id>/export", api.repo_export, name="api-repo-export"),
    path("api/export", api.export, name="api-export"),
    path("api/status", api.status, name="api-status"),
    path("metrics", api.metrics, name="metrics"),
    path("api/locks/release", api.lock_release, name="api-lock-release"),
    path("api/queues/pause", api.queue_pause, name="api-queue-pause"),
    path("api/queues/resume", api.queue_resume, name="api-queue-resume"),
    path("api/runs", api.runs, name="api-runs"),
    path("api/runs/cancel", api.runs_cancel, name="api-runs-cancel"),
    path("api/rollouts", api.rollouts_collection, name="api-rollouts"),
    path("api/rollouts/freeze", api.rollouts_freeze, name="api-rollouts-freeze"),
    path("api/rollouts/<id:rollout_id>", api.rollout_detail, name="api-rollout"),
    path("api/rollouts/<id:rollout_id>/pin", api.rollout_pin, name="api-rollout-pin"),
    path("api/rollouts/<id:rollout_id>/unpin", api.rollout_unpin, name="api-rollout-unpin"),
    path(
        "api/rollouts/<id:rollout_id>/<str:action>", api.rollout_action, name="api-rollout-action"
    ),
    path("api/versions", api.versions_collection, name="api-versions"),
    path("api/versions/<str:fingerprint>/retire", api.version_retire, name="api-version-retire"),
    path("api/runs/<id:run_id>", api.run_detail, name="api-run"),
    path("api/runs/<id:run_id>/cancel", api.run_cancel, name="api-run-cancel"),
    path("api/integrity", api.integrity, name="api-integrity"),
    path(
        "api/integrity/<id:verification_id>/clear",
        api.integrity_clear,
        name="api-integrity-clear",
    ),
    path("api/dlq", api.dlq, name="api-dlq"),
    path("api/dlq/retry", api.dlq_retry, name="api-dlq-retry"),
    path("api/dlq/discard", api.dlq_discard, name="api-dlq-discard"),
    path("api/dlq/<str:group>", api.dlq_group, name="api-dlq-group"),
    path("api/actions/<id:action_id>", api.bulk_action, name="api-action"),
    path("admin/", admin.site.urls),
]

handler404 = "dashboard.api.not_found"
#: A database refusing connections is a 503, anything else a plain 500 (no traceback).
handler500 = "dashboard.middleware.server_error"
