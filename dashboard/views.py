"""Server-rendered pages; thin over the domain modules."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from dashboard import status as system_status
from dashboard.charts import weekly_bars
from dashboard.commits import BadCursor, commit_page
from dashboard.forms import SubmitRepositoryForm
from dashboard.models import Repository
from dashboard.queues import RedisUnavailable
from dashboard.repositories import (
    InvalidRemote,
    current_fingerprint,
    repository_status,
    submit_repository,
)
from dashboard.summaries import repository_summary

log = logging.getLogger(__name__)


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    context: dict[str, Any] = {"repositories": _repo_rows(Repository.objects.all()[:10])}
    try:
        context["snapshot"] = system_status.snapshot()
    except RedisUnavailable as exc:
        context["redis_error"] = str(exc)
    return render(request, "overview.html", context)


def _repo_rows(repos: Any) -> list[dict[str, Any]]:
    return [repository_status(r) | {"repo": r} for r in repos]


@login_required
@require_http_methods(["GET", "POST"])
def repositories(request: HttpRequest) -> HttpResponse:
    form = SubmitRepositoryForm(request.POST or None)
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
            "repo": repo,
            "state": state,
            "summary": summary,
            "chart": weekly_bars(summary["weekly"]),
            "commits": commits,
            "next_cursor": nxt,
            "first_page": not request.GET.get("cursor"),
        },
    )


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")
