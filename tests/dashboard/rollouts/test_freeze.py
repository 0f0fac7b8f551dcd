"""Freeze windows and stop-the-line (docs/rollouts.md#freeze-windows): starting, ramping up
and promoting are refused with a 409 naming the window, an ``auto`` driver waits and says
until when, rollback and abort stay allowed. Real database, real Redis, real driver."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.utils import timezone

from dashboard.models import AnalyzerVersion, ApiToken, AuditEntry, Rollout, RolloutEvent
from dashboard.rollouts import freeze
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts.freeze import RolloutFrozen
from dashboard.versions.state_machine import ensure_baseline
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    PASSING,
    RENAMES,
    _release_drivers,
    start,
    verify,
)

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State


def _window(name: str, *, hours: float = 2.0) -> dict[str, str]:
    now = timezone.now()
    return {
        "name": name,
        "from": (now - timedelta(hours=1)).isoformat(),
        "until": (now + timedelta(hours=hours)).isoformat(),
    }


def a_token(name: str, *perms: str) -> str:
    user = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=True)
    for p in perms:
        user.user_permissions.add(Permission.objects.get(codename=p))
    return ApiToken.issue(user)[1]


def post(client: Client, path: str, token: str, body: object) -> object:
    return client.post(
        path,
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


# ---------------------------------------------------------------------------- windows


def test_an_absolute_window_is_open_from_its_start_until_its_end() -> None:
    w = {
        "name": "year-end",
        "from": "2026-12-20T00:00:00+00:00",
        "until": "2027-01-04T00:00:00+00:00",
    }
    end = datetime(2027, 1, 4, tzinfo=UTC)
    assert freeze.window_at(w, datetime(2026, 12, 19, 23, 59, tzinfo=UTC)) is None
    assert freeze.window_at(w, datetime(2026, 12, 20, tzinfo=UTC)) == end
    assert freeze.window_at(w, datetime(2027, 1, 3, 23, 59, tzinfo=UTC)) == end
    assert freeze.window_at(w, end) is None


def test_a_weekly_window_opens_on_its_days_and_may_cross_midnight() -> None:
    # Friday 18:00 to Monday 06:00 is three nights: each of fri, sat, sun 18:00 → 06:00.
    w = {"name": "weekend", "days": [4, 5, 6], "start": "18:00", "end": "06:00"}
    fri = datetime(2026, 12, 4, tzinfo=UTC)  # a Friday
    assert fri.weekday() == 4
    assert freeze.window_at(w, fri + timedelta(hours=17, minutes=59)) is None
    assert freeze.window_at(w, fri + timedelta(hours=18)) == fri + timedelta(days=1, hours=6)
    # Monday 05:00 is still Sunday's night; Monday 06:00 and Monday 18:00 are not frozen.
    mon = fri + timedelta(days=3)
    assert freeze.window_at(w, mon + timedelta(hours=5)) == mon + timedelta(hours=6)
    assert freeze.window_at(w, mon + timedelta(hours=6)) is None
    assert freeze.window_at(w, mon + timedelta(hours=18)) is None
    # Thursday night is not listed; Friday 03:00 belongs to Thursday's (absent) night.
    assert freeze.window_at(w, fri + timedelta(hours=3)) is None
    daily = {"name": "lunch", "days": list(range(7)), "start": "12:00", "end": "13:30"}
    assert freeze.window_at(daily, fri + timedelta(hours=13)) == fri + timedelta(
        hours=13, minutes=30
    )


def test_the_freeze_in_force_is_stop_the_line_first_then_the_window_ending_last() -> None:
    now = timezone.now()
    short, long = _window("short", hours=1), _window("long", hours=5)
    with override_settings(FREEZE_WINDOWS=[short, long]):
        active = freeze.active_freeze(now)
        assert active is not None and active.name == "long"
        assert active.until == datetime.fromisoformat(long["until"])
        freeze.set_stop_the_line(on=True, actor="erin", reason="incident 12")
        active = freeze.active_freeze(now)
        assert active is not None and (active.name, active.until, active.reason) == (
            "stop-the-line", None, "incident 12",
        )  # fmt: skip
        freeze.set_stop_the_line(on=False, actor="erin", reason="resolved")
        assert freeze.active_freeze(now).name == "long"  # type: ignore[union-attr]
    assert freeze.active_freeze(now) is None
    audit = AuditEntry.objects.filter(action="rollout.stop_the_line").order_by("id")
    assert [(a.actor, a.outcome) for a in audit] == [("erin", "off → on"), ("erin", "on → off")]


# ---------------------------------------------------------------------------- refusals


def test_starting_during_a_window_is_refused_with_a_409_naming_it(client: Client) -> None:
    ensure_baseline(actor="setup")
    token = a_token("ci", "start_rollout")
    with override_settings(FREEZE_WINDOWS=[_window("release-freeze")]):
        with pytest.raises(RolloutFrozen, match="freeze window 'release-freeze' until "):
            rollouts_start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False)
        res = post(client, "/api/rollouts", token, {"config": RENAMES})
        assert res.status_code == 409  # type: ignore[attr-defined]
        assert "'release-freeze'" in res.json()["error"]  # type: ignore[attr-defined]
    assert not Rollout.objects.exists()  # refused before anything was written
    res = post(client, "/api/rollouts", token, {"config": RENAMES})
    assert res.status_code == 202  # type: ignore[attr-defined]


def test_promote_during_a_freeze_is_a_409_and_rollback_stays_allowed(client: Client) -> None:
    ro, driver = start(steps=[20, 100])
    ro = verify(ro, driver)
    token = a_token("op", "start_rollout", "rollback_rollout")
    freeze.set_stop_the_line(on=True, actor="erin", reason="incident 12")
    res = post(client, f"/api/rollouts/{ro.pk}/promote", token, {})
    assert res.status_code == 409  # type: ignore[attr-defined]
    assert res.json()["error"] == (  # type: ignore[attr-defined]
        "promote refused: stop-the-line is on: incident 12 (rollback and abort stay allowed)"
    )
    assert Rollout.objects.get(pk=ro.pk).pending_action is None
    res = post(client, f"/api/rollouts/{ro.pk}/rollback", token, {"reason": "bad numbers"})
    assert res.status_code == 202  # type: ignore[attr-defined]
    assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.DRAINING
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ROLLING_BACK


def test_a_request_filed_before_the_freeze_is_refused_by_the_driver() -> None:
    ro, driver = start(steps=[20, 100])
    ro = verify(ro, driver)
    rollouts_start.request_action(rollout=ro, action="promote", actor="erin")
    with override_settings(FREEZE_WINDOWS=[_window("change-freeze")]):
        assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.VERIFIED
    failed = RolloutEvent.objects.get(rollout=ro, action="action.failed")
    assert failed.detail["error"].startswith("promote refused: freeze window 'change-freeze'")


def test_lowering_the_ramp_is_allowed_during_a_freeze_raising_it_is_not() -> None:
    ro, driver = start(steps=[20, 50, 100])
    ro = verify(ro, driver)
    rollouts_start.request_action(rollout=ro, action="set_ramp", actor="erin",
                                  params={"percent": 50})  # fmt: skip
    assert driver.tick()
    freeze.set_stop_the_line(on=True, actor="erin", reason="incident")
    with pytest.raises(RolloutFrozen):
        rollouts_start.request_action(rollout=ro, action="set_ramp", actor="erin",
                                      params={"percent": 100})  # fmt: skip
    rollouts_start.request_action(rollout=ro, action="set_ramp", actor="erin",
                                  params={"percent": 20})  # fmt: skip
    assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == 20


def test_an_auto_driver_waits_out_the_window_and_says_until_when(client: Client) -> None:
    ro, driver = start(steps=[20, 100], auto=True, options={"step_pause": 0, "min_samples": 0})
    ro = verify(ro, driver)
    window = _window("deploy-freeze")
    with override_settings(FREEZE_WINDOWS=[window]):
        assert driver.tick() and driver.tick()
        assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.VERIFIED
        waiting = list(RolloutEvent.objects.filter(rollout=ro, action="freeze.waiting"))
        assert len(waiting) == 1  # said once, not at every poll
        assert waiting[0].detail["window"] == "deploy-freeze"
        assert waiting[0].detail["until"] == datetime.fromisoformat(window["until"]).isoformat()
        until = waiting[0].detail["until"]
        assert waiting[0].reason == (
            f"waiting for deploy-freeze to end before ramp to 20% (until {until})"
        )
    assert driver.tick()  # the window is over: the step is taken
    version = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert (version.state, version.ramp_percent) == (S.RAMPING, 20)
    assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == 100
    # A stop-the-line before the promote: it waits for the switch, then promotes.
    freeze.set_stop_the_line(on=True, actor="erin", reason="incident")
    assert driver.tick()
    last = RolloutEvent.objects.filter(rollout=ro, action="freeze.waiting").latest("id")
    assert (last.detail["window"], last.detail["until"], last.detail["step"]) == (
        "stop-the-line", None, "promote to current",
    )  # fmt: skip
    assert "until stop-the-line is switched off" in last.reason
    # The API, and `rollout status`, say what holds it back.
    token = a_token("viewer", "view_jobrun")
    got = client.get(f"/api/rollouts/{ro.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert (got["frozen"]["window"], got["frozen"]["until"], got["frozen"]["step"]) == (
        "stop-the-line", None, "promote to current",
    )  # fmt: skip
    # `rollout start --wait` prints each wait once, as its poll sees it.
    from django.core.management.base import OutputWrapper

    from dashboard.management.commands.rollout import Command

    cmd, printed = Command(), io.StringIO()
    cmd.stdout = OutputWrapper(printed)
    say = cmd._freeze_waits()
    say(ro)
    say(ro)
    waits = RolloutEvent.objects.filter(rollout=ro, action="freeze.waiting").order_by("id")
    assert printed.getvalue().splitlines() == [f"rollout {ro.pk} {w.reason}" for w in waits]
    assert len(waits) == 2
    out = io.StringIO()
    call_command("rollout", "status", stdout=out)
    assert out.getvalue().splitlines()[-1] == (
        "frozen: stop-the-line is on: incident (rollback and abort stay allowed)"
        " (promote to current waits)"
    )
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.RAMPING
    freeze.set_stop_the_line(on=False, actor="erin", reason="resolved")
    assert not driver.tick()
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.COMPLETED


# ---------------------------------------------------------------------------- API and CLI


def test_the_freeze_api_shows_and_flips_stop_the_line(client: Client) -> None:
    viewer = a_token("viewer", "view_jobrun")
    admin = a_token("admin", "rollback_rollout")
    with override_settings(FREEZE_WINDOWS=[]):
        got = client.get("/api/rollouts/freeze", HTTP_AUTHORIZATION=f"Bearer {viewer}").json()
        assert (got["frozen"], got["active"], got["windows"]) == (False, None, [])
        assert (
            post(client, "/api/rollouts/freeze", viewer, {"on": True, "reason": "x"}).status_code
            == 403
        )  # type: ignore[attr-defined]
        for bad in ({"on": "yes"}, {"on": True}, {"on": True, "reason": "x", "extra": 1},
                    {"on": True, "reason": "a\x1bb"}):  # fmt: skip
            res = post(client, "/api/rollouts/freeze", admin, bad)
            assert res.status_code == 400 and "error" in res.json(), bad  # type: ignore[attr-defined]
        assert not freeze.stop_the_line()["on"]
        res = post(client, "/api/rollouts/freeze", admin, {"on": True, "reason": "incident 7"})
        assert res.status_code == 200  # type: ignore[attr-defined]
        body = res.json()  # type: ignore[attr-defined]
        assert body["frozen"] is True and body["active"]["window"] == "stop-the-line"
        assert (body["stop_the_line"]["on"], body["stop_the_line"]["actor"]) == (True, "admin")
        res = post(client, "/api/rollouts/freeze", admin, {"on": False})
        assert res.json()["frozen"] is False  # type: ignore[attr-defined]
    refused = AuditEntry.objects.filter(
        action="rollout.stop_the_line", outcome__startswith="refused"
    )
    assert refused.count() == 5


def test_the_cli_flips_stop_the_line_with_a_reason() -> None:
    with pytest.raises(CommandError, match="needs --reason"):
        call_command("rollout", "freeze", "on", "--actor", "ops")
    out = io.StringIO()
    with override_settings(
        FREEZE_WINDOWS=[{"name": "weekend", "days": [5, 6], "start": "00:00", "end": "24:00"}]
    ):
        call_command(
            "rollout", "freeze", "on", "--reason", "incident 9", "--actor", "ops", stdout=out
        )
    text = out.getvalue()
    assert "frozen: stop-the-line is on: incident 9" in text
    assert "window weekend: 00:00–24:00 UTC starting on sat,sun" in text
    out = io.StringIO()
    call_command("rollout", "freeze", "off", "--actor", "ops", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert (data["frozen"], data["stop_the_line"]["on"], data["stop_the_line"]["actor"]) == (
        False, False, "ops",
    )  # fmt: skip


def test_the_promote_button_is_disabled_during_a_freeze_naming_the_window(
    client: Client,
) -> None:
    """The page does not offer a promote the freeze would refuse: the button is shown
    disabled with the window and its end (docs/rollouts.md#freeze-windows)."""
    ro, driver = start(steps=[20, 100])
    verify(ro, driver)
    user = User.objects.create_user("erin", password="pw-erin-123", is_staff=True)
    for codename in ("view_jobrun", "start_rollout"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    offer = f'data-confirm="/rollouts/{ro.pk}/promote/"'
    assert offer in client.get(f"/rollouts/{ro.pk}/").content.decode()
    window = _window("year-end")
    with override_settings(FREEZE_WINDOWS=[window]):
        page = client.get(f"/rollouts/{ro.pk}/").content.decode()
    assert offer not in page
    assert '<button type="button" class="small" disabled title="Frozen: freeze window' in page
    assert (
        f"Frozen: freeze window &#x27;year-end&#x27; until {window['until']} (rollback and "
        "abort stay allowed)"
    ) in page
