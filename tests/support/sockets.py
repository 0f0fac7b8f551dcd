"""Users and websocket clients of the real ASGI application (Origin check, session
cookie, consumers), for the live-view, consumer and rollout-page tests."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission, User
from django.test import Client

from dashboard.asgi import application

#: The Origin header of one of our own pages.
ORIGIN = (b"origin", b"http://localhost")


def make_user(name: str, *, staff: bool = False, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=staff)
    if perms:
        user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    return user


def session_headers(user: User, origin: tuple[bytes, bytes] | None = ORIGIN) -> list:
    """The headers of a browser signed in as ``user`` (a real session), on ``origin``."""
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    headers = [(b"cookie", cookie)]
    if origin:
        headers.append(origin)
    return headers


async def connect(path: str, headers: list) -> tuple[WebsocketCommunicator, bool, object]:
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await comm.connect(timeout=10)
    return comm, connected, code
