"""Whole pages reused across viewers for ``GITWARD_SNAPSHOT_TTL`` (load test, BENCHMARKS.md): the
operations pages and the repository list, whose content is the same for every viewer
with the same permissions except two things, the viewer's name in the header and the
CSRF token of their forms.

A page is rendered with two markers in their place (``page_marks``, a context
processor that overrides the ``csrf_token`` Django puts in every request context and
provides ``viewer_name`` for base.html), stored, and every response — the first one
too — is the stored text with the markers replaced by the asking user's escaped name
and a CSRF token of their own session (``get_token``: it also sets their CSRF cookie
when they have none, as the ``{% csrf_token %}`` tag does). So nothing of one user's
session reaches another: the markers are random per process (unguessable, so no
repository name or commit message can contain one), and a render that consumed a
flash message (``django.contrib.messages``, per user) is neither reused nor stored.

Who may reuse a stored page: a request for the same path and query string by a user
with the same permission signature (active, staff, superuser, their permission set:
everything the templates and ``snapshots.user_can`` decide by), arriving at most the
TTL after the stored render began, and after the latest event this process published
for that user (``live.OWN_EVENTS``: their own actions, and those of nobody in
particular), while this process still holds the snapshot copies it was rendered with
(``snapshots.copy_generation``: a newer copy, taken for a socket or a page that needed
one, retires every page stored before it). That is the operations snapshot's contract
(``dashboard.live.snapshots``): a page may be up to the TTL older than a fresh render, may
miss another user's action as a page drawn from any copy may, never the viewer's own
action served here; its live socket's first snapshot corrects it (gitward.js fetches
the live regions of a reused page afresh once its socket has joined).

The permission check of the view's decorators (``login_required``) runs before the
reuse, every time; views decorated here repeat their ``view_jobrun`` check inside,
which a reused page skips, so the signature carries the permission set that check
reads.

Only GET responses with status 200 and no header but ``Content-Type`` are stored (a
redirect, a 403, a response setting a cookie are each the view's own every time). The
store is per process, bounded (``LIMIT`` entries, the oldest dropped first), and a TTL
of 0 turns it off.

Race: two threads that miss at once both render and the last one stays; both began
within the rules, so either is as fresh as they ask. Entries are replaced whole, never
changed, so a reader sees one consistent entry.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.utils.html import escape

from dashboard.infra import OWN_EVENTS
from dashboard.live.snapshots import copy_generation

#: Random per process: a marker in a stored page stands for the asker's own value.
CSRF_MARK = f"gwcsrf{secrets.token_hex(16)}"
USER_MARK = f"gwuser{secrets.token_hex(16)}"
REUSED_MARK = f"gwreused{secrets.token_hex(16)}"
#: A live region's refetch (gitward.js ``fetchFresh``) after an event: rendered afresh,
#: since a stored page may predate the event it fetches for (and then stored).
FRESH_HEADER = "X-Gitward-Fresh"
LIMIT = 256

#: ``{key: (render start (wall clock), copy_generation() then, status, type, text)}``
_Entry = tuple[float, tuple[Any, ...], int, str, str]
_ENTRIES: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
_LOCK = threading.Lock()
_RECORDING = "_gitward_page_marks"


def page_marks(request: HttpRequest) -> dict[str, Any]:
    """Template context (``TEMPLATES`` context processors, after Django's own ``csrf``):
    the markers while a reusable page renders, else the viewer's own values."""
    if getattr(request, _RECORDING, False):
        return {"csrf_token": CSRF_MARK, "viewer_name": USER_MARK, "page_reused": REUSED_MARK}
    user = getattr(request, "user", None)
    return {"viewer_name": user.get_username() if user is not None else "", "page_reused": "0"}


def signature(user: Any) -> tuple[Any, ...]:
    """Everything a page's content may depend on about its viewer, except their name."""
    if user.is_superuser:
        return (user.is_active, user.is_staff, True)
    return (user.is_active, user.is_staff, False, frozenset(user.get_all_permissions()))


def reusable(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a page view (under ``login_required``): see the module docstring."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        ttl = float(settings.SNAPSHOT_TTL)
        user = request.user
        if ttl <= 0 or request.method != "GET" or not user.is_authenticated:
            return view(request, *args, **kwargs)
        if len(getattr(request, "_messages", ())):  # a flash message for this user
            return view(request, *args, **kwargs)
        key = (view.__module__, view.__qualname__, request.get_full_path(), signature(user))
        now = time.time()
        with _LOCK:
            hit = None if request.headers.get(FRESH_HEADER) == "1" else _ENTRIES.get(key)
        generation = copy_generation()
        if hit is not None:
            started, rendered_with, status, content_type, text = hit
            if (
                now - started <= ttl
                and rendered_with == generation
                and OWN_EVENTS.last_for(int(user.pk)) < started
            ):
                text = _personal(request, text, reused=True)
                return HttpResponse(text, status=status, content_type=content_type)
        setattr(request, _RECORDING, True)
        try:
            response = view(request, *args, **kwargs)
        finally:
            setattr(request, _RECORDING, False)
        if getattr(response, "streaming", False):  # not a rendered template: as it is
            return response
        text = response.content.decode(response.charset)
        if (
            response.status_code == 200
            and not response.cookies
            and set(response.headers) == {"Content-Type"}
            # A copy taken during the render (by it or another thread): which one the
            # page shows is unknown, so it is not stored; the next request stores.
            and copy_generation() == generation
        ):
            _store(key, (now, generation, response.status_code, response["Content-Type"], text))
        # The view's own response, headers and cookies kept (a redirect's Location).
        response.content = _personal(request, text, reused=False).encode(response.charset)
        return response

    return wrapper


def _personal(request: HttpRequest, text: str, *, reused: bool) -> str:
    """The stored text with the asker's own name and CSRF token, and ``data-reused``
    on the body telling gitward.js whether to refetch its live regions once its socket
    is joined (a reused page may predate an event sent before the join)."""
    text = text.replace(REUSED_MARK, "1" if reused else "0")
    if CSRF_MARK in text:
        text = text.replace(CSRF_MARK, get_token(request))
    return text.replace(USER_MARK, escape(request.user.get_username()))


def _store(key: tuple[Any, ...], entry: _Entry) -> None:
    with _LOCK:
        _ENTRIES[key] = entry
        _ENTRIES.move_to_end(key)
        while len(_ENTRIES) > LIMIT:
            _ENTRIES.popitem(last=False)


def clear() -> None:
    """Forget every stored page (tests)."""
    with _LOCK:
        _ENTRIES.clear()
