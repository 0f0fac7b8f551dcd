from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import api, views

urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("repos/", views.repositories, name="repositories"),
    path("repos/<int:repo_id>/", views.repository, name="repository"),
    path("locks/", views.locks, name="locks"),
    path("workers/", views.workers, name="workers"),
    path("dead-letters/", views.dead_letters, name="dead-letters"),
    path("audit/", views.audit, name="audit"),
    path("runs/", views.runs, name="runs"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
    path("api/repos", api.repos, name="api-repos"),
    path("api/repos/<int:repo_id>", api.repo_detail, name="api-repo"),
    path("api/repos/<int:repo_id>/commits", api.repo_commits, name="api-repo-commits"),
    path("api/status", api.status, name="api-status"),
    path("metrics", api.metrics, name="metrics"),
    path("api/locks/release", api.lock_release, name="api-lock-release"),
    path("api/queues/pause", api.queue_pause, name="api-queue-pause"),
    path("api/queues/resume", api.queue_resume, name="api-queue-resume"),
    path("api/runs", api.runs, name="api-runs"),
    path("api/dlq", api.dlq, name="api-dlq"),
    path("api/dlq/retry", api.dlq_retry, name="api-dlq-retry"),
    path("api/dlq/discard", api.dlq_discard, name="api-dlq-discard"),
    path("api/dlq/<str:group>", api.dlq_group, name="api-dlq-group"),
    path("api/actions/<int:action_id>", api.bulk_action, name="api-action"),
    path("admin/", admin.site.urls),
]

handler404 = "dashboard.api.not_found"
