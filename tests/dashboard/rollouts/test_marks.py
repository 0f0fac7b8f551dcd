"""Rollout marks on the Overview's throughput and failure charts (docs/rollouts.md#chart-marks):
each transition of a rollout's version inside the charts' 24 hours is a labelled vertical
mark at its time; older transitions are not drawn."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dashboard.models import RolloutEvent
from dashboard.operations.queue_stats import day_series
from dashboard.rollouts.marks import transition_marks
from dashboard.web.charts import DAY_WIDTH, LEFT
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    _release_drivers,
    start,
    verify,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_transition_in_the_window_is_marked_on_both_charts(client: Client) -> None:
    ro, driver = start(steps=[30, 100])
    ro = verify(ro, driver)
    from dashboard.rollouts import start as rollouts_start

    rollouts_start.request_action(rollout=ro, action="promote", actor="erin")
    assert driver.tick()  # verified → ramping 30%
    # The warming transition happened three days ago: outside the charts' window.
    old = RolloutEvent.objects.get(rollout=ro, action="transition", to_state="warming")
    RolloutEvent.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=3))
    events = list(
        RolloutEvent.objects.filter(rollout=ro, action="transition", version=ro.version)
        .exclude(pk=old.pk)
        .order_by("at", "id")
    )
    assert [e.to_state for e in events] == ["verified", "ramping"]

    day = day_series()
    start_at = datetime.fromisoformat(day["hours"][0])
    marks = transition_marks(start_at, start_at + timedelta(hours=24))
    assert [m["label"] for m in marks] == [f"#{ro.pk} verified", f"#{ro.pk} 30%"]
    assert [m["at"] for m in marks] == [e.at for e in events]

    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    page = client.get("/").content.decode()
    charts = page.split('id="day-charts"')[1].split("</section>")[0]
    svgs = charts.split("<svg")[1:]
    assert len(svgs) == 3
    plot_w = DAY_WIDTH - LEFT
    for svg in svgs[:2]:  # throughput, failures
        drawn = re.findall(
            r'<g class="rollout-mark"><line class="mark" x1="([\d.]+)".*?'
            r'<text class="mark-label"[^>]*>([^<]*)</text><title>([^<]*)</title></g>',
            svg,
        )
        assert [html.unescape(label) for _, label, _ in drawn] == [
            f"#{ro.pk} verified", f"#{ro.pk} 30%",
        ]  # fmt: skip
        for (x, _, title), ev in zip(drawn, events, strict=True):
            offset = (ev.at - start_at).total_seconds() / (24 * 3600)
            assert float(x) == round(LEFT + plot_w * offset, 1)
            assert html.unescape(title).startswith(f"rollout #{ro.pk} analysis@{ro.version.fp12}: ")
    assert "rollout-mark" not in svgs[2]  # the backlog chart has none
    assert "2 rollout marks" in charts


def test_the_previous_version_superseded_at_a_promote_is_not_a_second_mark() -> None:
    ro, driver = start(steps=[100])
    ro = verify(ro, driver)
    from dashboard.rollouts import steps

    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=100, token=token, actor="erin")
    steps.promote(rollout=ro, token=token, actor="erin")
    now = timezone.now()
    marks = transition_marks(now - timedelta(hours=1), now + timedelta(seconds=1))
    assert [m["label"] for m in marks] == [
        f"#{ro.pk} warming", f"#{ro.pk} verified", f"#{ro.pk} 100%", f"#{ro.pk} current",
    ]  # fmt: skip
    assert RolloutEvent.objects.filter(rollout=ro, to_state="draining").count() == 1
