"""ASGI entry point: HTTP through Django (on pooled request threads:
``dashboard.server.request_threads``), websockets through Channels.

Websockets are authenticated from the session cookie and their Origin must be ours
(``dashboard.live.origins``: a page on another site cannot use our user's cookie);
consumers then check permissions themselves.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application

from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402

from dashboard.server.request_threads import PooledASGIHandler, keep_sqlite_connections  # noqa: E402

# Django's ASGI handler, with each request's middleware chain and view in one hop to a
# pooled thread (dashboard/server/request_threads.py), which hands its database connection back
# before the response is sent. (Pooled threads were once SQLite-only: on PostgreSQL the
# suite ran the pool dry. The causes were lease callbacks that kept connections
# (dashboard/locks/leases.py) and Django's hand-back at response.close(), which under the test
# harness ran outside the request's context; neither holds a slot any more.)
django_asgi: ASGIHandler = PooledASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from dashboard.live.consumers import (  # noqa: E402
    OpsConsumer,
    RepositoryConsumer,
    RepositoryListConsumer,
    RolloutsConsumer,
    UnknownPathConsumer,
)
from dashboard.live.origins import StrictOriginValidator  # noqa: E402

websocket_urls = [
    path("ws/ops/", OpsConsumer.as_asgi()),
    path("ws/repos/", RepositoryListConsumer.as_asgi()),
    path("ws/repos/<id:repo_id>/", RepositoryConsumer.as_asgi()),
    path("ws/rollouts/", RolloutsConsumer.as_asgi()),
    # Last: any other path (and an id past the 64-bit range) is refused cleanly.
    re_path(r"", UnknownPathConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi,
        "websocket": StrictOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urls))),
    }
)


def serving() -> ProtocolTypeRouter:
    """The application as ``manage.py up`` serves it (uvicorn's factory: called once in
    each web process before it serves): ``application``, with the request threads'
    SQLite connections kept between requests (``dashboard.server.request_threads``). Importing
    this module changes no setting; only a process that serves does."""
    keep_sqlite_connections(settings.DATABASES)
    return application
