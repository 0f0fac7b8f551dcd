"""Operator-defined checks and gates of a ramp step (docs/rollouts.md#checks-and-gates),
against real loopback HTTP servers: one answers Prometheus's ``/api/v1/query`` JSON with
canned instant vectors, the other is a gate webhook receiver that verifies each request's
signature and answers as the test tells it. The driver (this process) holds the deploy
lock and ticks, as it does in production."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent, RolloutMeasurement
from dashboard.rollouts import checks, rollout_checklist, start, waiting
from dashboard.rollouts.conditions import validate_gate
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.notifications import verify
from dashboard.versions.state_machine import ensure_baseline
from tests.dashboard.api.test_rollouts import a_user, call
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    RENAMES,
    _release_drivers,
)
from tests.support.rollouts import verify as verify_rollout

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State
R = Rollout.State
SECRET = "gate-secret-0123456789"


class _Server:
    """A ThreadingHTTPServer on a free loopback port, served from a thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Prometheus(_Server):
    """Answers ``GET /api/v1/query?query=Q`` as Prometheus does: an instant vector of one
    sample with ``values[Q]``, an empty vector for an unknown query."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.queries: list[str] = []
        super().__init__(_PrometheusHandler)


class _PrometheusHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        owner: Prometheus = self.server.owner  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        if parts.path != "/api/v1/query":
            self.send_error(404)
            return
        query = parse_qs(parts.query)["query"][0]
        owner.queries.append(query)
        result = (
            [{"metric": {}, "value": [time.time(), str(owner.values[query])]}]
            if query in owner.values
            else []
        )
        body = json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class GateReceiver(_Server):
    """A gate webhook receiver: verifies every request's signature (``verified``), keeps
    its body (``bodies``) and answers ``status`` (after ``delay`` seconds)."""

    def __init__(self) -> None:
        self.status = 200
        self.delay = 0.0
        self.bodies: list[dict[str, Any]] = []
        self.verified: list[bool] = []
        super().__init__(_GateHandler)


class _GateHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        owner: GateReceiver = self.server.owner  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers["Content-Length"]))
        owner.verified.append(
            verify(
                SECRET,
                self.headers["X-Gitward-Timestamp"],
                body,
                self.headers["X-Gitward-Signature"],
            )
        )
        owner.bodies.append(json.loads(body))
        time.sleep(owner.delay)
        answer = b"not yet: change freeze in the payments team"
        try:
            self.send_response(owner.status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except OSError:
            pass  # the driver gave up waiting (the timeout test)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus(settings: Any) -> Iterator[Prometheus]:
    server = Prometheus()
    settings.PROMETHEUS_URL = server.url
    yield server
    server.close()


@pytest.fixture
def receiver() -> Iterator[GateReceiver]:
    server = GateReceiver()
    yield server
    server.close()


def ramping(
    checks_: list[dict[str, Any]] | None = None, steps: list[int] | None = None, **options: Any
) -> tuple[Rollout, RolloutDriver]:
    """An automatic rollout at its first step; the health check needs no samples, so
    only the checks and gates decide."""
    ensure_baseline(actor="setup")
    ro = start.start_rollout(
        config=RENAMES, auto=True, actor="ci", enqueue_driver=False, steps=steps or [10, 100],
        options={"step_pause": 0, "min_samples": 0, "checks": checks_ or [], **options},
    )  # fmt: skip
    driver = RolloutDriver(ro.pk, ttl=5.0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    verify_rollout(ro, driver)
    assert driver.tick()  # verified + auto → the first step
    ro.refresh_from_db()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.RAMPING
    return ro, driver


def version(ro: Rollout) -> AnalyzerVersion:
    return AnalyzerVersion.objects.get(pk=ro.version_id)


def test_a_failing_check_fails_the_step_and_its_measurements_are_shown(
    prometheus: Prometheus, client: Client
) -> None:
    prometheus.values["job_error_ratio"] = 0.2
    ro, driver = ramping(
        [{"name": "errors", "query": "job_error_ratio", "failure": "result > 0.05",
          "failure_limit": 1, "interval": 0}]
    )  # fmt: skip
    assert driver.tick()  # one failure: within its limit of 1, the step waits
    assert version(ro).state == S.RAMPING
    assert driver.tick()  # the second: over the limit, rolled back
    ro.refresh_from_db()
    assert ro.state == R.ROLLING_BACK and version(ro).state == S.DRAINING
    assert prometheus.queries == ["job_error_ratio", "job_error_ratio"]
    why = RolloutEvent.objects.get(rollout=ro, to_state="draining").reason
    assert why == "step check failed: check errors failed 2x (limit 1): 0.2: result > 0.05"
    rows = list(RolloutMeasurement.objects.filter(rollout=ro).values_list(
        "step_index", "percent", "kind", "name", "value", "outcome", "condition"))  # fmt: skip
    assert rows == [(0, 10, "check", "errors", 0.2, "failure", "failure: result > 0.05")] * 2
    # Shown in GET /api/rollouts/<id> and `rollout status --json`, not only pass/fail.
    token = a_user("viewer", "view_jobrun")
    detail = call(client, "GET", f"/api/rollouts/{ro.pk}", token).json()
    [step] = detail["measurements"]
    assert (step["step_index"], step["percent"], step["gates"]) == (0, 10, [])
    [errors] = step["checks"]
    assert (errors["name"], errors["value"], errors["outcome"], errors["condition"]) == (
        "errors", 0.2, "failure", "failure: result > 0.05",
    )  # fmt: skip
    assert errors["counts"] == {"success": 0, "failure": 2, "inconclusive": 0}
    assert [m["message"] for m in errors["latest"]] == ["0.2: result > 0.05"] * 2
    # …in the release checklist…
    checklist = rollout_checklist(ro)
    assert (
        "## Checks and gates\n\n- step 10%: check errors: failure — 0.2: result &gt; 0.05 "
        "(0 passed, 2 failed, 0 inconclusive)\n"
    ) in checklist
    # …and on the Rollouts page, in the rollout's Checks and gates table.
    viewer = User.objects.create_user("vic", password="pw-vic-123", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
    client.force_login(viewer)
    page = client.get(f"/rollouts/{ro.pk}/").content.decode()
    row = page[page.index('<tr data-check="errors" data-outcome="failure">') :]
    row = row[: row.index("</tr>")]
    for cell in ("<td>10%</td>", "<td>0.2</td>", "<code>failure: result &gt; 0.05</code>",
                 "0 / 2 / 0", "0.2: result &gt; 0.05"):  # fmt: skip
        assert cell in row, (cell, row)


def test_a_dry_run_check_that_fails_is_recorded_but_does_not_block(
    prometheus: Prometheus, capsys: Any
) -> None:
    prometheus.values.update({"p99_seconds": 9.0, "job_error_ratio": 0.01})
    ro, driver = ramping(
        [
            {"name": "latency", "query": "p99_seconds", "success": "result < 2",
             "dry_run": True, "interval": 0},
            {"name": "errors", "query": "job_error_ratio", "success": "result <= 0.05",
             "interval": 0},
        ]
    )  # fmt: skip
    assert driver.tick()  # both measured: the dry run failed, the real one passed
    assert (version(ro).state, version(ro).ramp_percent) == (S.RAMPING, 100)
    outcomes = dict(
        RolloutMeasurement.objects.filter(rollout=ro, step_index=0).values_list("name", "outcome")
    )
    assert outcomes == {"latency": "failure", "errors": "success"}
    assert RolloutMeasurement.objects.get(rollout=ro, name="latency").dry_run
    call_command("rollout", "status", "--json")
    data = json.loads(capsys.readouterr().out)
    step0 = data["rollout"]["measurements"][0]  # its checks in the order they were given
    assert [(c["name"], c["dry_run"], c["outcome"], c["value"]) for c in step0["checks"]] == [
        ("latency", True, "failure", 9.0), ("errors", False, "success", 0.01),
    ]  # fmt: skip
    call_command("rollout", "status")
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if ln.startswith("step ")] == [
        "step 10% check latency (dry run): failure 9: not result < 2",
        "step 10% check errors: success 0.01: result <= 0.05",
    ]


@pytest.mark.parametrize("policy", ["pause", "fail"])
def test_an_inconclusive_check_follows_the_on_inconclusive_policy(
    prometheus: Prometheus, policy: str
) -> None:
    prometheus.values["job_error_ratio"] = 0.1  # neither < 0.05 nor > 0.2
    ro, driver = ramping(
        [{"name": "errors", "query": "job_error_ratio", "success": "result < 0.05",
          "failure": "result > 0.2", "interval": 0}],
        step_deadline=0, on_inconclusive=policy,
    )  # fmt: skip
    driver.tick()
    ro.refresh_from_db()
    event = RolloutEvent.objects.get(rollout=ro, action="step.deadline")
    assert event.detail["policy"] == policy
    assert "check errors 0.1: neither result < 0.05 nor result > 0.2" in event.reason
    m = RolloutMeasurement.objects.filter(rollout=ro).first()
    assert m is not None and (m.outcome, m.value) == ("inconclusive", 0.1)
    if policy == "pause":
        assert ro.state == R.ACTIVE and version(ro).state == S.RAMPING
        assert waiting.paused(ro) is not None
        assert driver.tick() and version(ro).ramp_percent == 10  # stays paused
    else:
        assert ro.state == R.ROLLING_BACK and version(ro).state == S.DRAINING


def test_a_check_without_data_is_inconclusive_not_passing(prometheus: Prometheus) -> None:
    ro, driver = ramping([{"name": "errors", "query": "absent_metric",
                           "failure": "result > 0.05", "interval": 0}])  # fmt: skip
    assert driver.tick()
    assert version(ro).ramp_percent == 10  # waits: no value is no pass
    m = RolloutMeasurement.objects.get(rollout=ro)
    assert (m.outcome, m.value) == ("inconclusive", None)
    assert m.message == "no data: the query returned an empty vector"
    reason = waiting.waiting(Rollout.objects.get(pk=ro.pk))
    assert reason is not None and "checks 0/1 passing" in reason["reason"]


def gate(receiver: GateReceiver, **kw: Any) -> dict[str, Any]:
    return validate_gate({"name": "confirm-promotion", "url": receiver.url + "/gate",
                          "secret": SECRET, "interval": 0, **kw})  # fmt: skip


def test_a_refusing_gate_holds_promotion_until_it_answers_2xx(
    settings: Any, receiver: GateReceiver
) -> None:
    settings.ROLLOUT_GATES = [gate(receiver, interval=3600)]
    receiver.status = 409
    ro, driver = ramping(steps=[10, 100])
    assert driver.tick()  # 10 % → 100 %: no promotion yet, the gate is not asked
    assert (version(ro).ramp_percent, receiver.bodies) == (100, [])
    assert driver.tick()  # before the promote to current: asked, refused, held
    assert driver.tick()  # within its interval: not asked again
    ro.refresh_from_db()
    assert (ro.state, version(ro).state) == (R.ACTIVE, S.RAMPING)
    assert receiver.verified == [True]
    [body] = receiver.bodies
    assert (body["type"], body["gate"], body["rollout"]["id"]) == (
        "rollout.gate",
        "confirm-promotion",
        ro.pk,
    )
    assert body["step"] == {"index": 1, "percent": 100, "next": "promote to current"}
    reason = waiting.waiting(ro)
    assert reason is not None and reason["reason"].startswith(
        "step 100 %: waiting on gate 'confirm-promotion' (HTTP 409: not yet: change freeze"
    )
    # The receiver says yes: the next ask (its interval passed) promotes.
    receiver.status = 200
    settings.ROLLOUT_GATES = [gate(receiver, interval=0)]
    assert not driver.tick()
    ro.refresh_from_db()
    assert (ro.state, version(ro).state) == (R.COMPLETED, S.CURRENT)
    assert receiver.verified == [True, True]
    gates = checks.measurements(ro)[-1]["gates"]
    assert [(g["name"], g["counts"]) for g in gates] == [
        ("confirm-promotion", {"success": 1, "failure": 1, "inconclusive": 0})
    ]


def test_a_gate_refusal_with_on_refusal_fail_rolls_back(
    settings: Any, receiver: GateReceiver
) -> None:
    settings.ROLLOUT_GATES = [gate(receiver, when="step", on_refusal="fail")]
    receiver.status = 503
    ro, driver = ramping(steps=[10, 100])
    assert driver.tick()
    ro.refresh_from_db()
    assert (ro.state, version(ro).state) == (R.ROLLING_BACK, S.DRAINING)
    why = RolloutEvent.objects.get(rollout=ro, to_state="draining").reason
    assert why.startswith("gate refused: gate confirm-promotion HTTP 503")


def test_a_gate_that_does_not_answer_in_time_is_inconclusive(
    settings: Any, receiver: GateReceiver
) -> None:
    settings.WEBHOOK_TIMEOUT = 0.3
    settings.ROLLOUT_GATES = [gate(receiver, when="step")]
    receiver.delay = 2.0
    ro, driver = ramping(steps=[10, 100], step_deadline=0, on_inconclusive="fail")
    driver.tick()
    ro.refresh_from_db()
    assert ro.state == R.ROLLING_BACK
    m = RolloutMeasurement.objects.get(rollout=ro, kind="gate")
    assert m.outcome == "inconclusive" and m.message.startswith("no answer: ")
    deadline = RolloutEvent.objects.get(rollout=ro, action="step.deadline")
    assert deadline.detail["policy"] == "fail" and "gate confirm-promotion no answer" in (
        deadline.reason
    )


def test_an_operators_promote_is_refused_while_a_gate_refuses(
    settings: Any, receiver: GateReceiver
) -> None:
    settings.ROLLOUT_GATES = [gate(receiver)]
    receiver.status = 403
    ensure_baseline(actor="setup")
    ro = start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False, steps=[100])
    driver = RolloutDriver(ro.pk, ttl=5.0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    verify_rollout(ro, driver)
    start.request_action(rollout=ro, action="promote", actor="erin")
    assert driver.tick()
    assert version(ro).ramp_percent == 100  # the ramp step itself has no gate
    start.request_action(rollout=ro, action="promote", actor="erin")
    assert driver.tick()
    failed = RolloutEvent.objects.filter(rollout=ro, action="action.failed").get()
    assert failed.detail["error"].startswith(
        "promote held by a gate: gate confirm-promotion HTTP 403"
    )
    assert version(ro).state == S.RAMPING and receiver.verified == [True]


def test_checks_are_validated_at_start() -> None:
    ensure_baseline(actor="setup")
    with pytest.raises(start.RolloutError, match="cannot read 'result ~ 3'"):
        start.start_rollout(config=RENAMES, actor="ci", enqueue_driver=False,
                            options={"checks": [{"name": "x", "query": "up",
                                                 "success": "result ~ 3"}]})  # fmt: skip
    with pytest.raises(CommandError, match='give a "success" or a "failure" condition'):
        call_command("rollout", "start", "--set", "detect_renames=true", "--driver", "none",
                     "--check", '{"name": "x", "query": "up"}')  # fmt: skip
    assert not Rollout.objects.exists()
