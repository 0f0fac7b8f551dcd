"""The integrity group over the API (docs/analytics.md#verification): ``GET
/api/integrity`` lists the open verification mismatches beside the dead letters, ``POST
/api/integrity/<id>/clear`` clears one (audited); thin over ``dashboard.analytics``."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard import analytics
from dashboard.api.endpoint import (
    api_view,
    error,
    json_body,
    operator_refusal,
    permission_refusal,
)

__all__ = ["integrity", "integrity_clear"]


@api_view(("GET",))
def integrity(request: HttpRequest) -> HttpResponse:
    if (refused := operator_refusal(request)) is not None:
        return refused
    rows = analytics.open_mismatches()
    return JsonResponse({"open": len(rows), "mismatches": rows})


@api_view(("POST",))
def integrity_clear(request: HttpRequest, verification_id: int) -> HttpResponse:
    refused = permission_refusal(
        request,
        "dashboard.change_repository",
        action="integrity.clear",
        message="you do not have permission to clear integrity mismatches",
    )
    if refused is not None:
        return refused
    json_body(request)  # nothing is read from it, but a malformed body is a 400 as anywhere
    if not analytics.clear_mismatch(verification_id, user=request.user):
        return error("no open integrity mismatch with that id", 409)
    return JsonResponse({"cleared": True, "id": verification_id})
