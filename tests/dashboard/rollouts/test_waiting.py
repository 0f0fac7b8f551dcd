"""Step deadlines and the waiting reason (docs/rollouts.md#step-deadlines,
docs/rollouts.md#waiting-reason): an automatic step that stays inconclusive follows the
policy chosen at start at its deadline — ``pause`` (the step stays, marked paused, an
operator's promote still works) or ``fail`` (rolled back, the verdict on the timeline) —
and while a step waits, the API and ``rollout status`` say what for and until when.
Real database, real Redis (the deploy lock), a real driver ticking."""

from __future__ import annotations

import json
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from dashboard.models import AnalyzerVersion, ApiToken, Rollout, RolloutEvent
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts import waiting
from dashboard.rollouts.checklist import describe_rollout
from dashboard.versions import state_machine
from tests.support.rollouts import (  # noqa: F401 (fixture)
    _release_drivers,
    start,
    verify,
)

pytestmark = [pytest.mark.django_db(transaction=True)]
S = AnalyzerVersion.State

#: Never enough samples (nothing runs in these tests) and no shadow work.
THIN = {"step_pause": 0, "min_samples": 1000, "shadow_commits": 0}


def ramping(options: dict[str, object]) -> tuple[Rollout, object]:
    ro, driver = start(auto=True, steps=[10, 100], options=options)
    verify(ro, driver)
    assert driver.tick()  # verified + auto → the first step
    version = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert (version.state, version.ramp_percent) == (S.RAMPING, 10)
    return Rollout.objects.get(pk=ro.pk), driver


def test_an_inconclusive_step_at_its_deadline_pauses_and_an_operator_still_promotes() -> None:
    ro, driver = ramping({**THIN, "step_deadline": 0})
    assert waiting.paused(ro) is None
    assert driver.tick()  # inconclusive, deadline passed: paused
    event = RolloutEvent.objects.get(rollout=ro, action="step.deadline")
    assert event.detail["policy"] == "pause" and event.detail["samples"] == 0
    assert event.reason == (
        "step 10%: still inconclusive at its deadline (0/1000 samples): paused for an operator"
    )
    ro.refresh_from_db()
    assert waiting.paused(ro) == event
    assert describe_rollout(ro)["waiting"] == {
        "reason": "step 10 %: paused at its deadline (0/1000 samples): "
        "waiting for an operator to promote or roll back",
        "until": None,
    }
    # Paused: the driver neither advances nor records the deadline again.
    assert driver.tick() and driver.tick()
    assert RolloutEvent.objects.filter(rollout=ro, action="step.deadline").count() == 1
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.ACTIVE
    # The operator's promote still works: the next step, with its own deadline.
    rollouts_start.request_action(rollout=ro, action="promote", actor="alice")
    assert driver.tick()  # the request, then the new step (its deadline is 0 too)
    version = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert (version.state, version.ramp_percent) == (S.RAMPING, 100)
    ro.refresh_from_db()
    again = waiting.paused(ro)
    assert again is not None and again != event and again.detail["percent"] == 100
    assert RolloutEvent.objects.filter(rollout=ro, action="step.deadline").count() == 2


def test_an_inconclusive_step_at_its_deadline_with_fail_is_rolled_back() -> None:
    ro, driver = ramping({**THIN, "step_deadline": 0, "on_inconclusive": "fail"})
    base = ro.previous
    assert driver.tick()
    ro.refresh_from_db()
    assert ro.state == Rollout.State.ROLLING_BACK
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.DRAINING
    assert state_machine.current_version().pk == base.pk
    event = RolloutEvent.objects.get(rollout=ro, action="step.deadline")
    reason = "step 10%: still inconclusive at its deadline (0/1000 samples): rolled back"
    assert (event.reason, event.detail["policy"]) == (reason, "fail")
    why = RolloutEvent.objects.get(rollout=ro, action="transition", to_state="draining")
    assert why.reason == reason


