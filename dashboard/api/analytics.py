"""A repository's analyses over the API (docs/api.md#analytics): ``GET
/api/repos/<id>/hotspots``, ``/coupling``, ``/ownership`` and ``/age``, each with
``since``/``until``/``last`` and its own parameters; thin over ``dashboard.analytics``."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard import analytics
from dashboard.api.endpoint import api_view, error
from dashboard.models import Repository


def _analysis(kind: str) -> Callable[..., HttpResponse]:
    @api_view(("GET",))
    def view(request: HttpRequest, repo_id: int) -> HttpResponse:
        repo = Repository.objects.filter(pk=repo_id).first()
        if repo is None:
            return error("repository not found", 404)
        try:
            params = analytics.parse_params(request.GET)
            body = analytics.report(kind, repo, params)
        except analytics.BadParameter as exc:
            return error(str(exc), 400)
        return JsonResponse(body)

    view.__name__ = view.__qualname__ = f"repo_{kind}"
    return view


repo_hotspots = _analysis("hotspots")
repo_coupling = _analysis("coupling")
repo_ownership = _analysis("ownership")
repo_age = _analysis("age")
