"""Site-wide endpoints that belong to no page group: the favicon and the anonymous
liveness and readiness probes. The pages are in modules named after what they show:
``ops`` (overview, locks, workers, dead letters, audit), ``runs``,
``repositories``, ``commits`` and ``rollouts``."""

from __future__ import annotations

from pathlib import Path

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.operations import check_readiness

FAVICON = Path(__file__).resolve().parents[1] / "static" / "favicon.svg"


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico`` for browsers that ask before reading the page's icon link."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


def readyz(request: HttpRequest) -> HttpResponse:
    """Readiness (``dashboard.operations.readiness``): 200 when the database is migrated and a
    majority of lock masters and the queue Redis answer, else 503; the JSON body names
    every check and what failed. Anonymous, like ``/healthz``: it reveals no more than
    which dependency is down (host:port, never a password)."""
    readiness = check_readiness(timeout=0.5)
    return JsonResponse(readiness.as_dict(), status=200 if readiness.ready else 503)
