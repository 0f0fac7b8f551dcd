"""What every JSON API endpoint shares (docs/api.md): authentication (session or
``Authorization: Bearer <token>``), the method check, the rate limit, the body and
parameter parsing, the permission checks, and the error body.

Errors are JSON ``{"error": message}`` with a 4xx status; unexpected failures are
logged and answered with a generic JSON error, never a traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import redis
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found

from dashboard import infra
from dashboard.accounts import check, record_audit
from dashboard.infra import RedisUnavailable
from dashboard.models import ApiToken

log = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A malformed request body: ``api_view`` answers it with 400 and this message."""


def error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _bearer_user(request: HttpRequest) -> Any:
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return False
    token = (
        ApiToken.objects.select_related("user").filter(digest=ApiToken.hash(raw.strip())).first()
    )
    if token is None or not token.user.is_active:
        return False
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


def api_view(
    methods: tuple[str, ...],
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Authenticate (bearer token, else session + CSRF for unsafe methods), check the
    method, and turn every expected failure into a JSON 4xx."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error(f"method {request.method} not allowed", 405)
                response["Allow"] = ", ".join(methods)
                return response
            user = _bearer_user(request)
            if user is False:
                return error("invalid API token", 401)
            if user is None:
                if not request.user.is_authenticated:
                    return error("authentication required", 401)
                if request.method not in {"GET", "HEAD", "OPTIONS"}:
                    # Session-authenticated writes need the CSRF token like any form.
                    rejected = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(
                        request, None, (), {}
                    )
                    if rejected is not None:
                        return error("CSRF verification failed", 403)
            else:
                request.user = user
            limited = rate_limited(request, "api")
            if limited is not None:
                return limited
            try:
                return view(request, *args, **kwargs)
            except BadRequest as exc:
                return error(str(exc), 400)
            except RedisUnavailable as exc:
                return error(str(exc), 503)
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # a lock master
                log.warning("Redis unreachable on %s: %s", request.path, exc)
                return error(f"Redis unreachable: {type(exc).__name__}", 503)
            except Exception:
                log.exception("API error on %s", request.path)
                return error("internal error; the failure was logged", 500)

        return wrapper

    return decorate


def rate_limited(request: HttpRequest, scope: str) -> JsonResponse | None:
    """A JSON 429 with Retry-After when the user is over the scope's limit."""

    verdict = check(scope, request.user)
    if verdict.allowed:
        return None
    what = "submissions" if scope == "submit" else "API requests"
    response = error(f"too many {what}: at most {verdict.limit} per minute", 429)
    response["Retry-After"] = str(verdict.retry_after)
    return response


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object (or form fields); ``BadRequest`` for anything else:
    not JSON, nested past ``infra.MAX_JSON_DEPTH``, a NUL in any string
    (``dashboard.infra.inputs``), or not an object."""
    if request.content_type == "application/json":
        try:
            data = infra.parse_json(request.body or b"{}")
        except infra.BadInput as exc:
            raise BadRequest(str(exc)) from exc
        if not isinstance(data, dict):
            raise BadRequest("request body must be a JSON object")
        return data
    fields = {k: v for k, v in request.POST.items()}
    if any(infra.has_nul(k) or infra.has_nul(v) for k, v in fields.items()):
        raise BadRequest("a form field holds a NUL character")
    return fields


def id_list(value: Any, name: str, *, most: int) -> list[int]:
    """``value`` as a non-empty list of at most ``most`` row ids, each in the 64-bit
    range (``infra.is_db_id``: a larger one overflows SQLite's driver and PostgreSQL's
    bigint); ``BadRequest`` naming the field otherwise."""
    if not isinstance(value, list) or not value or not all(infra.is_db_id(v) for v in value):
        raise BadRequest(f'"{name}" must be a non-empty list of ids (1 … 2^63-1)')
    if len(value) > most:
        raise BadRequest(f'more than {most} ids in "{name}"')
    return value


def operator_refusal(request: HttpRequest) -> JsonResponse | None:
    """Operations data (locks, workers, dead letters with tracebacks) is for operators:
    the same ``dashboard.view_jobrun`` the pages and the websocket require."""
    if request.user.has_perm("dashboard.view_jobrun"):
        return None
    return error("operations data needs the view_jobrun permission", 403)


def permission_refusal(
    request: HttpRequest, perm: str, *, action: str, message: str
) -> JsonResponse | None:
    """None when the user may (``permitted``); else a 403 with ``message``, the refusal
    audited as ``action``."""
    if permitted(request, perm):
        return None
    record_audit(
        user=request.user, action=action, target=request.path, outcome="refused: permission denied"
    )
    return error(message, 403)


def permitted(request: HttpRequest, perm: str) -> bool:
    """Operator actions need staff status *and* the explicit permission."""
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(perm))


def int_param(request: HttpRequest, name: str, default: int, lo: int, hi: int) -> int:
    """A query parameter as an int clamped to [lo, hi]; ``default`` when not a number."""
    try:
        value = int(request.GET.get(name, default))
    except ValueError:
        return default
    return max(lo, min(hi, value))


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error("not found", 404)

    return page_not_found(request, exception or Exception())
