from __future__ import annotations

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_out


class DashboardConfig(AppConfig):
    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: this module is loaded while the app registry is
        # being built, and these reach dashboard.models (Django's documented place for
        # such imports is ready()). install_hooks registers gitward's system checks
        # (dashboard/infra/system_checks.py) and the database pool's at-fork hook.
        from django.urls import register_converter

        from dashboard.infra import IdConverter, close_user_sockets, install_hooks

        install_hooks()
        # ``<id:...>`` in dashboard/urls.py and the websocket routes: an int bounded to
        # the 64-bit id range (dashboard/infra/inputs.py; docs/api.md#limits).
        register_converter(IdConverter, "id")

        def on_logout(sender: object, request: object, user: object, **kwargs: object) -> None:
            if user is not None and getattr(user, "pk", None):
                close_user_sockets(user.pk)  # type: ignore[attr-defined]

        user_logged_out.connect(on_logout, weak=False, dispatch_uid="gitward-close-sockets")

        # The webhook outbox is written with each rollout event, in its transaction
        # (dashboard/rollouts/notifications.py; docs/rollouts.md#notifications).
        from dashboard.rollouts import connect_notifications

        connect_notifications()
