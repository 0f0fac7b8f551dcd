"""Repositories over the API: submit one, its status (and summary), its commits,
cancelling its analysis."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard import analytics
from dashboard.api.endpoint import api_view, error, json_body, rate_limited
from dashboard.infra import QueueUnavailable
from dashboard.models import Repository
from dashboard.repositories import (
    EXISTING,
    BadCursor,
    commit_dict,
    commit_page,
    current_fingerprint,
    repository_status,
    repository_summary,
    user_submission,
)
from dashboard.runs import CancelRefused, cancel_repository, repository_waiting
from workers.remotes import InvalidRemote


@api_view(("POST",))
def repos(request: HttpRequest) -> HttpResponse:
    limited = rate_limited(request, "submit")
    if limited is not None:
        return limited
    data = json_body(request)
    url = data.get("url")
    branch = data.get("branch")
    if not isinstance(url, str) or not url.strip():
        return error("url is required", 400)
    if branch is not None and not isinstance(branch, str):
        return error("branch must be a string", 400)
    try:
        repo, outcome = user_submission(url=url, branch=branch, user=request.user)
    except InvalidRemote as exc:
        return error(str(exc), 400)
    # a duplicate is returned unchanged unless the user may re-analyse (docs/api.md)
    return JsonResponse(repository_status(repo), status=200 if outcome == EXISTING else 202)


def _repo_or_404(repo_id: int) -> Repository | None:
    return Repository.objects.filter(pk=repo_id).first()


@api_view(("GET",))
def repo_detail(request: HttpRequest, repo_id: int) -> HttpResponse:
    repo = _repo_or_404(repo_id)
    if repo is None:
        return error("repository not found", 404)
    body = repository_status(repo)
    try:
        body["waiting"] = repository_waiting(repo)
    except QueueUnavailable:  # the queue is unknown while its server is down
        body["waiting"] = None
    body["verification"] = analytics.verification_status(repo)
    body["aggregates"] = analytics.precompute_status(repo)  # docs/analytics.md#precomputation
    # withheld results (docs/analytics.md#verification): the reason instead of numbers
    body["withheld"] = withheld = analytics.withheld_reason(repo)
    if request.GET.get("summary") in {"1", "true"} and withheld:
        body["summary"] = None
    elif request.GET.get("summary") in {"1", "true"}:
        fp = current_fingerprint()
        stored = body["commits_analyzed"] if body["fingerprint"] == fp else None
        body["summary"] = repository_summary(repo, fp, stored=stored)
    return JsonResponse(body)


@api_view(("GET",))
def repo_commits(request: HttpRequest, repo_id: int) -> HttpResponse:
    repo = _repo_or_404(repo_id)
    if repo is None:
        return error("repository not found", 404)
    raw_limit = request.GET.get("limit", "50")
    try:
        limit = int(raw_limit)
    except ValueError:
        return error("limit must be an integer", 400)
    if not 1 <= limit <= 1000:
        return error("limit must be between 1 and 1000", 400)
    if withheld := analytics.withheld_reason(repo):
        return error(withheld, 409)
    try:
        rows, nxt = commit_page(
            repo,
            fingerprint=current_fingerprint(),
            limit=limit,
            cursor=request.GET.get("cursor") or None,
            with_files=request.GET.get("files") in {"1", "true"},
        )
    except BadCursor:
        return error("invalid cursor", 400)
    results = [commit_dict(c, getattr(c, "file_rows", None)) for c in rows]
    return JsonResponse({"results": results, "next": nxt})


@api_view(("POST",))
def repo_cancel(request: HttpRequest, repo_id: int) -> HttpResponse:
    """Cancel the repository's analysis (docs/lifecycle.md#cancelling): 200 with what
    was done and the repository's status."""
    repo = _repo_or_404(repo_id)
    if repo is None:
        return error("repository not found", 404)
    try:
        done = cancel_repository(repo, request.user)
    except CancelRefused as exc:
        return error(str(exc), exc.status)
    repo.refresh_from_db()
    return JsonResponse({**done.as_dict(), "repository": repo.pk, "status": repo.status,
                         "error": repo.error or None})  # fmt: skip
