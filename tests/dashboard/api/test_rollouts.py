"""The rollouts JSON API (docs/api.md): a CI token starts a rollout after a merge, reads it
back with its timeline, and operators act on it; every bad input is a JSON 4xx and every
refusal is audited. Real database, real Redis (the driver job lands on ``rollouts``)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from dashboard.infra import queues
from dashboard.locks import leases
from dashboard.models import AnalyzerVersion, ApiToken, AuditEntry, Rollout
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts import steps
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.rollouts import DRIVERS, _release_drivers, completed_and_running  # noqa: F401
from workers.locks import keys

pytestmark = pytest.mark.django_db(transaction=True)


def a_user(name: str, *perms: str, staff: bool = True) -> str:
    user = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=staff)
    for p in perms:
        user.user_permissions.add(Permission.objects.get(codename=p))
    return ApiToken.issue(user)[1]


def call(
    client: Client, method: str, path: str, token: str, body: object = None, raw: str | None = None
):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if method == "GET":
        return client.get(path, **headers)
    data = raw if raw is not None else json.dumps(body if body is not None else {})
    return client.post(path, data=data, content_type="application/json", **headers)


@pytest.fixture
def ci() -> str:
    return a_user("ci", "start_rollout")


def test_ci_starts_a_rollout_and_reads_it_back_with_its_timeline(client: Client, ci: str) -> None:
    ensure_baseline(actor="setup")
    res = call(client, "POST", "/api/rollouts", ci,
               {"config": {"detect_renames": True}, "steps": [50, 100], "auto": True})  # fmt: skip
    assert res.status_code == 202, res.content
    body = res.json()
    ro = Rollout.objects.get(pk=body["id"])
    assert (body["state"], ro.started_by, ro.steps, ro.auto) == ("pending", "ci", [50, 100], True)
    assert queues.queue(rollouts_start.DRIVER_QUEUE).job_ids == [f"rollout-{ro.pk}-start"]
    listed = call(client, "GET", "/api/rollouts", ci).json()["rollouts"]
    assert [r["id"] for r in listed] == [ro.pk]
    detail = call(client, "GET", f"/api/rollouts/{ro.pk}", ci).json()
    assert detail["version"]["config"]["detect_renames"] is True
    assert [(e["action"], e["to"]) for e in detail["timeline"]] == [("rollout", "pending")]
    # A second start of the queue is refused at once, naming the first one.
    again = call(client, "POST", "/api/rollouts", ci, {"config": {"ignore_whitespace": True}})
    assert again.status_code == 409 and f"rollout #{ro.pk}" in again.json()["error"]


@pytest.mark.parametrize(
    ("body", "raw", "message"),
    [
        (None, "{not json", "request body is not valid JSON"),
        ([1], None, "request body must be a JSON object"),
        ({}, None, '"config" must be a JSON object'),
        ({"config": {"detect_renames": "yes"}}, None, "detect_renames: must be true or false"),
        ({"config": {"renames": True}}, None, "unknown key 'renames'"),
        ({"config": {}, "steps": "10,50"}, None, '"steps" must be a list'),
        ({"config": {"detect_renames": True}, "steps": [50, 10]}, None, "steps must increase"),
        ({"config": {"detect_renames": True}, "auto": "yes"}, None, '"auto" must be true or false'),
        ({"config": {"detect_renames": True}, "queue": "sync"}, None, '"queue" must be'),
        ({"config": {"detect_renames": True}, "colour": 1}, None, "unknown field(s): colour"),
        (
            {"config": {"detect_renames": True}, "warm_set": {"threshold": 2}},
            None,
            "warm_set.threshold",
        ),
        ({"config": {}}, None, "already current"),
    ],
)
def test_bad_input_is_a_json_400_and_audited(
    client: Client, ci: str, body: object, raw: str | None, message: str
) -> None:
    res = call(client, "POST", "/api/rollouts", ci, body, raw=raw)
    assert res.status_code == 400, res.content
    assert message in res.json()["error"]
    assert Rollout.objects.count() == 0
    entry = AuditEntry.objects.get(action="rollout.start")
    assert entry.outcome.startswith("refused: ") and entry.actor == "ci"


def test_permissions_are_checked_and_refusals_audited(client: Client) -> None:
    nobody = a_user("bob")
    res = call(client, "POST", "/api/rollouts", nobody, {"config": {"detect_renames": True}})
    assert res.status_code == 403 and "permission" in res.json()["error"]
    assert call(client, "GET", "/api/rollouts", nobody).status_code == 403
    not_staff = a_user("eve", "start_rollout", staff=False)
    assert call(client, "POST", "/api/rollouts", not_staff, {"config": {}}).status_code == 403
    assert (
        AuditEntry.objects.filter(action="rollout.start", outcome__startswith="refused").count()
        == 2
    )
    assert Rollout.objects.count() == 0


def test_actions_are_permission_checked_and_act_on_the_rollout(client: Client, ci: str) -> None:
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(
        config={"detect_renames": True}, actor="ci", enqueue_driver=False
    )
    # The CI token may promote (a request to the driver) but not roll back; a promote
    # of a rollout no driver took yet does not apply to its state: a 409 naming it.
    res = call(client, "POST", f"/api/rollouts/{ro.pk}/promote", ci)
    assert res.status_code == 409 and "is pending" in res.json()["error"], res.content
    assert Rollout.objects.get(pk=ro.pk).pending_action is None
    refused = call(client, "POST", f"/api/rollouts/{ro.pk}/rollback", ci)
    assert refused.status_code == 403
    assert AuditEntry.objects.filter(
        action="rollout.rollback", outcome__startswith="refused"
    ).exists()
    ops = a_user("ops", "rollback_rollout")
    assert call(client, "POST", f"/api/rollouts/{ro.pk}/explode", ops).status_code == 404
    assert call(client, "POST", "/api/rollouts/999/abort", ops).status_code == 404
    bad = call(client, "POST", f"/api/rollouts/{ro.pk}/abort", ops, {"force": "please"})
    assert bad.status_code == 400 and bad.json() == {"error": '"force" must be true or false'}
    # No driver ever took the lock: the rollback takes it here and ends the rollout.
    done = call(client, "POST", f"/api/rollouts/{ro.pk}/rollback", ops, {"reason": "not today"})
    assert done.status_code == 200, done.content
    body = done.json()
    assert body["state"] == "aborted"
    assert ("takeover", "ops") in [(e["action"], e["actor"]) for e in body["timeline"]]
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == "registered"
    # Nothing left to act on: a JSON 409, never a 500.
    late = call(client, "POST", f"/api/rollouts/{ro.pk}/takeover", ops)
    assert late.status_code == 409 and "aborted" in late.json()["error"]


def test_without_a_valid_bearer_token_it_is_a_json_401_and_unknown_ids_a_json_404(
    client: Client, ci: str
) -> None:
    start = {"config": {"detect_renames": True}}
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer not-a-token"}):
        res = client.post("/api/rollouts", data=json.dumps(start),
                          content_type="application/json", **headers)  # fmt: skip
        assert res.status_code == 401 and set(res.json()) == {"error"}, res.content
        assert client.get("/api/rollouts", **headers).status_code == 401
    assert Rollout.objects.count() == 0
    missing = call(client, "GET", "/api/rollouts/999", ci)
    assert missing.status_code == 404 and set(missing.json()) == {"error"}


def test_a_promoted_rollout_is_rolled_back_over_the_api(client: Client, ci: str) -> None:
    """The CI path end to end: start over the API, the driver promotes it to current,
    ``POST /api/rollouts/<id>/rollback`` routes back at once (the lock was released at
    promote: the call takes it itself) and the timeline says so."""
    from dashboard.rollouts.driver import RolloutDriver
    from dashboard.versions.state_machine import served_fingerprint
    from tests.support.rollouts import PASSING

    base = ensure_baseline(actor="setup")
    res = call(client, "POST", "/api/rollouts", ci, {"config": {"detect_renames": True},
                                                     "steps": [100]})  # fmt: skip
    pk = res.json()["id"]
    d = RolloutDriver(pk, ttl=5.0)
    d.acquire(actor="ci")
    token = int(d.token or 0)
    steps.begin_warming(rollout=pk, token=token, actor="ci")
    steps.record_verdict(rollout=pk, verdict=PASSING, token=token, actor="ci")
    steps.set_ramp(rollout=pk, percent=100, token=token, actor="ci")
    steps.promote(rollout=pk, token=token, actor="ci")
    d.release()
    new = AnalyzerVersion.objects.get(pk=Rollout.objects.get(pk=pk).version_id)
    assert served_fingerprint() == new.fingerprint
    ops = a_user("ops", "rollback_rollout")
    back = call(client, "POST", f"/api/rollouts/{pk}/rollback", ops, {"reason": "regression"})
    assert back.status_code == 200, back.content
    body = back.json()
    assert body["state"] in {"rolling_back", "rolled_back"}
    assert served_fingerprint() == base.fingerprint  # at once
    assert AnalyzerVersion.objects.get(pk=new.pk).state in {"draining", "drained"}
    detail = call(client, "GET", f"/api/rollouts/{pk}", ci).json()
    assert ("takeover", "ops") in [(e["action"], e["actor"]) for e in detail["timeline"]]
    moves = [(e["from"], e["to"]) for e in detail["timeline"] if e["action"] == "transition"]
    assert ("draining", "current") in moves and ("current", "draining") in moves


def test_a_drained_version_is_retired_over_the_api(client: Client) -> None:
    base = ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    AnalyzerVersion.objects.filter(pk=v.pk).update(state=AnalyzerVersion.State.DRAINED)
    admin, viewer = a_user("admin", "rollback_rollout"), a_user("viewer", "view_jobrun")
    path = f"/api/versions/{v.fingerprint[:12]}/retire"
    res = call(client, "POST", path, viewer)
    assert res.status_code == 403 and "permission to retire" in res.json()["error"]
    for fingerprint, body, status, text in [
        ("zz", {}, 400, "4 to 64 hexadecimal digits"),
        ("abcdef12abcdef12", {}, 404, "no version abcdef12abcdef12"),
        (base.fingerprint[:12], {}, 409, "current → retired is not allowed"),
        (v.fingerprint[:12], {"reason": 5}, 400, '"reason" must be a string'),
    ]:
        res = call(client, "POST", f"/api/versions/{fingerprint}/retire", admin, body)
        assert res.status_code == status and text in res.json()["error"], res.content
    assert client.get(path, HTTP_AUTHORIZATION=f"Bearer {admin}").status_code == 405
    assert AnalyzerVersion.objects.get(pk=v.pk).state == AnalyzerVersion.State.DRAINED
    res = call(client, "POST", path, admin, {"reason": "superseded"})
    assert res.status_code == 200, res.content
    assert res.json() == {"queue": "analysis", "fingerprint": v.fingerprint, "state": "retired"}
    again = call(client, "POST", path, admin)
    assert again.status_code == 409 and "retired → retired is not allowed" in again.json()["error"]
    refused = AuditEntry.objects.filter(action="rollout.retire", outcome__startswith="refused: ")
    assert refused.count() == 6
    assert AuditEntry.objects.filter(action="rollout.transition", actor="admin",
                                     outcome__contains="drained → retired").exists()  # fmt: skip


def test_actions_on_a_finished_rollout_are_409s_and_leave_the_running_ones_lock(
    client: Client,
) -> None:
    """Rollout A completed; rollout B runs, its driver holding the queue's deploy lock.
    Aborting A (even with ``force``), taking it over, promoting it or rolling it back is
    a JSON 409 naming why — never a 500 — and B's lease, token and driver are
    untouched: no lease is broken for an action that does not apply."""
    a, b, driver = completed_and_running()
    ops = a_user("ops", "rollback_rollout", "start_rollout")
    before = leases.redlock().inspect(keys.deploy("analysis"))
    assert before is not None and before["holder"]["token"] == b.lock_token
    for action, body, text in [
        ("abort", {}, "is completed: it has ended, nothing to abort"),
        ("abort", {"force": True}, "is completed: it has ended, nothing to abort"),
        ("takeover", {}, "is completed: it has ended, nothing to takeover"),
        ("promote", {}, "is completed: nothing to promote"),
        ("rollback", {}, f"rollout #{b.pk} of 'analysis' is active"),
        ("rollback", {"force": True}, f"rollout #{b.pk} of 'analysis' is active"),
    ]:
        res = call(client, "POST", f"/api/rollouts/{a.pk}/{action}", ops, body)
        assert res.status_code == 409, (action, res.content)
        assert set(res.json()) == {"error"} and text in res.json()["error"], res.json()
    after = leases.redlock().inspect(keys.deploy("analysis"))
    assert after is not None and after["nonce"] == before["nonce"]
    assert after["holder"]["token"] == b.lock_token
    assert driver.tick() and not driver.lost.is_set()
    assert Rollout.objects.get(pk=a.pk).state == "completed"
    assert Rollout.objects.get(pk=b.pk).state == "active"
    assert not AuditEntry.objects.filter(action="rollout.lock.break").exists()
    assert (
        AuditEntry.objects.filter(action="rollout.abort", outcome__startswith="refused").count()
        == 2
    )


def test_a_version_a_rollout_targets_is_not_retired_and_its_rollout_is_always_aborted(
    client: Client,
) -> None:
    """A re-activation rollout of a drained version, before its first step: retiring
    the version is a 409 naming the rollout (it would wedge the queue), and aborting
    the rollout ends it without touching the version — then the queue is free and the
    version can be retired."""
    base = ensure_baseline(actor="setup")
    v = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    AnalyzerVersion.objects.filter(pk=v.pk).update(
        state=AnalyzerVersion.State.DRAINED, verified_at=base.created_at
    )
    ro = rollouts_start.start_rollout(
        config={"detect_renames": True}, actor="ci", enqueue_driver=False
    )
    admin = a_user("admin", "rollback_rollout")
    path = f"/api/versions/{v.fingerprint[:12]}/retire"
    refused = call(client, "POST", path, admin)
    assert refused.status_code == 409, refused.content
    assert f"target of rollout #{ro.pk} (pending)" in refused.json()["error"]
    assert AnalyzerVersion.objects.get(pk=v.pk).state == "drained"
    aborted = call(client, "POST", f"/api/rollouts/{ro.pk}/abort", admin, {"reason": "no"})
    assert aborted.status_code == 200, aborted.content
    assert aborted.json()["state"] == "aborted"
    assert AnalyzerVersion.objects.get(pk=v.pk).state == "drained"
    assert leases.redlock().inspect(keys.deploy("analysis")) is None  # released
    again = rollouts_start.start_rollout(
        config={"ignore_whitespace": True}, actor="ci", enqueue_driver=False
    )
    assert again.state == "pending"
    assert call(client, "POST", path, admin).status_code == 200
