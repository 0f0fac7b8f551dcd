"""dashboard.rollouts.board: the buttons a rollout offers and what pressing them does,
called directly (the page, its permissions over HTTP and the browser flows are in
tests/dashboard/web/test_rollouts.py and tests/system/test_browser_rollouts.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from dashboard.models import AuditEntry, Rollout
from dashboard.rollouts import steps
from dashboard.rollouts.board import config_text
from dashboard.rollouts.buttons import actions_for, perform, permitted
from dashboard.rollouts.deploy_lock import holder_alive
from dashboard.versions.state_machine import RolloutError
from tests.support.rollouts import _release_drivers, start, verify  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _verbs(ro: Rollout) -> list[str]:
    return [a.verb for a in actions_for(Rollout.objects.get(pk=ro.pk))]


def test_buttons_follow_the_state_and_the_driver() -> None:
    ro, driver = start()
    assert holder_alive(ro)
    assert _verbs(ro) == ["abort"]  # registered: nothing to promote or roll back yet
    verify(ro, driver)
    assert _verbs(ro) == ["promote", "set_ramp", "rollback", "abort"]
    promote = actions_for(Rollout.objects.get(pk=ro.pk))[0]
    assert "runs it within a second" in promote.plan and not promote.danger
    driver.release()  # the driver is gone: a takeover is offered
    assert not holder_alive(ro)
    verbs = _verbs(ro)
    assert verbs[-1] == "takeover"
    assert all(a.danger for a in actions_for(ro) if a.verb in {"rollback", "abort", "takeover"})


def test_perform_asks_the_live_driver_and_audits_the_plan() -> None:
    ro, driver = start()
    verify(ro, driver)
    ro = Rollout.objects.get(pk=ro.pk)
    shown = next(a.plan for a in actions_for(ro) if a.verb == "set_ramp")
    out = perform(rollout=ro, verb="set_ramp", user="op", reason="try 25", percent=25)
    assert out.startswith("set ramp requested from the driver")
    pending = Rollout.objects.get(pk=ro.pk).pending_action
    assert pending["action"] == "set_ramp" and pending["params"]["percent"] == 25
    entry = AuditEntry.objects.get(action="rollout.page.set_ramp")
    assert entry.actor == "op" and entry.outcome == out
    assert entry.detail == {"reason": "try 25", "plan": shown, "percent": 25}
    # A second request while one is pending is refused, and the refusal audited too.
    with pytest.raises(RolloutError):
        perform(rollout=ro, verb="promote", user="op2")
    refused = AuditEntry.objects.get(action="rollout.page.promote")
    assert refused.outcome.startswith("refused:")


def test_a_verb_the_rollout_does_not_offer_is_refused_and_audited() -> None:
    ro, _ = start()
    with pytest.raises(RolloutError, match="offers no rollback now"):
        perform(rollout=ro, verb="rollback", user="op")
    assert AuditEntry.objects.get(action="rollout.page.rollback").outcome.startswith("refused:")
    assert Rollout.objects.get(pk=ro.pk).pending_action is None


def test_rollback_of_a_dead_driver_takes_the_lock_here() -> None:
    ro, driver = start()
    verify(ro, driver)
    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=10, token=token, actor="alice")
    driver.release()
    ro = Rollout.objects.get(pk=ro.pk)
    out = perform(rollout=ro, verb="rollback", user="op", reason="bad numbers")
    assert out.startswith("routed back to ") and "is draining" in out
    ro.refresh_from_db()
    assert ro.state in {"rolling_back", "rolled_back"}
    assert ro.version.state == "draining"


def test_permission_needs_staff_and_the_explicit_permission() -> None:
    user = User.objects.create_user("op", password="pw-op-123456")
    assert not permitted(user, "rollback")
    user.is_staff = True
    user.save()
    assert not permitted(User.objects.get(pk=user.pk), "rollback")
    user.user_permissions.add(Permission.objects.get(codename="rollback_rollout"))
    user = User.objects.get(pk=user.pk)
    assert permitted(user, "rollback") and permitted(user, "abort")
    assert not permitted(user, "promote")
    assert not permitted("op", "promote")


def test_config_text() -> None:
    assert config_text({"detect_renames": True, "exclude_paths": ["vendor/**", "x"]}) == (
        "detect_renames=true, ignore_whitespace=false, exclude_paths=[vendor/**, x]"
    )