def test_before_its_deadline_a_step_waits_and_says_for_what_and_until_when(
    client: Client,
) -> None:
    ro, driver = ramping({**THIN, "step_deadline": 3600})
    assert driver.tick() and driver.tick()  # inconclusive, deadline far: it waits
    assert not RolloutEvent.objects.filter(rollout=ro, action="step.deadline").exists()
    ro.refresh_from_db()
    deadline = waiting.deadline_of(ro)
    assert deadline == ro.step_started_at + timedelta(seconds=3600)
    hhmm = deadline.astimezone(UTC).strftime("%H:%M:%S")
    expected = {
        "reason": f"step 10 %: 0/1000 samples, deadline {hhmm} (then pause)",
        "until": deadline.isoformat(),
    }
    assert describe_rollout(ro)["waiting"] == expected
    # The API …
    user = User.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    token = ApiToken.issue(user)[1]
    body = client.get(f"/api/rollouts/{ro.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["waiting"] == expected
    # … and the CLI say the same.
    out = StringIO()
    call_command("rollout", "status", "--json", stdout=out)
    assert json.loads(out.getvalue())["rollout"]["waiting"] == expected
    out = StringIO()
    call_command("rollout", "status", stdout=out)
    assert f"waiting: {expected['reason']} (until {expected['until']})" in out.getvalue()


def test_the_policy_and_deadline_are_checked_at_start() -> None:
    with pytest.raises(Exception, match="on_inconclusive must be one of pause, fail"):
        rollouts_start.validate_options({"on_inconclusive": "retry"})
    with pytest.raises(Exception, match="step_deadline must be a non-negative number"):
        rollouts_start.validate_options({"step_deadline": -1})
    assert rollouts_start.validate_options({})["on_inconclusive"] == "pause"
    with pytest.raises(CommandError, match="step_deadline must be a non-negative number"):
        call_command("rollout", "start", "--set", "detect_renames=true", "--step-deadline", "-5")
    with pytest.raises(CommandError):
        call_command("rollout", "start", "--set", "detect_renames=true",
                     "--on-inconclusive", "maybe")  # fmt: skip
    assert not Rollout.objects.exists()


def test_a_thin_step_with_nothing_to_shadow_says_so_once() -> None:
    """No analysed repository: the driver's shadow sampling finds no commit, records
    that once for the step, and the waiting reason says there is nothing to shadow."""
    ro, driver = ramping({"step_pause": 0, "min_samples": 5, "step_deadline": 3600})
    assert driver.tick() and driver.tick()
    events = list(RolloutEvent.objects.filter(rollout=ro, action="shadow.enqueued"))
    assert len(events) == 1 and events[0].detail["commits"] == 0
    ro.refresh_from_db()
    assert describe_rollout(ro)["waiting"]["reason"].startswith(
        "step 10 %: 0/5 samples, no commits left to shadow, deadline "
    )


def test_the_rollouts_page_shows_the_same_waiting_line(client: Client) -> None:
    ro, driver = ramping({**THIN, "step_deadline": 3600})
    assert driver.tick()
    ro.refresh_from_db()
    reason = describe_rollout(ro)["waiting"]["reason"]
    user = User.objects.create_user("ops", password="pw-ops-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    client.force_login(user)
    page = client.get("/rollouts/").content.decode()
    assert f'<p class="banner warn" data-field="waiting">Waiting: {reason} ' in page


def test_a_bad_policy_over_the_api_is_a_json_400(client: Client) -> None:
    state_machine.ensure_baseline(actor="setup")
    user = User.objects.create_user("ci", password="pw-ci-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="start_rollout"))
    token = ApiToken.issue(user)[1]
    res = client.post(
        "/api/rollouts",
        data=json.dumps(
            {"config": {"detect_renames": True}, "options": {"on_inconclusive": "wait"}}
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert res.status_code == 400
    assert res.json() == {"error": "on_inconclusive must be one of pause, fail, not 'wait'"}
    res = client.post(
        "/api/rollouts",
        data=json.dumps(
            {"config": {"detect_renames": True},
             "options": {"step_deadline": 120, "on_inconclusive": "fail"}}
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip
    assert res.status_code == 202, res.content
    ro = Rollout.objects.get(pk=res.json()["id"])
    assert (ro.options["step_deadline"], ro.options["on_inconclusive"]) == (120.0, "fail")


def test_a_freeze_is_what_a_ramping_rollout_waits_for_while_it_lasts() -> None:
    from dashboard.rollouts import freeze

    ro, driver = ramping({**THIN, "min_samples": 0, "step_deadline": 3600})
    freeze.set_stop_the_line(on=True, actor="erin", reason="incident 12")
    assert driver.tick()  # healthy, but the promote waits for the switch
    ro.refresh_from_db()
    frozen = freeze.rollout_freeze(ro)
    assert frozen is not None and frozen["step"] == "ramp to 100%"
    assert describe_rollout(ro)["waiting"] == {
        "reason": f"frozen: {frozen['message']} (ramp to 100% waits)",
        "until": None,
    }
    freeze.set_stop_the_line(on=False, actor="erin", reason="resolved")
    assert driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == 100
