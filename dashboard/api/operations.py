"""Operations over the API: the status snapshot, forced lock release, queue pause and
resume (operators; every refused or accepted action is audited)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard import infra
from dashboard.accounts import record_audit
from dashboard.api.endpoint import api_view, error, json_body, operator_refusal, permission_refusal
from dashboard.infra import publish_event
from dashboard.live.snapshots import ops_snapshot
from dashboard.locks import force_release_lock
from workers import locks


@api_view(("GET",))
def status(request: HttpRequest) -> HttpResponse:

    if (refused := operator_refusal(request)) is not None:
        return refused
    return JsonResponse(ops_snapshot(user=request.user))


@api_view(("POST",))
def lock_release(request: HttpRequest) -> HttpResponse:
    """Force-release a lock (staff with ``dashboard.force_release_lock``); the fencing
    token is bumped so the old holder's later writes are rejected. Audited."""

    refused = permission_refusal(
        request,
        "dashboard.force_release_lock",
        action="lock.force_release",
        message="you do not have permission to force-release locks",
    )
    if refused is not None:
        return refused
    data = json_body(request)
    key = data.get("key")
    if not isinstance(key, str) or not key.startswith(locks.PREFIX) or len(key) > 255:
        return error(f'"key" must be a lock key ({locks.PREFIX}…)', 400)
    return JsonResponse(force_release_lock(key=key, user=request.user))


def _pause(request: HttpRequest, paused: bool) -> HttpResponse:

    verb = "pause" if paused else "resume"
    refused = permission_refusal(
        request,
        "dashboard.pause_queue",
        action=f"queue.{verb}",
        message=f"you do not have permission to {verb} queues",
    )
    if refused is not None:
        return refused
    name = json_body(request).get("queue")
    if name not in infra.queue_names():
        return error(f'"queue" must be one of {", ".join(infra.queue_names())}', 400)
    changed = infra.set_paused(name, paused)
    record_audit(
        user=request.user,
        action=f"queue.{verb}",
        target=name,
        outcome="done" if changed else "no change",
    )

    publish_event("job.queued", {"queue": name, "paused": paused})
    return JsonResponse({"queue": name, "paused": paused, "changed": changed})


@api_view(("POST",))
def queue_pause(request: HttpRequest) -> HttpResponse:
    return _pause(request, True)


@api_view(("POST",))
def queue_resume(request: HttpRequest) -> HttpResponse:
    return _pause(request, False)
