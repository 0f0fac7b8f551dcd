"""Repositories and their results: submission (a user's, and what a duplicate may do)
and lifecycle, the chunk plans of a sync, the fenced writes of commits and file changes,
commit counts, the commit page, re-analysis, the summaries the pages read, and view
counts. See docs/analysis.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.repositories.chunk_plans import (
        Plan,
        begin_chunk,
        catch_up,
        enqueue_catch_up,
        finish_chunk,
        incremental_base,
        plan_repository,
        plan_shadow,
        plan_warm_set,
        reconcile_catch_up,
    )
    from dashboard.repositories.commits import (
        BadCursor,
        commit_dict,
        commit_page,
        iter_commits,
        write_chunk,
    )
    from dashboard.repositories.lifecycle import (
        claim_sync,
        complete_repository,
        current_fingerprint,
        publish_repo_changed,
        repository_list,
        repository_rows,
        repository_status,
        repository_with_status,
        resolve_repository,
        submit_repository,
        validate_remote,
    )
    from dashboard.repositories.one_commit import CommitNotFound, commit_details, repository_mirror
    from dashboard.repositories.reanalysis import may_reanalyse, reanalyse
    from dashboard.repositories.refresh_schedule import refresh_due
    from dashboard.repositories.submissions import (
        CREATED,
        EXISTING,
        REANALYSED,
        Submission,
        user_submission,
    )
    from dashboard.repositories.summaries import repository_summary
    from dashboard.repositories.view_counts import flush_views, record_view
    from dashboard.repositories.webhooks import (
        HookRefused,
        Push,
        issue_secret,
        results_lag,
        schedule_sync,
        sync_after_push,
        verify,
        wanted,
    )

__all__ = [
    "CREATED",
    "EXISTING",
    "REANALYSED",
    "BadCursor",
    "CommitNotFound",
    "HookRefused",
    "Plan",
    "Push",
    "Submission",
    "begin_chunk",
    "catch_up",
    "claim_sync",
    "commit_details",
    "commit_dict",
    "commit_page",
    "complete_repository",
    "current_fingerprint",
    "enqueue_catch_up",
    "finish_chunk",
    "flush_views",
    "incremental_base",
    "issue_secret",
    "iter_commits",
    "may_reanalyse",
    "plan_repository",
    "plan_shadow",
    "plan_warm_set",
    "publish_repo_changed",
    "reanalyse",
    "reconcile_catch_up",
    "record_view",
    "refresh_due",
    "repository_list",
    "repository_mirror",
    "repository_rows",
    "repository_status",
    "repository_summary",
    "repository_with_status",
    "resolve_repository",
    "results_lag",
    "schedule_sync",
    "submit_repository",
    "sync_after_push",
    "user_submission",
    "validate_remote",
    "verify",
    "wanted",
    "write_chunk",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "Plan": "dashboard.repositories.chunk_plans",
    "begin_chunk": "dashboard.repositories.chunk_plans",
    "catch_up": "dashboard.repositories.chunk_plans",
    "enqueue_catch_up": "dashboard.repositories.chunk_plans",
    "finish_chunk": "dashboard.repositories.chunk_plans",
    "incremental_base": "dashboard.repositories.chunk_plans",
    "plan_repository": "dashboard.repositories.chunk_plans",
    "plan_shadow": "dashboard.repositories.chunk_plans",
    "plan_warm_set": "dashboard.repositories.chunk_plans",
    "reconcile_catch_up": "dashboard.repositories.chunk_plans",
    "BadCursor": "dashboard.repositories.commits",
    "commit_dict": "dashboard.repositories.commits",
    "commit_page": "dashboard.repositories.commits",
    "iter_commits": "dashboard.repositories.commits",
    "write_chunk": "dashboard.repositories.commits",
    "claim_sync": "dashboard.repositories.lifecycle",
    "complete_repository": "dashboard.repositories.lifecycle",
    "current_fingerprint": "dashboard.repositories.lifecycle",
    "publish_repo_changed": "dashboard.repositories.lifecycle",
    "repository_list": "dashboard.repositories.lifecycle",
    "repository_rows": "dashboard.repositories.lifecycle",
    "repository_status": "dashboard.repositories.lifecycle",
    "repository_with_status": "dashboard.repositories.lifecycle",
    "resolve_repository": "dashboard.repositories.lifecycle",
    "submit_repository": "dashboard.repositories.lifecycle",
    "validate_remote": "dashboard.repositories.lifecycle",
    "CommitNotFound": "dashboard.repositories.one_commit",
    "commit_details": "dashboard.repositories.one_commit",
    "repository_mirror": "dashboard.repositories.one_commit",
    "may_reanalyse": "dashboard.repositories.reanalysis",
    "reanalyse": "dashboard.repositories.reanalysis",
    "HookRefused": "dashboard.repositories.webhooks",
    "Push": "dashboard.repositories.webhooks",
    "issue_secret": "dashboard.repositories.webhooks",
    "refresh_due": "dashboard.repositories.refresh_schedule",
    "results_lag": "dashboard.repositories.webhooks",
    "schedule_sync": "dashboard.repositories.webhooks",
    "sync_after_push": "dashboard.repositories.webhooks",
    "verify": "dashboard.repositories.webhooks",
    "wanted": "dashboard.repositories.webhooks",
    "CREATED": "dashboard.repositories.submissions",
    "EXISTING": "dashboard.repositories.submissions",
    "REANALYSED": "dashboard.repositories.submissions",
    "Submission": "dashboard.repositories.submissions",
    "user_submission": "dashboard.repositories.submissions",
    "repository_summary": "dashboard.repositories.summaries",
    "flush_views": "dashboard.repositories.view_counts",
    "record_view": "dashboard.repositories.view_counts",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
