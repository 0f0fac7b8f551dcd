"""``manage.py hook_secret REPO``: issue a repository's push webhook secret and print it
with the webhook's path (docs/api.md#push-webhooks). Audited as ``cli``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from dashboard.management.operator import CLI_OPERATOR
from dashboard.management.terminal import plain
from dashboard.models import Repository
from dashboard.repositories import HookRefused, issue_secret, resolve_repository


class Command(BaseCommand):
    help = "Issue a new push webhook secret for a repository (the old one stops working)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("repo", help="repository id or URL")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            repo = resolve_repository(options["repo"])
        except Repository.DoesNotExist:
            raise CommandError(f"no repository {plain(repr(options['repo']))}") from None
        try:
            secret = issue_secret(repo, CLI_OPERATOR)
        except HookRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"secret {secret}")
        self.stdout.write(f"url    {reverse('api-hook-push', args=[repo.pk])}")
