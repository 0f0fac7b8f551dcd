"""Job runs over the API: search them, one run with its attempts and trace, and
cancelling one run or every run a filter selects."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api.endpoint import api_view, error, int_param, json_body, operator_refusal
from dashboard.infra import QueueUnavailable, is_db_id
from dashboard.models import JobRun
from dashboard.observability import run_trace
from dashboard.runs import (
    CancelRefused,
    cancel_filtered,
    cancel_run,
    run_dict,
    run_waiting,
    search_runs,
)
from dashboard.web.list_params import positive_int


@api_view(("GET",))
def runs(request: HttpRequest) -> HttpResponse:
    """Search job runs: ``state``, ``kind``, ``repo`` (id), ``q`` (text in job id, cause,
    error, repository URL), newest first, keyset-paginated with ``before`` (a run id)."""

    if (refused := operator_refusal(request)) is not None:
        return refused
    state, kind = request.GET.get("state", ""), request.GET.get("kind", "")
    if state and state not in JobRun.State.values:
        return error(f"state must be one of {', '.join(JobRun.State.values)}", 400)
    if kind and kind not in JobRun.Kind.values:
        return error(f"kind must be one of {', '.join(JobRun.Kind.values)}", 400)
    for name in ("repo", "before"):
        raw = request.GET.get(name)
        if raw and positive_int(raw, None) is None:  # "²", past 64 bits: not ids
            return error(f"{name} must be an integer", 400)
    repo, before = request.GET.get("repo"), request.GET.get("before")
    rows, nxt = search_runs(
        state=state,
        kind=kind,
        repo=int(repo) if repo else None,
        text=request.GET.get("q", ""),
        before=int(before) if before else None,
        limit=int_param(request, "limit", 50, 1, 200),
    )
    return JsonResponse({"results": [run_dict(r) for r in rows], "next": nxt})


@api_view(("GET",))
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run with every attempt and its trace (the run page's data)."""

    if (refused := operator_refusal(request)) is not None:
        return refused
    found = JobRun.objects.select_related("repository", "chunk").filter(pk=run_id).first()
    if found is None:
        return error("run not found", 404)
    body = run_trace(found)
    try:
        body["waiting"] = run_waiting(found)
    except QueueUnavailable:  # the queue is unknown while its server is down
        body["waiting"] = None
    return JsonResponse(body)


@api_view(("POST",))
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    """Cancel one run (docs/lifecycle.md#cancelling); 200 with what was done."""
    found = JobRun.objects.select_related("repository").filter(pk=run_id).first()
    if found is None:
        return error("run not found", 404)
    try:
        done = cancel_run(found, request.user)
    except CancelRefused as exc:
        return error(str(exc), exc.status)
    return JsonResponse(done.as_dict())


@api_view(("POST",))
def runs_cancel(request: HttpRequest) -> HttpResponse:
    """Cancel every run a filter selects: JSON ``{state, queue, repo}`` (one at least)."""
    data = json_body(request)
    state, queue, repo = data.get("state", ""), data.get("queue", ""), data.get("repo")
    if not isinstance(state, str) or not isinstance(queue, str):
        return error("state and queue must be strings", 400)
    if repo is not None and not is_db_id(repo):  # past 64 bits overflows the driver
        return error("repo must be a repository id", 400)
    if len(queue) > 100:
        return error("queue must be at most 100 characters", 400)
    try:
        done = cancel_filtered(request.user, state=state, queue=queue, repo=repo)
    except CancelRefused as exc:
        return error(str(exc), exc.status)
    return JsonResponse({**done.as_dict(), "runs": done.runs[:1000]})
