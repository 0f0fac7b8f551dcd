"""Push webhooks over HTTP (docs/api.md#push-webhooks): ``POST /api/hooks/push/<id>``, which
a git host calls, authenticated by its signature, not by a session or token; and
``POST /api/repos/<id>/hook-secret``, which issues the repository's secret (shown once).
Thin over ``dashboard.repositories.webhooks``."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from dashboard.api.endpoint import api_view, error
from dashboard.infra import RedisUnavailable
from dashboard.models import Repository
from dashboard.repositories import HookRefused, issue_secret, schedule_sync, verify, wanted

log = logging.getLogger(__name__)


@csrf_exempt
def push_hook(request: HttpRequest, repo_id: int) -> HttpResponse:
    """A git host's push: ``202 {outcome}`` once verified (``scheduled``, ``delayed``,
    ``trailing`` or why it was ignored); ``401`` missing or bad signature, ``403``
    webhooks off for the repository, ``404`` unknown repository, ``413`` too large."""
    if request.method != "POST":
        response = error(f"method {request.method} not allowed", 405)
        response["Allow"] = "POST"
        return response
    limit = int(settings.HOOK_MAX_BYTES)
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return error("bad Content-Length", 400)
    if declared > limit:
        return error(f"the body is larger than {limit} bytes", 413)
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        return error("repository not found", 404)
    try:
        body = request.body
    except RequestDataTooBig:
        return error(f"the body is larger than {limit} bytes", 413)
    if len(body) > limit:
        return error(f"the body is larger than {limit} bytes", 413)
    try:
        push = verify(repo, request.headers, body)
    except HookRefused as exc:
        return error(str(exc), exc.status)
    ignored = wanted(repo, push)
    if ignored is not None:
        return JsonResponse({"repository": repo.pk, "provider": push.provider,
                             "outcome": ignored}, status=202)  # fmt: skip
    try:
        outcome = schedule_sync(repo)
    except RedisUnavailable as exc:
        return error(str(exc), 503)
    except Exception:
        log.exception("push webhook of repository %s", repo.pk)
        return error("internal error; the failure was logged", 500)
    return JsonResponse(
        {"repository": repo.pk, "provider": push.provider, "outcome": outcome}, status=202
    )


@api_view(("POST",))
def repo_hook_secret(request: HttpRequest, repo_id: int) -> HttpResponse:
    """Issue a new webhook secret (``dashboard.change_repository``; audited): ``200
    {repository, secret, url}``. The secret is in this answer only."""
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        return error("repository not found", 404)
    try:
        secret = issue_secret(repo, request.user)
    except HookRefused as exc:
        return error(str(exc), exc.status)
    url = request.build_absolute_uri(reverse("api-hook-push", args=[repo.pk]))
    return JsonResponse({"repository": repo.pk, "secret": secret, "url": url})
