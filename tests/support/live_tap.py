"""Listen to live events the way a consumer does: a real channel on the real channel
layer (Redis), joined to a group. No mock: what a test reads is what a browser gets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from dashboard.infra.events import OPS_GROUP, repo_group

Event = dict[str, Any]


class Tap:
    """A channel in ``group`` (operators' group by default) collecting events."""

    def __init__(self, group: str = OPS_GROUP) -> None:
        self.layer = get_channel_layer()
        self.channel: str = async_to_sync(self.layer.new_channel)()
        async_to_sync(self.layer.group_add)(group, self.channel)
        self.events: list[Event] = []

    def until(self, done: Callable[[list[Event]], bool], *, timeout: float = 10.0) -> list[Event]:
        """Collect events until ``done(events)`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout

        async def one(wait: float) -> Event:
            message = await asyncio.wait_for(self.layer.receive(self.channel), timeout=wait)
            return message["event"]  # type: ignore[no-any-return]

        while not done(self.events):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"events never matched; got {self.events}")
            try:
                self.events.append(async_to_sync(one)(left))
            except TimeoutError:
                continue
        return self.events

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


def repo_tap(repo_id: int) -> Tap:
    """A tap on one repository's watchers' group."""
    return Tap(repo_group(repo_id))
