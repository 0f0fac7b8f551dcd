"""Dead letters over the API: groups, one group's runs, retry and discard (at once for
≤ 100 runs, else a tracked bulk action), and a bulk action's progress."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api.endpoint import (
    api_view,
    error,
    id_list,
    int_param,
    json_body,
    operator_refusal,
    permission_refusal,
)
from dashboard.models import BulkAction
from dashboard.runs import act_now, group_runs, list_groups, start_bulk


@api_view(("GET",))
def dlq(request: HttpRequest) -> HttpResponse:

    if (refused := operator_refusal(request)) is not None:
        return refused
    groups = list_groups()
    return JsonResponse({"groups": groups, "dead": sum(g["count"] for g in groups)})


@api_view(("GET",))
def dlq_group(request: HttpRequest, group: str) -> HttpResponse:

    if (refused := operator_refusal(request)) is not None:
        return refused
    runs = group_runs(group, limit=int_param(request, "limit", 50, 1, 500))
    if not runs:
        return error("no dead letters in that group", 404)
    return JsonResponse({"group": group, "runs": runs})


def _dlq_action(request: HttpRequest, kind: str) -> HttpResponse:

    refused = permission_refusal(
        request,
        f"dashboard.{kind}_jobrun",
        action=f"dlq.{kind}",
        message=f"you do not have permission to {kind} dead letters",
    )
    if refused is not None:
        return refused
    data = json_body(request)
    runs, group, every = data.get("runs"), data.get("group"), data.get("all") is True
    if sum([runs is not None, group is not None, every]) != 1:
        return error('give exactly one of "runs": [ids], "group": key, "all": true', 400)
    if runs is not None:
        if isinstance(runs, list) and len(runs) > 100:
            return error('more than 100 runs: use "group" or "all" (a tracked bulk action)', 400)
        run_ids = id_list(runs, "runs", most=100)
        return JsonResponse({"moved": act_now(kind=kind, run_ids=run_ids, user=request.user)})
    if group is not None and (not isinstance(group, str) or not group.isalnum()):
        return error('"group" must be a group key from GET /api/dlq', 400)
    selector = {"group": group} if group is not None else {"all": True}
    action = start_bulk(kind=kind, selector=selector, user=request.user)
    return JsonResponse(_action_dict(action), status=202)


@api_view(("POST",))
def dlq_retry(request: HttpRequest) -> HttpResponse:
    return _dlq_action(request, "retry")


@api_view(("POST",))
def dlq_discard(request: HttpRequest) -> HttpResponse:
    return _dlq_action(request, "discard")


def _action_dict(action: Any) -> dict[str, Any]:
    return {
        "id": action.pk,
        "kind": action.kind,
        "selector": action.selector,
        "state": action.state,
        "total": action.total,
        "done": action.done,
        "error": action.error or None,
    }


@api_view(("GET",))
def bulk_action(request: HttpRequest, action_id: int) -> HttpResponse:

    if (refused := operator_refusal(request)) is not None:
        return refused
    action = BulkAction.objects.filter(pk=action_id).first()
    if action is None:
        return error("action not found", 404)
    return JsonResponse(_action_dict(action))
