"""dashboard.versions.code_versions: a code version a worker reports is learned once (a
``registered`` version with the current configuration, one row however many workers
report it at once), versions are listed with the live workers of their code, and a code
rollout is refused while no worker runs its code — with the API and the CLI over it."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.test import Client
from django.utils import timezone

from dashboard.models import AnalyzerVersion, ApiToken, Rollout, RolloutEvent, WorkerBeat
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts.driver import RolloutDriver
from dashboard.versions.code_versions import (
    find_version,
    learn_code_version,
    live_workers,
    no_workers_reason,
    version_rows,
)
from dashboard.versions.state_machine import (
    InvalidTransition,
    RolloutError,
    VersionNotFound,
    ensure_baseline,
    retire_version,
)
from tests.support.checked_threads import CheckedThread
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    RENAMES,
    _release_drivers,
    verify,
)
from workers.analysis.analyzer import CODE_VERSION, AnalyzerConfig

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State
NEW_CODE = "0.1.0+0123456789ab"


def beat(
    name: str, code: str, *, host: str = "h1", version: str = "", age: float = 0, queues: str = ""
) -> None:
    WorkerBeat.objects.create(
        name=name,
        host=host,
        pid=1,
        version=version,
        code_version=code,
        queues=queues,
        last_seen=timezone.now() - timedelta(seconds=age),
    )


def test_an_unknown_code_version_is_learned_once_with_the_current_configuration() -> None:
    base = ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE, actor="worker w1")
    assert learned is not None
    assert (learned.state, learned.code_version, learned.config) == (
        S.REGISTERED,
        NEW_CODE,
        base.config,
    )
    assert learned.fingerprint == AnalyzerConfig.from_mapping(base.config).fingerprint(NEW_CODE)
    assert learned.fingerprint != base.fingerprint
    event = RolloutEvent.objects.get(version=learned)
    assert (event.to_state, event.reason) == (
        S.REGISTERED,
        f"learned: a worker runs code {NEW_CODE}",
    )
    assert learn_code_version(NEW_CODE, actor="worker w2") is None  # known now
    assert learn_code_version(CODE_VERSION, actor="worker w3") is None  # the baseline's code
    assert AnalyzerVersion.objects.count() == 2


def test_what_a_new_code_declares_it_changes_is_kept_on_its_version() -> None:
    """docs/rollouts.md#result-contract: the declaration travels with the code version,
    so a driver running other code reads it from the row; unknown fields are dropped."""
    ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE, declared={"insertions", "colour"}, actor="w1")
    assert learned is not None
    assert AnalyzerVersion.objects.get(pk=learned.pk).declared_effect == ["insertions"]
    [row] = [r for r in version_rows() if r["code_version"] == NEW_CODE]
    assert row["declared_effect"] == ["insertions"]
    plain = learn_code_version(NEW_CODE + "b", actor="w2")
    assert plain is not None and AnalyzerVersion.objects.get(pk=plain.pk).declared_effect == []


def test_the_current_configuration_is_what_a_new_code_is_learned_with() -> None:
    ensure_baseline(actor="setup")
    AnalyzerVersion.objects.filter(state=S.CURRENT).update(config={"detect_renames": True})
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    assert learned.config == AnalyzerConfig(detect_renames=True).to_dict()
    assert learned.fingerprint == AnalyzerConfig(detect_renames=True).fingerprint(NEW_CODE)


def test_workers_reporting_a_new_code_at_once_create_one_version() -> None:
    """Eight threads, each its own database connection, learn the same new code behind a
    barrier: one row, one ``registered`` event, and every caller that created nothing
    got None (the loser of the unique index reads the winner's row back)."""
    ensure_baseline(actor="setup")
    gate = threading.Barrier(8)
    results: list[Any] = []

    def learn() -> None:
        try:
            gate.wait(timeout=10)
            results.append(learn_code_version(NEW_CODE, actor="worker"))
        finally:
            connections.close_all()

    threads = [CheckedThread(target=learn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    rows = AnalyzerVersion.objects.filter(code_version=NEW_CODE)
    assert rows.count() == 1
    assert RolloutEvent.objects.filter(version=rows.get(), to_state=S.REGISTERED).count() == 1
    assert len(results) == 8
    assert {r.pk for r in results if r is not None} == {rows.get().pk}


def test_a_learned_version_never_rolled_out_may_be_retired_and_is_not_learned_again() -> None:
    ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    assert retire_version(fingerprint=learned.fingerprint, actor="ops").state == S.RETIRED
    assert learn_code_version(NEW_CODE) is None


def test_versions_are_listed_with_the_live_workers_of_their_code() -> None:
    base = ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    beat("old-1", CODE_VERSION, host="blue-a", version=base.fingerprint,
         queues=f"sync,analysis@{base.fingerprint[:8]},maintenance")  # fmt: skip
    beat("old-2", CODE_VERSION, host="blue-b", version=base.fingerprint, queues="rollouts")
    # loaded, but its gate is closed while registered: it listens on the idle queue
    beat("new-1", NEW_CODE, host="green-a", version=learned.fingerprint, queues="idle")
    beat("new-dead", NEW_CODE, host="green-z", age=3600)  # stale: not live
    WorkerBeat.objects.create(name="new-stopped", host="green-y", pid=2, code_version=NEW_CODE,
                              last_seen=timezone.now(), stopped_at=timezone.now())  # fmt: skip
    assert {code: [w["name"] for w in ws] for code, ws in live_workers().items()} == {
        CODE_VERSION: ["old-1", "old-2"],
        NEW_CODE: ["new-1"],
    }
    rows = {r["fingerprint"]: r for r in version_rows()}
    assert rows[base.fingerprint]["workers"] == {
        "count": 2,
        "hosts": ["blue-a", "blue-b"],
        "serving": 1,
    }
    assert rows[learned.fingerprint]["workers"] == {"count": 1, "hosts": ["green-a"], "serving": 0}
    assert rows[learned.fingerprint]["code_version"] == NEW_CODE
    assert rows[learned.fingerprint]["state"] == S.REGISTERED
    assert rows[learned.fingerprint]["physical_queue"] == f"analysis@{learned.fingerprint[:8]}"


def test_a_version_is_found_by_its_fingerprint_or_a_prefix() -> None:
    base = ensure_baseline(actor="setup")
    assert find_version(base.fingerprint).pk == base.pk
    assert find_version(base.fingerprint[:6].upper()).pk == base.pk
    with pytest.raises(VersionNotFound, match="no version abcdef01"):
        find_version("abcdef01" if not base.fingerprint.startswith("abcdef01") else "fedcba98")
    for bad in ("xyz", "ab", None, 12):
        with pytest.raises(RolloutError, match="4 to 64 hexadecimal digits"):
            find_version(bad)


def test_a_code_rollout_needs_a_live_worker_of_its_code() -> None:
    ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    why = no_workers_reason(learned)
    assert why is not None and NEW_CODE in why
    with pytest.raises(RolloutError, match=r"start refused: .* has no live worker"):
        rollouts_start.start_rollout(version=learned.fingerprint, actor="ci", enqueue_driver=False)
    assert not Rollout.objects.exists()  # a refusal writes nothing
    beat("new-1", NEW_CODE, host="green-a")
    assert no_workers_reason(learned) is None
    ro = rollouts_start.start_rollout(
        version=learned.fingerprint[:10], actor="ci", enqueue_driver=False
    )
    assert (ro.version_id, ro.state) == (learned.pk, Rollout.State.PENDING)
    assert ro.previous is not None and ro.previous.code_version == CODE_VERSION


def test_promoting_a_code_rollout_whose_workers_are_gone_is_refused() -> None:
    """The gate passed while green's workers lived; they are gone (the slot scaled down
    too early): promote and set ramp are refused naming why, nothing changes; back, and
    the promote is accepted."""
    ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    beat("new-1", NEW_CODE, host="green-a")
    ro = rollouts_start.start_rollout(version=learned.fingerprint, actor="ci",
                                      enqueue_driver=False)  # fmt: skip
    driver = RolloutDriver(ro.pk, ttl=5.0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    ro = verify(Rollout.objects.get(pk=ro.pk), driver)
    WorkerBeat.objects.filter(name="new-1").update(stopped_at=timezone.now())
    for action, params in (("promote", None), ("set_ramp", {"percent": 10})):
        with pytest.raises(InvalidTransition, match="has no live worker: no worker runs its code"):
            rollouts_start.request_action(rollout=ro, action=action, actor="ops", params=params)
    assert Rollout.objects.get(pk=ro.pk).pending_action is None
    assert AnalyzerVersion.objects.get(pk=learned.pk).state == S.VERIFIED
    WorkerBeat.objects.filter(name="new-1").update(stopped_at=None, last_seen=timezone.now())
    ro = rollouts_start.request_action(rollout=ro, action="promote", actor="ops")
    assert ro.pending_action is not None and ro.pending_action["action"] == "promote"


def test_a_version_of_this_code_starts_by_fingerprint_without_the_worker_check() -> None:
    """A version of the current code (a configuration registered earlier) is a
    configuration rollout: no code of its own to wait for."""
    ensure_baseline(actor="setup")
    fp = AnalyzerConfig.from_mapping(RENAMES).fingerprint()
    AnalyzerVersion.objects.create(fingerprint=fp, code_version=CODE_VERSION, config=RENAMES)
    ro = rollouts_start.start_rollout(version=fp, actor="ci", enqueue_driver=False)
    assert ro.version.fingerprint == fp


def test_config_and_version_are_exclusive_and_unknown_versions_are_named() -> None:
    ensure_baseline(actor="setup")
    with pytest.raises(RolloutError, match="either a configuration or a version"):
        rollouts_start.start_rollout(config=RENAMES, version="abcd", actor="ci")
    with pytest.raises(RolloutError, match="either a configuration or a version"):
        rollouts_start.start_rollout(actor="ci")
    with pytest.raises(VersionNotFound):
        rollouts_start.start_rollout(version="0000aaaa", actor="ci")


# ------------------------------------------------------------------ the API and the CLI


@pytest.fixture
def ci_token() -> str:
    user = User.objects.create_user("ci", password="pw-ci-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="start_rollout"))
    return ApiToken.issue(user)[1]


def test_the_api_lists_versions_and_starts_a_code_rollout(client: Client, ci_token: str) -> None:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ci_token}"}
    base = ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    listed = client.get("/api/versions", **auth).json()["versions"]
    assert [(v["fingerprint"], v["code_version"], v["state"]) for v in listed] == [
        (base.fingerprint, CODE_VERSION, S.CURRENT),
        (learned.fingerprint, NEW_CODE, S.REGISTERED),
    ]
    assert listed[1]["workers"] == {"count": 0, "hosts": [], "serving": 0}

    def post(body: dict[str, Any]) -> Any:
        return client.post(
            "/api/rollouts", json.dumps(body), content_type="application/json", **auth
        )

    unknown = post({"version": "0000aaaa"})
    assert unknown.status_code == 404 and "no version 0000aaaa" in unknown.json()["error"]
    both = post({"version": learned.fingerprint, "config": {}})
    assert both.status_code == 400 and "not both" in both.json()["error"]
    assert post({"version": 7}).status_code == 400
    refused = post({"version": learned.fingerprint})
    assert refused.status_code == 400 and "has no live worker" in refused.json()["error"]
    beat("new-1", NEW_CODE, host="green-a")
    started = post({"version": learned.fingerprint, "steps": [50, 100]})
    assert started.status_code == 202, started.json()
    assert started.json()["rollout"]["version"]["fingerprint"] == learned.fingerprint
    ro = Rollout.objects.get(pk=started.json()["id"])
    assert (ro.version_id, ro.steps) == (learned.pk, [50, 100])
    ro.state = Rollout.State.ABORTED  # let the driver job that was enqueued find nothing
    ro.save(update_fields=["state"])


def test_the_cli_starts_a_code_rollout_by_fingerprint() -> None:
    ensure_baseline(actor="setup")
    learned = learn_code_version(NEW_CODE)
    assert learned is not None
    err = StringIO()
    with pytest.raises(CommandError, match="no version 0000aaaa"):
        call_command("rollout", "start", "--version", "0000aaaa", "--driver", "none", stderr=err)
    with pytest.raises(CommandError, match="has no live worker"):
        call_command("rollout", "start", "--version", learned.fingerprint, "--driver", "none")
    beat("new-1", NEW_CODE, host="green-a")
    out = StringIO()
    call_command(
        "rollout", "start", "--version", learned.fingerprint[:8], "--driver", "none", stdout=out
    )
    ro = Rollout.objects.get()
    assert out.getvalue().strip() == f"rollout {ro.pk} pending"
    assert ro.version_id == learned.pk
    status = StringIO()
    call_command("rollout", "status", "--json", stdout=status)
    shown = {v["fingerprint"]: v for v in json.loads(status.getvalue())["versions"]}
    assert shown[learned.fingerprint]["code_version"] == NEW_CODE
