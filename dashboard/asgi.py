"""ASGI entry point: HTTP through Django, websockets through Channels.

Websockets are authenticated from the session cookie and their Origin must be ours
(``dashboard.origins``: a page on another site cannot use our user's cookie);
consumers then check permissions themselves.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from dashboard.consumers import (  # noqa: E402
    OpsConsumer,
    RepositoryConsumer,
    RepositoryListConsumer,
    RolloutsConsumer,
)
from dashboard.origins import StrictOriginValidator  # noqa: E402

websocket_urls = [
    path("ws/ops/", OpsConsumer.as_asgi()),
    path("ws/repos/", RepositoryListConsumer.as_asgi()),
    path("ws/repos/<int:repo_id>/", RepositoryConsumer.as_asgi()),
    path("ws/rollouts/", RolloutsConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi,
        "websocket": StrictOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urls))),
    }
)
