"""The repository pages: the list with its search and submit form (rate-limited), and
one repository (summary, history charts, commits, live panel, recent runs); thin over
``dashboard.repositories.lifecycle``, ``dashboard.repositories.summaries`` and
``dashboard.repositories.commits``."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dashboard import analytics
from dashboard.accounts import check
from dashboard.infra import QueueUnavailable, RedisUnavailable
from dashboard.live.snapshots import repository_live
from dashboard.models import JobRun, Repository
from dashboard.repositories import (
    CREATED,
    REANALYSED,
    BadCursor,
    commit_page,
    current_fingerprint,
    may_reanalyse,
    record_view,
    repository_list,
    repository_mirror,
    repository_summary,
    repository_with_status,
    user_submission,
)
from dashboard.runs import CANCEL_REPO_PERMISSION, repository_waiting
from dashboard.web.charts import history_bars
from dashboard.web.forms import SubmitRepositoryForm
from dashboard.web.list_params import positive_int, query_prefix
from dashboard.web.page_cache import reusable
from workers.remotes import InvalidRemote


def _repo_list_context(request: HttpRequest) -> dict[str, Any]:
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("q", "status")}
    if filters["status"] not in Repository.Status.values:
        filters["status"] = ""
    rows, nxt = repository_list(
        text=filters["q"],
        status=filters["status"],
        before=positive_int(request.GET.get("before"), None),
    )
    return {
        "repositories": rows,
        "filters": filters,
        "statuses": Repository.Status.values,
        "next_cursor": nxt,
        "first_page": not request.GET.get("before"),
        "query": query_prefix(filters),
    }


@login_required
@require_http_methods(["GET", "POST"])
@reusable  # GET only: a POST is rendered every time
def repositories(request: HttpRequest) -> HttpResponse:
    # Bound for every POST, an empty one too: the rate limit's form error below needs a
    # bound form (an unbound one has no cleaned_data: AttributeError, a 500).
    form = SubmitRepositoryForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        verdict = check("submit", request.user)
        if not verdict.allowed:
            form.is_valid()
            form.add_error(
                None,
                f"Too many submissions: at most {verdict.limit} per minute. "
                f"Try again in {verdict.retry_after} s.",
            )
            response = render(
                request,
                "repositories.html",
                {"form": form, **_repo_list_context(request)},
                status=429,
            )
            response["Retry-After"] = str(verdict.retry_after)
            return response
    if request.method == "POST" and form.is_valid():
        try:
            repo, outcome = user_submission(
                url=form.cleaned_data["url"], branch=form.cleaned_data["branch"], user=request.user
            )
        except InvalidRemote as exc:
            form.add_error("url", str(exc))
        except RedisUnavailable as exc:
            form.add_error(None, str(exc))
        else:
            if outcome == CREATED:
                messages.success(request, f"Submitted {repo.name}; analysis queued.")
            elif outcome == REANALYSED:
                messages.success(request, f"{repo.name} is analysed again: new commits queued.")
            else:  # a duplicate changes nothing without the re-analyse permission
                messages.info(request, f"{repo.name} was already submitted.")
            return redirect("repository", repo_id=repo.pk)
    status_code = 400 if request.method == "POST" else 200
    return render(
        request,
        "repositories.html",
        {"form": form, **_repo_list_context(request)},
        status=status_code,
    )


@login_required
def repository(request: HttpRequest, repo_id: int) -> HttpResponse:
    fp = current_fingerprint()
    # The row, its stored-commit count and chunk counts in one query; the summary's
    # freshness check and the live panel reuse ``state`` (same fingerprint: one read).
    found = repository_with_status(repo_id, fingerprint=fp)
    if found is None:
        raise Http404("repository not found")
    repo, state = found
    record_view(repo.pk)  # the rollout warm set starts from the most-viewed repositories
    verification = analytics.verification_status(repo, fingerprint=fp)
    if verification and verification["withheld"]:  # docs/analytics.md#verification
        return render(request, "repository.html", {
            "live_socket": f"/ws/repos/{repo.pk}/",
            "live": repository_live(repo.pk, repo=repo, state=state, shared_locks=True),
            "repo": repo, "state": state, "verification": verification,
            "withheld": verification["reason"], "recent_runs": _recent_runs(request, repo),
            "mirror": repository_mirror(repo), "can_reanalyse": may_reanalyse(request.user),
            "can_cancel": request.user.has_perm(CANCEL_REPO_PERMISSION),
        })  # fmt: skip
    summary = repository_summary(repo, fp, stored=state["commits_analyzed"])
    try:
        commits, nxt = commit_page(repo, fingerprint=fp, limit=50, cursor=request.GET.get("cursor"))
    except BadCursor:
        commits, nxt = commit_page(repo, fingerprint=fp, limit=50)
    try:
        waiting = repository_waiting(repo)
    except QueueUnavailable:  # the banner says the queue server is down
        waiting = None
    return render(
        request,
        "repository.html",
        {
            "live_socket": f"/ws/repos/{repo.pk}/",
            "live": repository_live(repo.pk, repo=repo, state=state, shared_locks=True),
            "repo": repo,
            "state": state,
            "summary": summary,
            "chart": history_bars(summary["weekly"]),
            "lines_chart": history_bars(
                [
                    {"week": w["week"], "lines": w.get("insertions", 0) + w.get("deletions", 0)}
                    for w in summary["weekly"]
                ],
                field="lines",
                unit="line",
            ),
            "commits": commits,
            "next_cursor": nxt,
            "first_page": not request.GET.get("cursor"),
            "recent_runs": _recent_runs(request, repo),
            "mirror": repository_mirror(repo),  # this host's mirror, read by GitPython
            "can_reanalyse": may_reanalyse(request.user),
            "can_cancel": request.user.has_perm(CANCEL_REPO_PERMISSION),
            "waiting": waiting,
            "verification": verification,
            "aggregates": analytics.precompute_status(
                repo, fingerprint=fp
            ),  # docs/analytics.md#precomputation
        },
    )


#: What the recent-runs table of ``repository.html`` shows of a run: only these columns
#: are read (not the error text, cause or payload, nor the repository again: the page
#: has its row). A field the table starts to show must be added here, or every row
#: costs a query of its own (``tests/dashboard/web/test_pages.py`` counts the page's queries).
RECENT_RUN_FIELDS = ("id", "kind", "job_id", "state", "attempts", "started_at", "finished_at")


def _recent_runs(request: HttpRequest, repo: Repository) -> list[JobRun]:
    """The repository's last ten runs, newest first (``search_runs(repo=…)``'s order),
    linked to their run pages (operators only)."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return []
    runs = JobRun.objects.filter(repository_id=repo.pk).only(*RECENT_RUN_FIELDS)
    return list(runs.order_by("-pk")[:10])
