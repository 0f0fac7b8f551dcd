"""Small middleware: security headers, the request input limits (a 400 or 413 for a body
or query Django cannot parse or that breaks a limit), and the last-resort 503s for Redis
and database failures."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.html import escape
from django.views import defaults

from dashboard import infra
from dashboard.infra import RedisUnavailable

log = logging.getLogger(__name__)

#: Scripts and styles only from our own origin; websockets back to our own origin.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
    "object-src 'none'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        return response


class EventActorMiddleware:
    """Tells ``dashboard.infra.events`` which request (so which user) an event published while
    serving it belongs to: a user's own action must show on their next page at once,
    somebody else's may wait for the next snapshot copy (``snapshots._stale_copy``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = infra.serving_request(request)
        try:
            return self.get_response(request)
        finally:
            infra.served_request(token)


class RequestInputMiddleware:
    """Reads what Django parses lazily — the query string, the body and its form fields —
    before any view or other middleware does, and answers a request that breaks a limit
    itself (docs/api.md#limits), JSON ``{"error"}`` under ``/api/``, a short page
    elsewhere:

    * 413: a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (by its ``Content-Length``; we
      take no file uploads, so this holds for multipart bodies too);
    * 400: more than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` fields (query or form) or
      ``DATA_UPLOAD_MAX_NUMBER_FILES`` files, a multipart body without a boundary or
      otherwise malformed, a NUL character in the
      path or a query parameter (no text column of PostgreSQL's can store one: a search
      for it raised there). A form field's NUL is the form's error to show
      (Django's ``CharField`` refuses it), a JSON body's is ``dashboard.api.endpoint``'s.

    Django raises these where the body is first read (the CSRF check, ``request.POST``
    in a view): past our handlers, as a logged 500 or a bare 400."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = input_problem(request)
        if problem is not None:
            status, message = problem
            return refused_input(request, status, message)
        return self.get_response(request)


def input_problem(request: HttpRequest) -> tuple[int, str] | None:
    """``(status, message)`` for a request that breaks an input limit, else None."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 400, "the Content-Length header is not a number"
    if limit is not None and length > limit:
        return 413, f"the request body is larger than {limit} bytes"
    try:
        if "\x00" in request.path or _any_nul(request.GET):
            return 400, "the path or query string holds a NUL character"
        if request.method not in {"GET", "HEAD", "OPTIONS", "TRACE"}:
            if request.content_type != "multipart/form-data":
                request.body  # noqa: B018 -- read now, with its limit checked (a body of its own)
            request.POST  # noqa: B018 -- parsed now: its field count, its multipart framing
    except RequestDataTooBig:  # a body longer than its Content-Length said
        return 413, f"the request body is larger than {limit} bytes"
    except TooManyFieldsSent:
        return 400, f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields"
    except TooManyFilesSent:
        return 400, f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FILES} files"
    except MultiPartParserError as exc:
        return 400, f"the multipart body cannot be read: {exc}"
    return None


def _any_nul(fields: Any) -> bool:
    return any("\x00" in k or any("\x00" in v for v in vs) for k, vs in fields.lists())


def refused_input(request: HttpRequest, status: int, message: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"error": message}, status=status)
    return HttpResponse(
        f"<!doctype html><title>bad request</title><p>{escape(message)}.</p>", status=status
    )


class QueueUnavailableMiddleware:
    """Last resort: a Redis connection failure that escaped its adapter is a 503 (JSON
    under ``/api/``, a short page elsewhere), never a 500. The adapters degrade on their
    own (``dashboard.infra.queues.QueueUnavailable``); this only catches what they missed,
    and logs it so it gets fixed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not isinstance(exc, redis.ConnectionError | redis.TimeoutError | RedisUnavailable):
            return None
        log.error("Redis failure not handled by its adapter on %s: %s", request.path, exc)
        message = infra.QUEUE_DOWN if isinstance(exc, infra.QueueUnavailable) else str(exc)
        return unavailable(request, message)


def unavailable(request: HttpRequest, message: str) -> HttpResponse:
    """A 503 saying ``message`` (no detail of ours beyond it): JSON ``{error}`` under
    ``/api/``, a short page elsewhere, with ``Retry-After``."""
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"error": message}, status=503)
    else:
        response = HttpResponse(
            f"<!doctype html><title>unavailable</title><p>{escape(message)}; "
            "try again in a moment.</p>",
            status=503,
        )
    response["Retry-After"] = "5"
    return response


#: What users are told while the database refuses connections.
DATABASE_DOWN = "the database is not answering"


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: a database that refuses or drops connections (PostgreSQL's "too
    many clients", a stopped server, a full pool's timeout; SQLite's "database is
    locked") is a 503 the client may retry, not a 500. Django calls this for any
    uncaught exception, in a view or in a middleware (the session and authentication
    middleware query first), from inside its ``except`` block, so ``sys.exc_info()`` is
    the exception; it has already been logged with its traceback (``django.request``),
    and the user sees none of it. Anything else keeps Django's plain 500 page."""
    exc = sys.exc_info()[1]
    if isinstance(exc, OperationalError | InterfaceError):
        return unavailable(request, DATABASE_DOWN)
    return defaults.server_error(request)


def queue_server_context(request: HttpRequest) -> dict[str, Any]:
    """Template context: ``queue_server`` for the banner in ``base.html``. A callable,
    so the queue server is pinged only by a template that reads it."""
    return {"queue_server": infra.queue_server}


#: Pages whose view names no socket of its own, and the socket that keeps them live
#: (``live_socket`` from a view wins): the operations socket for operators' pages, the
#: repository-list socket for the list (any logged-in user, like the list itself).
_PAGE_SOCKETS = {
    "audit": "/ws/ops/",
    "runs": "/ws/ops/",
    "run": "/ws/ops/",
    "repositories": "/ws/repos/",
}


def live_socket_context(request: HttpRequest) -> dict[str, Any]:
    """Template context: ``page_socket`` — every page is live (base.html shows its dot)."""
    user = getattr(request, "user", None)
    match = getattr(request, "resolver_match", None)
    if user is None or not user.is_authenticated or match is None:
        return {}
    socket = _PAGE_SOCKETS.get(match.url_name or "")
    if socket == "/ws/ops/" and not user.has_perm("dashboard.view_jobrun"):
        return {}
    return {"page_socket": socket} if socket else {}
