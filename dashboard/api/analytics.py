"""A repository's analyses over the API (docs/api.md#analytics): ``GET
/api/repos/<id>/hotspots``, ``/coupling``, ``/ownership``, ``/age``, ``/authors``,
``/authors/<identity>`` and ``/files?path=P``, each with ``since``/``until``/``last``,
``exclude`` (the lenses, docs/analytics.md#lenses) and its own parameters; and the bulk
export of the stored rows, ``GET /api/repos/<id>/export`` and ``GET /api/export?repos=…``
(docs/analytics.md#export); thin over ``dashboard.analytics``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
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
        if fmt not in analytics.FORMATS:
            return error("format must be json, csv or ndjson", 400)
        return _table(request, body, request.GET.get("table") or "", fmt)

    view.__name__ = view.__qualname__ = f"repo_{kind}"
    return view


def _streaming(request: HttpRequest, chunks: Iterator[str], fmt: str) -> StreamingHttpResponse:
    """A response streaming ``chunks`` as it is read. Under ASGI (the uvicorn server,
    docs/operations.md) Django reads a synchronous iterator whole into a list before the
    first byte, so there the chunks go through an asynchronous one, each produced in the
    request's own thread (``thread_sensitive``: the thread that holds its database
    connection, so every batch query runs on it, one after the other)."""
    content: Iterator[str] | AsyncIterator[str] = chunks
    if isinstance(request, ASGIRequest):
        content = _one_at_a_time(chunks)
    return StreamingHttpResponse(content, content_type=analytics.content_type(fmt))


async def _one_at_a_time(chunks: Iterator[str]) -> AsyncIterator[str]:
    def following() -> str | None:
        return next(chunks, None)

    step = sync_to_async(following, thread_sensitive=True)
    while (chunk := await step()) is not None:
        yield chunk


def _table(request: HttpRequest, body: dict[str, Any], table: str, fmt: str) -> HttpResponse:
    """One table of the report as CSV or NDJSON (docs/api.md#analytics), streamed row by
    row."""
    found = analytics.tables(body)
    if table not in found:
        return error(f"table must be one of {', '.join(found)}", 400)
    lines = analytics.csv_lines if fmt == "csv" else analytics.ndjson_lines
    response = _streaming(request, lines(found[table]), fmt)
    name = f"{body['name']}-{body['analysis']}-{table}.{fmt}".replace('"', "")
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


def _export_response(request: HttpRequest, repos: list[Repository]) -> HttpResponse:
    """The export of ``repos`` (docs/api.md#export): every parameter and repository is
    checked before the first byte, then the rows are streamed batch by batch."""
    values: dict[str, Any] = {k: request.GET.get(k) for k in request.GET}
    if "exclude" in request.GET:
        values["exclude"] = ",".join(request.GET.getlist("exclude"))
    try:
        export = analytics.parse_export(values)
    except analytics.BadParameter as exc:
        return error(str(exc), 400)
    for repo in repos:
        if withheld := analytics.withheld_reason(repo):
            return error(f"{repo.name}: {withheld}", 409)  # docs/analytics.md#verification
    response = _streaming(request, analytics.export_lines(repos, export), export.format)
    response["Content-Disposition"] = f'attachment; filename="{export.filename(repos)}"'
    return response


@api_view(("GET",))
def repo_export(request: HttpRequest, repo_id: int) -> HttpResponse:
    """``GET /api/repos/<id>/export?what=commits|files&format=csv|ndjson``."""
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        return error("repository not found", 404)
    return _export_response(request, [repo])


@api_view(("GET",))
def export(request: HttpRequest) -> HttpResponse:
    """``GET /api/export?repos=1,2,3&what=…&format=…``: the repositories in the order
    given, each row naming its repository; an unknown id is a 404 before any row."""
    try:
        ids = analytics.parse_repository_ids(request.GET.get("repos"))
    except analytics.BadParameter as exc:
        return error(str(exc), 400)
    found = Repository.objects.in_bulk(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        return error(f"repository {missing[0]} not found", 404)
    return _export_response(request, [found[i] for i in ids])
