"""JSON API of one repository's pages: ``GET /api/repos/<id>/commits/<sha>`` (the commit
page's data) and ``POST /api/repos/<id>/reanalyse`` (its page's button). Thin over
``dashboard.repositories.one_commit`` and ``dashboard.repositories.reanalysis``; authentication,
rate limits and JSON errors are ``dashboard.api.endpoint.api_view``'s."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api.endpoint import api_view, error
from dashboard.models import Repository
from dashboard.repositories import CommitNotFound, commit_details, reanalyse


@api_view(("GET",))
def commit_detail(request: HttpRequest, repo_id: int, sha: str) -> HttpResponse:
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        return error("repository not found", 404)
    try:
        return JsonResponse(commit_details(repo, sha))
    except CommitNotFound as exc:
        return error(str(exc), 404)


@api_view(("POST",))
def repo_reanalyse(request: HttpRequest, repo_id: int) -> HttpResponse:
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        return error("repository not found", 404)
    status, outcome = reanalyse(repo, request.user)
    if status >= 400:
        return error(outcome, status)
    return JsonResponse({"repository": repo.pk, "outcome": outcome}, status=status)
