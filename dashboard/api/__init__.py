"""JSON API (docs/api.md): session or ``Authorization: Bearer <token>``.

One module per resource, each a thin adapter over the domain modules; ``endpoint``
holds what they share (the ``api_view`` decorator: authentication, method, rate limit,
JSON errors).  ``dashboard/urls.py`` routes to the names re-exported here.
"""

from __future__ import annotations

from dashboard.api.analytics import (
    export,
    repo_age,
    repo_author,
    repo_authors,
    repo_coupling,
    repo_export,
    repo_files,
    repo_hotspots,
    repo_ownership,
)
from dashboard.api.commits import commit_detail, repo_reanalyse
from dashboard.api.dlq import bulk_action, dlq, dlq_discard, dlq_group, dlq_retry
from dashboard.api.endpoint import not_found
from dashboard.api.hooks import push_hook, repo_hook_secret
from dashboard.api.integrity import integrity, integrity_clear
from dashboard.api.metrics import metrics
from dashboard.api.openapi import openapi_document
from dashboard.api.operations import lock_release, queue_pause, queue_resume, status
from dashboard.api.repos import repo_cancel, repo_commits, repo_detail, repos
from dashboard.api.rollouts import (
    rollout_action,
    rollout_detail,
    rollout_pin,
    rollout_unpin,
    rollouts_collection,
    rollouts_freeze,
    version_retire,
    versions_collection,
)
from dashboard.api.runs import run_cancel, run_detail, runs, runs_cancel

__all__ = [
    "bulk_action",
    "commit_detail",
    "dlq",
    "dlq_discard",
    "dlq_group",
    "dlq_retry",
    "export",
    "integrity",
    "integrity_clear",
    "lock_release",
    "metrics",
    "not_found",
    "openapi_document",
    "push_hook",
    "queue_pause",
    "queue_resume",
    "repo_age",
    "repo_author",
    "repo_authors",
    "repo_cancel",
    "repo_commits",
    "repo_coupling",
    "repo_detail",
    "repo_export",
    "repo_files",
    "repo_hook_secret",
    "repo_hotspots",
    "repo_ownership",
    "repo_reanalyse",
    "repos",
    "rollout_action",
    "rollout_detail",
    "rollout_pin",
    "rollout_unpin",
    "rollouts_collection",
    "rollouts_freeze",
    "run_cancel",
    "run_detail",
    "runs",
    "runs_cancel",
    "status",
    "version_retire",
    "versions_collection",
]
