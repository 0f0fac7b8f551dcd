"""dashboard.apps.DashboardConfig.ready: gitward's system checks are registered, and a
logout tells the user's open sockets (their group on the real channel layer) to close."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.apps import apps
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_out
from django.core.checks import registry
from django.test import Client

from dashboard.infra import system_checks
from dashboard.infra.events import user_group

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_app_is_dashboard_with_big_auto_ids_and_registers_gitwards_checks() -> None:
    config = apps.get_app_config("dashboard")
    assert config.default_auto_field == "django.db.models.BigAutoField"
    registered = registry.registry.get_checks()
    for check in (
        system_checks.check_lock_timing,
        system_checks.check_production,
        system_checks.check_timeouts,
    ):
        assert check in registered and "gitward" in check.tags  # type: ignore[attr-defined]


def test_the_logout_receiver_is_connected_once() -> None:
    receivers = [entry[0] for entry in user_logged_out.receivers]
    assert sum(1 for key in receivers if key[0] == "gitward-close-sockets") == 1
    apps.get_app_config("dashboard").ready()  # a second ready() (tests, reloads)
    receivers = [entry[0] for entry in user_logged_out.receivers]
    assert sum(1 for key in receivers if key[0] == "gitward-close-sockets") == 1


async def next_message(channel: str, timeout: float = 10.0) -> dict[str, object]:
    layer = get_channel_layer()
    return await asyncio.wait_for(layer.receive(channel), timeout)  # type: ignore[union-attr]


def test_a_logout_sends_session_ended_to_that_users_sockets_only() -> None:
    alice = User.objects.create_user("alice", password="pw-alice-123")
    bob = User.objects.create_user("bob", password="pw-bob-12345")
    client = Client()
    client.force_login(alice)

    async def scenario() -> None:
        layer = get_channel_layer()
        assert layer is not None
        mine, theirs = await layer.new_channel(), await layer.new_channel()
        await layer.group_add(user_group(alice.pk), mine)
        await layer.group_add(user_group(bob.pk), theirs)
        await sync_to_async(client.post)("/logout/")
        assert await next_message(mine) == {"type": "session.ended"}
        with pytest.raises(TimeoutError):
            await next_message(theirs, timeout=0.5)  # bob stays signed in
        # A logout with no one signed in sends nothing (and does not fail).
        await sync_to_async(Client().post)("/logout/")
        with pytest.raises(TimeoutError):
            await next_message(mine, timeout=0.5)

    asyncio.run(scenario())
