"""Server-rendered pages; thin over the domain modules."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dashboard.audit import audit_actions, audit_page
from dashboard.charts import day_charts, history_bars, sparklines
from dashboard.commits import BadCursor, commit_page
from dashboard.deadletters import group_page
from dashboard.forms import SubmitRepositoryForm
from dashboard.models import JobRun, Repository
from dashboard.queues import RedisUnavailable
from dashboard.ratelimits import check
from dashboard.repositories import (
    InvalidRemote,
    current_fingerprint,
    repository_list,
    repository_rows,
    repository_status,
    submit_repository,
)
from dashboard.runs import search_runs
from dashboard.samples import day_series
from dashboard.snapshots import ops_snapshot, repository_live
from dashboard.summaries import repository_summary

log = logging.getLogger(__name__)


def _ops_page(request: HttpRequest, template: str, **extra: Any) -> HttpResponse:
    """An operations page: server-rendered from a snapshot, then kept live by the
    websocket. Needs ``dashboard.view_jobrun`` like the socket itself."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    socket = "/ws/ops/?dlq=groups" if template == "dead_letters.html" else "/ws/ops/"
    context: dict[str, Any] = {"live_socket": socket, **extra}
    if template == "dead_letters.html":
        text = request.GET.get("q", "").strip()[:200]
        context["dlq_filter"] = text
        context["dlq_page"] = group_page(text=text, page=_int(request.GET.get("page"), 1))
    try:
        context["snapshot"] = ops_snapshot(
            user=request.user, dlq_groups=template == "dead_letters.html"
        )
        context["sparks"] = sparklines(context["snapshot"]["series"])
    except RedisUnavailable as exc:
        context["redis_error"] = str(exc)
    return render(request, template, context)


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return redirect("repositories")  # users without operations access see their work
    recent = repository_rows(Repository.objects.order_by("-id"), limit=10)
    return _ops_page(request, "overview.html", repositories=recent, day=day_charts(day_series()))


@login_required
def locks(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "locks.html")


@login_required
def workers(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "workers.html")


@login_required
def dead_letters(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "dead_letters.html")


def _int(raw: str | None, default: int | None) -> Any:
    """A positive integer query parameter; ``default`` when absent or malformed (a
    hand-edited cursor shows the first page rather than an error page)."""
    if raw and raw.isdigit() and 0 < int(raw) < 2**62:
        return int(raw)
    return default


@login_required
def audit(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("action", "actor", "q")}
    entries, nxt = audit_page(
        action=filters["action"],
        actor=filters["actor"],
        text=filters["q"],
        before=_int(request.GET.get("before"), None),
    )
    return render(
        request,
        "audit.html",
        {
            "entries": entries,
            "filters": filters,
            "actions": audit_actions(),
            "next_cursor": nxt,
            "first_page": not request.GET.get("before"),
            "query": _query(filters),
        },
    )


def _query(filters: dict[str, str]) -> str:
    """The filters as a query string prefix for pager links (``a=1&b=2&`` or ``""``)."""
    pairs = QueryDict(mutable=True)
    for k, v in filters.items():
        if v:
            pairs[k] = v
    return pairs.urlencode() + "&" if pairs else ""


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    """The Runs screen: the search of ``GET /api/runs`` as a page."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("state", "kind", "repo", "q")}
    if filters["state"] not in JobRun.State.values:
        filters["state"] = ""
    if filters["kind"] not in JobRun.Kind.values:
        filters["kind"] = ""
    if not filters["repo"].isdigit():
        filters["repo"] = ""
    rows, nxt = search_runs(
        state=filters["state"],
        kind=filters["kind"],
        repo=int(filters["repo"]) if filters["repo"] else None,
        text=filters["q"],
        before=_int(request.GET.get("before"), None),
    )
    return render(
        request,
        "runs.html",
        {
            "runs": rows,
            "filters": filters,
            "states": JobRun.State.values,
            "kinds": JobRun.Kind.values,
            "next_cursor": nxt,
            "first_page": not request.GET.get("before"),
            "query": _query(filters),
        },
    )


def _repo_list_context(request: HttpRequest) -> dict[str, Any]:
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("q", "status")}
    if filters["status"] not in Repository.Status.values:
        filters["status"] = ""
    rows, nxt = repository_list(
        text=filters["q"], status=filters["status"], before=_int(request.GET.get("before"), None)
    )
    return {
        "repositories": rows,
        "filters": filters,
        "statuses": Repository.Status.values,
        "next_cursor": nxt,
        "first_page": not request.GET.get("before"),
        "query": _query(filters),
    }


@login_required
@require_http_methods(["GET", "POST"])
def repositories(request: HttpRequest) -> HttpResponse:
    form = SubmitRepositoryForm(request.POST or None)
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
            repo, created = submit_repository(
                url=form.cleaned_data["url"], branch=form.cleaned_data["branch"], user=request.user
            )
        except InvalidRemote as exc:
            form.add_error("url", str(exc))
        except RedisUnavailable as exc:
            form.add_error(None, str(exc))
        else:
            if created:
                messages.success(request, f"Submitted {repo.name}; analysis queued.")
            else:
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
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        raise Http404("repository not found")
    fp = current_fingerprint()
    state = repository_status(repo)
    summary = repository_summary(repo, fp)
    try:
        commits, nxt = commit_page(repo, fingerprint=fp, limit=50, cursor=request.GET.get("cursor"))
    except BadCursor:
        commits, nxt = commit_page(repo, fingerprint=fp, limit=50)
    return render(
        request,
        "repository.html",
        {
            "live_socket": f"/ws/repos/{repo.pk}/",
            "live": repository_live(repo.pk),
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
            "recent_runs": search_runs(repo=repo.pk, limit=10)[0],
            "commits": commits,
            "next_cursor": nxt,
            "first_page": not request.GET.get("cursor"),
        },
    )


FAVICON = Path(__file__).resolve().parent / "static" / "favicon.svg"


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico`` for browsers that ask before reading the page's icon link."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")
