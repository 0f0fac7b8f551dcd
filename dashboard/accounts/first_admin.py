"""The first user."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model


def ensure_admin() -> str | None:
    """Create user ``admin`` when no user exists; return the generated password (to
    print once), or None when a user existed or the password came from the environment.

    Race: two ``up`` processes on one database both see no user; the second create
    fails on the unique username and is ignored.
    """
    User = get_user_model()
    if User.objects.exists():
        return None
    password = settings.ADMIN_PASSWORD or secrets.token_urlsafe(12)
    try:
        User.objects.create_superuser("admin", "", password)
    except Exception:
        if User.objects.filter(username="admin").exists():
            return None
        raise
    return None if settings.ADMIN_PASSWORD else password
