from __future__ import annotations

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_out

# Imported for its effect: the module registers gitward's system checks (dashboard/checks.py).
from dashboard import checks  # noqa: F401
from dashboard.live import close_user_sockets


class DashboardConfig(AppConfig):
    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        def on_logout(sender: object, request: object, user: object, **kwargs: object) -> None:
            if user is not None and getattr(user, "pk", None):
                close_user_sockets(user.pk)  # type: ignore[attr-defined]

        user_logged_out.connect(on_logout, weak=False, dispatch_uid="gitward-close-sockets")
