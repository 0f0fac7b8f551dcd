"""dashboard.live.origins: the websocket Origin policy, called directly (real websocket
handshakes with good and bad Origins are in tests/system/test_web_security.py)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from dashboard.live.origins import StrictOriginValidator


@pytest.fixture
def valid(settings):  # type: ignore[no-untyped-def]
    settings.ALLOWED_HOSTS = ["gitward.example", ".corp.example", "[::1]"]
    settings.PORT = 8000
    settings.PRODUCTION = False
    settings.CSRF_TRUSTED_ORIGINS = ["https://gitward.example:8443"]
    v = StrictOriginValidator(None)
    return lambda origin: v.valid_origin(urlparse(origin) if origin is not None else None)


@pytest.mark.parametrize(
    "origin",
    [
        "http://gitward.example:8000",
        "https://gitward.example",
        "http://gitward.example",
        "https://GITWARD.example:8443",
        "https://build.corp.example",
        "http://[::1]:8000",
    ],
)
def test_our_origins_are_accepted(valid, origin: str) -> None:  # type: ignore[no-untyped-def]
    assert valid(origin)


@pytest.mark.parametrize(
    "origin",
    [
        None,
        "null",
        "file:///x",
        "ws://gitward.example:8000",
        "http://gitward.example.evil.com:8000",
        "http://evilgitward.example:8000",
        "http://gitward.example:9000",  # another app on the same host
        "http://localhost:8000",
    ],
)
def test_other_origins_are_refused(valid, origin: str | None) -> None:  # type: ignore[no-untyped-def]
    assert not valid(origin)


def test_production_accepts_https_only(valid, settings) -> None:  # type: ignore[no-untyped-def]
    settings.PRODUCTION = True
    assert not valid("http://gitward.example:8000")
    assert valid("https://gitward.example")
