"""The Prometheus scrape endpoint, ``GET /metrics``."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from dashboard.api.endpoint import api_view, error, operator_refusal
from dashboard.infra import RedisUnavailable
from dashboard.operations import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dashboard.operations import metrics_text


@api_view(("GET",))
def _metrics_for_operators(request: HttpRequest) -> HttpResponse:
    if (refused := operator_refusal(request)) is not None:
        return refused
    return HttpResponse(metrics_text(), content_type=METRICS_CONTENT_TYPE)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint: a client in ``GITWARD_METRICS_NETWORKS`` (by
    REMOTE_ADDR, so behind a proxy list the proxy only if it does not forward the public
    to /metrics), else an operator's session or bearer token (``view_jobrun``)."""
    if request.method == "GET" and _in_networks(request.META.get("REMOTE_ADDR", "")):
        try:
            return HttpResponse(metrics_text(), content_type=METRICS_CONTENT_TYPE)
        except RedisUnavailable as exc:
            return error(str(exc), 503)
    return _metrics_for_operators(request)


def _in_networks(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net) for net in settings.METRICS_NETWORKS)
