"""``manage.py api_token USER``: issue an API bearer token (printed once)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard.models import ApiToken


class Command(BaseCommand):
    help = "Create an API token for USER and print it (only its hash is stored)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("user")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        user = User.objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"no user {options['user']!r}")
        _, raw = ApiToken.issue(user)
        self.stdout.write(raw)
