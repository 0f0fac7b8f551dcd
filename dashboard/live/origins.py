"""Websocket Origin policy (docs/security.md#d5).

A browser sends the user's cookies with a websocket opened by *any* page, so the Origin
header is the only thing that tells our pages from someone else's. Accepted: scheme
http or https (https only in production), a host in ALLOWED_HOSTS, and a port that is
ours (the port `up` serves on, 80/443 for proxies, or a port in
GITWARD_CSRF_TRUSTED_ORIGINS). Missing, ``null``, other schemes, look-alike hosts and
other local ports (another app on localhost) are refused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.http.request import is_same_domain


class StrictOriginValidator(OriginValidator):
    def __init__(self, application: Any) -> None:
        super().__init__(application, allowed_origins=[])

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None or parsed_origin.hostname is None:
            return False
        schemes = {"https"} if settings.PRODUCTION else {"http", "https"}
        if parsed_origin.scheme not in schemes:
            return False
        host = parsed_origin.hostname.lower()
        if not any(
            is_same_domain(host, pattern.strip("[]").lower()) for pattern in settings.ALLOWED_HOSTS
        ):
            return False
        port = parsed_origin.port or (443 if parsed_origin.scheme == "https" else 80)
        ports = {int(settings.PORT), 80, 443}
        ports.update(urlparse(o).port or 0 for o in settings.CSRF_TRUSTED_ORIGINS)
        return port in ports
