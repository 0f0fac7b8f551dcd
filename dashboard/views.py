"""Server-rendered pages; thin over the domain modules."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dashboard.charts import sparklines, weekly_bars
from dashboard.commits import BadCursor, commit_page
from dashboard.forms import SubmitRepositoryForm
from dashboard.models import AuditEntry, JobRun, Repository
from dashboard.queues import RedisUnavailable
from dashboard.ratelimits import check
from dashboard.readiness import check_readiness
from dashboard.repositories import (
    InvalidRemote,
    current_fingerprint,
    repository_status,
    submit_repository,
)
from dashboard.snapshots import ops_snapshot, repository_live
from dashboard.summaries import repository_summary
from dashboard.traces import run_trace

log = logging.getLogger(__name__)


def _ops_page(request: HttpRequest, template: str, **extra: Any) -> HttpResponse:
    """An operations page: server-rendered from a snapshot, then kept live by the
    websocket. Needs ``dashboard.view_jobrun`` like the socket itself."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    socket = "/ws/ops/?dlq=groups" if template == "dead_letters.html" else "/ws/ops/"
    context: dict[str, Any] = {"live_socket": socket, **extra}
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
    recent = _repo_rows(Repository.objects.all()[:10])
    return _ops_page(request, "overview.html", repositories=recent)


@login_required
def locks(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "locks.html")


@login_required
def workers(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "workers.html")


@login_required
def dead_letters(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "dead_letters.html")


@login_required
def audit(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    entries = AuditEntry.objects.select_related("user")
    filters = {k: request.GET.get(k, "").strip() for k in ("action", "actor", "q")}
    if filters["action"]:
        entries = entries.filter(action=filters["action"])
    if filters["actor"]:
        entries = entries.filter(actor=filters["actor"])
    if filters["q"]:
        text = filters["q"]
        entries = entries.filter(Q(target__icontains=text) | Q(outcome__icontains=text))
    actions = AuditEntry.objects.order_by().values_list("action", flat=True).distinct()
    return render(
        request,
        "audit.html",
        {"entries": entries[:500], "filters": filters, "actions": sorted(set(actions))},
    )


def _repo_rows(repos: Any) -> list[dict[str, Any]]:
    return [repository_status(r) | {"repo": r} for r in repos]


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
            repos = Repository.objects.all()[:200]
            response = render(
                request,
                "repositories.html",
                {"form": form, "repositories": _repo_rows(repos)},
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
    repos = Repository.objects.all()[:200]
    status_code = 400 if request.method == "POST" else 200
    return render(
        request,
        "repositories.html",
        {"form": form, "repositories": _repo_rows(repos)},
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
            "chart": weekly_bars(summary["weekly"]),
            "commits": commits,
            "next_cursor": nxt,
            "first_page": not request.GET.get("cursor"),
            "recent_runs": _recent_runs(request, repo),
        },
    )


def _recent_runs(request: HttpRequest, repo: Repository) -> list[JobRun]:
    """The repository's last runs, linked to their run pages (operators only)."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return []
    return list(JobRun.objects.filter(repository=repo).order_by("-pk")[:10])


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


def readyz(request: HttpRequest) -> HttpResponse:
    """Readiness (``dashboard.readiness``): 200 when the database is migrated and a
    majority of lock masters and the queue Redis answer, else 503; the JSON body names
    every check and what failed. Anonymous, like ``/healthz``: it reveals no more than
    which dependency is down (host:port, never a password)."""
    readiness = check_readiness(timeout=0.5)
    return JsonResponse(readiness.as_dict(), status=200 if readiness.ready else 503)


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run: its attempts, each with its trace as a timeline (``dashboard.traces``).
    Operations data: needs ``dashboard.view_jobrun``."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    found = JobRun.objects.select_related("repository").filter(pk=run_id).first()
    if found is None:
        raise Http404("run not found")
    return render(request, "run.html", {"run": run_trace(found)})


@login_required
def run_by_job(request: HttpRequest, job_id: str) -> HttpResponse:
    """A job id (lock holders, workers' current jobs) → its run page."""
    found = JobRun.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
    if found is None:
        raise Http404("run not found")
    return redirect("run", run_id=found)
