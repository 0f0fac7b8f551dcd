"""dashboard.rollouts.checklist: a rollout read back from its row and events. Hostile text in the
checklist is covered in tests/dashboard/rollouts/test_start.py; the page and CLI that serve it in
tests/dashboard/web/test_rollouts.py and tests/dashboard/rollouts/test_deploy_lock.py."""

from __future__ import annotations

import pytest

from dashboard.models import Rollout
from dashboard.rollouts import steps
from dashboard.rollouts.checklist import describe_rollout, rollout_checklist
from dashboard.versions import state_machine
from tests.support.rollouts import _release_drivers, start, verify  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_promoted_rollout_ticks_every_step_in_order() -> None:
    ro, driver = start(steps=[50])
    token = int(driver.token or 0)
    before = rollout_checklist(ro)
    assert "- [x] Deploy lock `locks:queue:analysis:deploy` taken" in before
    assert "- [ ] Warming started" in before and "- [ ] Promoted to current" in before
    assert "## Rollback steps taken\n\n- none\n" in before
    verify(ro, driver)
    steps.set_ramp(rollout=ro, percent=50, token=token, actor="alice")
    steps.promote(rollout=ro, token=token, actor="alice")
    driver.release()
    md = rollout_checklist(ro)
    lines = md.splitlines()
    order = [
        next(i for i, ln in enumerate(lines) if ln.startswith(prefix))
        for prefix in (
            "- [x] Deploy lock `locks",
            "- [x] Warming started",
            "- [x] Warming verdict: passed: test verdict",
            "- [x] Ramp 0% → 50%",
            "- [x] Promoted to current",
            "- [x] Deploy lock released",
        )
    ]
    assert order == sorted(order)
    assert "- **Steps**: 50%" in md
    assert md.startswith(f"# Rollout #{ro.pk}: analysis@")


def test_describe_rollout_names_both_versions_and_their_queues() -> None:
    ro, driver = start()
    data = describe_rollout(Rollout.objects.get(pk=ro.pk))
    assert "timeline" not in data
    assert data["id"] == ro.pk and data["state"] == "active"
    assert data["lock_token"] == driver.token
    assert data["version"]["fingerprint"] == ro.version.fingerprint
    assert data["version"]["queue"] == state_machine.physical_queue(
        "analysis", ro.version.fingerprint
    )
    assert data["previous"]["state"] == "current"
    assert data["previous"]["queue"] != data["version"]["queue"]
    with_timeline = describe_rollout(ro, timeline=True)
    ats = [e["at"] for e in with_timeline["timeline"]]
    assert ats == sorted(ats) and len(ats) >= 2
