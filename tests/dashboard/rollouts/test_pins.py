"""Pinning (docs/rollouts.md#pinning): a pinned repository routes to the ramping version
whatever its hash bucket — analysed under it by real workers at a 1 % step — over the
API, the CLI and the Rollouts page, permission-checked and audited; refused (409) unless
the rollout ramps; cleared when the rollout rolls back or ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from dashboard.models import (
    AnalyzerVersion,
    AuditEntry,
    Commit,
    Repository,
    RolloutEvent,
    RolloutPin,
)
from dashboard.rollouts import pins, steps
from dashboard.versions import canary, state_machine
from tests.dashboard.api.test_rollouts import a_user, call
from tests.support.rollout_workers import run_version_workers
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    _release_drivers,
    analysed,
    start,
    verify,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State


def stored(repo: Repository, fingerprint: str) -> int:
    return Commit.objects.filter(repository=repo, fingerprint=fingerprint).count()


def test_a_pinned_repository_is_analysed_under_the_ramping_version_at_1_percent(
    tmp_path: Path, client: Client, settings: Any
) -> None:
    settings.HOOK_DEBOUNCE = 0.0  # the sync a pin schedules is due at once
    a, _ = analysed(tmp_path, "a")
    b, _ = analysed(tmp_path, "b")
    ro, driver = start(warm_set={"repositories": 1})
    verify(ro, driver)
    steps.set_ramp(rollout=ro, percent=1, token=int(driver.token or 0), actor="ops")
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    base = state_machine.current_version()
    assert base is not None
    # Neither routes to the canary by its hash at 1 %: only the pin can send one there.
    assert not any(canary.route(canary.repository_key(r.pk), 1) for r in (a, b))
    token = a_user("ops", "start_rollout")
    res = call(client, "POST", f"/api/rollouts/{ro.pk}/pin", token, {"repositories": [a.pk]})
    assert res.status_code == 200, res.json()
    assert res.json()["pinned"] == [a.pk]
    assert [p["repository"] for p in res.json()["pins"]] == [a.pk]
    assert canary.planned_fingerprints(key=canary.repository_key(a.pk)) == [
        base.fingerprint, new.fingerprint,
    ]  # fmt: skip
    assert canary.planned_fingerprints(key=canary.repository_key(b.pk)) == [base.fingerprint]
    # The sync the pin scheduled runs on real workers, one per version.
    run_version_workers()
    a.refresh_from_db()
    assert stored(a, new.fingerprint) == a.commits_total == 5
    assert stored(b, new.fingerprint) == 0
    # Readers still see the current version: the canary is a shadow until promotion.
    assert set(Repository.objects.values_list("fingerprint", flat=True)) == {base.fingerprint}
    audited = AuditEntry.objects.filter(action="rollout.pins.added").values_list("actor", flat=True)
    assert list(audited) == ["ops"]
    detail = call(client, "GET", f"/api/rollouts/{ro.pk}", token).json()
    assert [p["repository"] for p in detail["pins"]] == [a.pk]
    # A rollback clears the pins: the repository routes by its bucket again.
    steps.rollback(rollout=ro, token=int(driver.token or 0), actor="ops")
    assert not RolloutPin.objects.exists()
    cleared = RolloutEvent.objects.get(rollout=ro, action="pins.cleared")
    assert cleared.detail == {"repositories": [a.pk]}
    assert canary.planned_fingerprints(key=canary.repository_key(a.pk)) == [base.fingerprint]


def test_pinning_is_refused_unless_the_rollout_ramps_and_needs_the_permission(
    client: Client, capsys: Any
) -> None:
    repo = Repository.objects.create(url="https://example.com/r.git")
    ro, driver = start()
    verify(ro, driver)  # verified, not ramping yet
    ops = a_user("ops", "start_rollout")
    res = call(client, "POST", f"/api/rollouts/{ro.pk}/pin", ops, {"repositories": [repo.pk]})
    assert res.status_code == 409
    assert res.json()["error"] == (
        f"rollout #{ro.pk} is active and its version verified: only a ramping rollout's "
        "repositories can be pinned"
    )
    viewer = a_user("viewer", "view_jobrun")
    res = call(client, "POST", f"/api/rollouts/{ro.pk}/pin", viewer, {"repositories": [repo.pk]})
    assert res.status_code == 403
    for body in ({"repositories": []}, {"repositories": ["x"]}, {"repos": [1]}):
        assert call(client, "POST", f"/api/rollouts/{ro.pk}/pin", ops, body).status_code in {
            400, 409,
        }  # fmt: skip
    refusals = AuditEntry.objects.filter(action="rollout.pin", outcome__startswith="refused")
    assert refusals.count() == 5
    with pytest.raises(CommandError, match="only a ramping rollout's repositories can be pinned"):
        call_command("rollout", "pin", str(ro.pk), str(repo.pk))
    steps.set_ramp(rollout=ro, percent=10, token=int(driver.token or 0), actor="ops")
    with pytest.raises(CommandError, match="no repository #999999"):
        call_command("rollout", "pin", str(ro.pk), "999999")
    call_command("rollout", "pin", str(ro.pk), str(repo.pk))
    assert capsys.readouterr().out.strip() == f"rollout {ro.pk}: pinned #{repo.pk}"
    call_command("rollout", "unpin", str(ro.pk), str(repo.pk))
    assert capsys.readouterr().out.strip() == f"rollout {ro.pk}: nothing pinned"
    assert not RolloutPin.objects.exists()


def test_the_rollouts_page_pins_with_a_form(client: Client) -> None:
    repo = Repository.objects.create(url="https://example.com/r.git")
    ro, driver = start()
    verify(ro, driver)
    steps.set_ramp(rollout=ro, percent=10, token=int(driver.token or 0), actor="ops")
    user = User.objects.create_user("erin", password="pw-erin-123", is_staff=True)
    for codename in ("view_jobrun", "start_rollout"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    page = client.get(f"/rollouts/{ro.pk}/").content.decode()
    assert f'id="pin-form-{ro.pk}"' in page
    bad = client.post(f"/rollouts/{ro.pk}/pins/", {"action": "pin", "repositories": "x, 3"})
    assert bad.status_code == 400 and "Give repository ids" in bad.content.decode()
    res = client.post(f"/rollouts/{ro.pk}/pins/", {"action": "pin", "repositories": str(repo.pk)})
    assert res.status_code == 302
    assert list(RolloutPin.objects.values_list("repository_id", flat=True)) == [repo.pk]
    page = client.get(f"/rollouts/{ro.pk}/").content.decode()
    assert f'data-pin="{repo.pk}"' in page
    entry = AuditEntry.objects.get(action="rollout.page.pin")
    assert (entry.actor, entry.outcome) == ("erin", f"pinned: #{repo.pk}")
    # Without start_rollout: refused, audited.
    viewer = User.objects.create_user("vic", password="pw-vic-123", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    client.force_login(viewer)
    assert f'id="pin-form-{ro.pk}"' not in client.get(f"/rollouts/{ro.pk}/").content.decode()
    res = client.post(f"/rollouts/{ro.pk}/pins/", {"action": "unpin", "repositories": "1"})
    assert res.status_code == 403
    assert AuditEntry.objects.filter(action="rollout.page.pin", actor="vic").exists()
    assert pins.pinned(ro)[0]["repository"] == repo.pk
