"""A repository's analyses over the API (docs/api.md#analytics): ``GET
/api/repos/<id>/hotspots``, ``/coupling``, ``/ownership``, ``/age``, ``/authors``,
``/authors/<identity>`` and ``/files?path=P``, each with ``since``/``until``/``last``,
``exclude`` (the lenses, docs/analytics.md#lenses) and its own parameters; thin over
``dashboard.analytics``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from dashboard import analytics
from dashboard.api.endpoint import api_view, error
from dashboard.models import Repository


def _analysis(kind: str) -> Callable[..., HttpResponse]:
    @api_view(("GET",))
    def view(request: HttpRequest, repo_id: int, identity: str | None = None) -> HttpResponse:
        repo = Repository.objects.filter(pk=repo_id).first()
        if repo is None:
            return error("repository not found", 404)
        values = {k: request.GET.get(k) for k in request.GET}
        if "exclude" in request.GET:  # ?exclude=a,b or ?exclude=a&exclude=b
            values["exclude"] = ",".join(request.GET.getlist("exclude"))
        if identity is not None:
            values["author"] = identity
        if withheld := analytics.withheld_reason(repo):
            return error(withheld, 409)  # docs/analytics.md#verification
        try:
            params = analytics.parse_params(values)
            body = analytics.report(kind, repo, params)
        except analytics.BadParameter as exc:
            return error(str(exc), 400)
        except analytics.NotFound as exc:
            return error(str(exc), 404)
        body["verification"] = analytics.verification_status(repo)
        fmt = request.GET.get("format") or "json"
        if fmt == "json":
            return JsonResponse(body)
        if fmt != "csv":
            return error("format must be json or csv", 400)
        return _csv(body, request.GET.get("table") or "")

    view.__name__ = view.__qualname__ = f"repo_{kind}"
    return view


def _csv(body: dict[str, Any], table: str) -> HttpResponse:
    """One table of the report as CSV (docs/api.md#analytics), streamed row by row."""
    found = analytics.tables(body)
    if table not in found:
        return error(f"table must be one of {', '.join(found)}", 400)
    response = StreamingHttpResponse(
        analytics.csv_lines(found[table]), content_type="text/csv; charset=utf-8"
    )
    name = f"{body['name']}-{body['analysis']}-{table}.csv".replace('"', "")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


repo_hotspots = _analysis("hotspots")
repo_coupling = _analysis("coupling")
repo_ownership = _analysis("ownership")
repo_age = _analysis("age")
repo_authors = _analysis("authors")
repo_author = _analysis("authors")
repo_author.__name__ = repo_author.__qualname__ = "repo_author"
repo_files = _analysis("files")
