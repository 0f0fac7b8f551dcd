"""Signed rollout webhooks (docs/rollouts.md#notifications): a loopback HTTP receiver (a real
socket, ``http.server`` in a thread) gets every transition and verdict of a real rollout
exactly once after deduplication, in order, with valid signatures, across an outage and an
endpoint that answers 500 after reading; the outbox row commits and rolls back with its
transition."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from dashboard.models import Rollout, RolloutEvent, RolloutNotification
from dashboard.operations.reconciler import reconcile
from dashboard.rollouts import notifications
from dashboard.versions.state_machine import record_event
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    _release_drivers,
    start,
    verify,
)

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "s3cret-for-the-loopback-receiver"


class Receiver:
    """A webhook receiver on 127.0.0.1: records every request (headers and body); in
    ``flaky`` mode it reads a request, records it, and answers 500 (the sender must send
    it again: the receiver then sees it twice)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.flaky = False
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def up(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                self.send_response(500 if outer.flaky else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def down(self) -> None:
        """Stop listening: a connection is refused until ``up`` again (same port)."""
        assert self.server is not None and self.thread is not None
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        self.server = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.up()
    yield r
    if r.server is not None:
        r.down()


def valid(req: dict[str, Any]) -> bool:
    """What a receiver does (docs/rollouts.md#notifications): HMAC-SHA256 of
    ``<timestamp>.<body>`` with the shared secret, compared in constant time."""
    stamp = req["headers"]["X-Gitward-Timestamp"]
    mac = hmac.new(SECRET.encode(), stamp.encode() + b"." + req["body"], hashlib.sha256)
    return hmac.compare_digest("sha256=" + mac.hexdigest(), req["headers"]["X-Gitward-Signature"])


def test_every_transition_arrives_once_in_order_signed_across_an_outage(receiver: Receiver) -> None:
    hooks = [
        {"name": "ops", "url": receiver.url("/ops"), "secret": SECRET, "format": "json"},
        {"name": "chat", "url": receiver.url("/slack"), "secret": SECRET, "format": "slack"},
    ]
    with override_settings(ROLLOUT_WEBHOOKS=hooks):
        ro, driver = start(steps=[50, 100], auto=True,
                           options={"step_pause": 0, "min_samples": 0})  # fmt: skip
        ro = verify(ro, driver)
        # The reconciler round delivers what is due: pending, active, warming, the
        # verdict, verified, to both endpoints.
        assert reconcile()["notified"] == 10
        first = len(receiver.received)
        # Receiver down: the ramp's event fails and is retried later; the rollout's
        # next events wait behind it.
        receiver.down()
        assert driver.tick()  # verified → ramping 50%
        assert driver.tick()  # ramping 50% → 100%
        later = timezone.now()
        got = notifications.deliver_notifications(now=later)
        assert (got["delivered"], got["failed"]) == (0, 2)  # one head per endpoint
        head = RolloutNotification.objects.filter(endpoint="ops", delivered_at=None).first()
        assert head is not None and head.attempts == 1 and "Connection" in head.last_error
        ops = next(s for s in notifications.notification_status(ro.pk) if s["endpoint"] == "ops")
        assert (ops["delivered"], ops["pending"], ops["last_error"]) == (5, 2, head.last_error)
        assert ops["next_attempt_at"] == (later + timedelta(seconds=2)).isoformat()
        # Not due before its backoff: nothing is attempted.
        assert notifications.deliver_notifications(now=later)["failed"] == 0
        # Up, but answering 500 after reading: the receiver sees the head, the sender
        # does not know it did and sends it again (at least once).
        receiver.up()
        receiver.flaky = True
        later += timedelta(hours=1)
        assert notifications.deliver_notifications(now=later)["failed"] == 2
        assert len(receiver.received) == first + 2
        receiver.flaky = False
        assert not driver.tick()  # ramping 100% → current (the previous one draining)
        later += timedelta(hours=1)
        got = notifications.deliver_notifications(now=later)
        assert (got["failed"], got["pending"]) == (0, 0)
    assert Rollout.objects.get(pk=ro.pk).state == Rollout.State.COMPLETED
    assert notifications.notification_status(ro.pk) == [
        {"endpoint": name, "delivered": 10, "pending": 0, "last_error": "", "next_attempt_at": None}
        for name in ("chat", "ops")
    ]

    expected = list(
        RolloutEvent.objects.filter(rollout=ro, action__in=notifications.NOTIFIED).order_by("id")
    )
    assert [(e.action, e.to_state) for e in expected] == [
        ("rollout", "pending"), ("rollout", "active"), ("transition", "warming"),
        ("verdict", ""), ("transition", "verified"), ("transition", "ramping"),
        ("transition", "ramping"), ("transition", "draining"), ("transition", "current"),
        ("rollout", "completed"),
    ]  # fmt: skip
    ids = [notifications.event_id(e) for e in expected]
    assert all(valid(r) for r in receiver.received)
    for path in ("/ops", "/slack"):
        reqs = [r for r in receiver.received if r["path"] == path]
        seen: list[str] = []
        for r in reqs:  # the receiver's deduplication: by the event id
            if r["headers"]["X-Gitward-Event-Id"] not in seen:
                seen.append(r["headers"]["X-Gitward-Event-Id"])
        assert seen == ids  # every one, in order
        assert len(reqs) == len(ids) + 1  # the one the flaky receiver answered 500
    bodies = [json.loads(r["body"]) for r in receiver.received if r["path"] == "/ops"]
    unique = {b["id"]: b for b in bodies}
    assert [unique[i]["sequence"] for i in ids] == [e.pk for e in expected]
    ramp = unique[ids[6]]
    assert (ramp["type"], ramp["from"], ramp["to"], ramp["detail"]["ramp_percent"]) == (
        "version.transition", "ramping", "ramping", 100,
    )  # fmt: skip
    assert ramp["rollout"]["id"] == ro.pk
    assert ramp["rollout"]["version"] == ro.version.fingerprint
    slack = [json.loads(r["body"]) for r in receiver.received if r["path"] == "/slack"]
    assert slack[-1]["text"] == notifications.summary(expected[-1])
    assert slack[-1]["text"].startswith(f"rollout #{ro.pk} analysis@{ro.version.fp12}: rollout ")


def test_the_outbox_row_commits_and_rolls_back_with_its_event(receiver: Receiver) -> None:
    hooks = [{"name": "ops", "url": receiver.url("/"), "secret": SECRET, "format": "json"}]
    with override_settings(ROLLOUT_WEBHOOKS=hooks):
        ro, _ = start()
        before = RolloutNotification.objects.count()
        with pytest.raises(RuntimeError), transaction.atomic():
            record_event(ro, ro.version, "rollout", "active", "failed", "x", "", None)
            assert RolloutNotification.objects.count() == before + 1
            raise RuntimeError("the transition fails after its event was written")
        assert RolloutNotification.objects.count() == before
        # Timeline rows that are not transitions or verdicts are not announced.
        with transaction.atomic():
            record_event(ro, ro.version, "note", "", "", "x", "a note", None)
        assert RolloutNotification.objects.count() == before
    # No endpoint configured: no outbox rows at all.
    with override_settings(ROLLOUT_WEBHOOKS=[]), transaction.atomic():
        record_event(ro, ro.version, "verdict", "", "", "x", "passed", None)
    assert RolloutNotification.objects.count() == before


def test_a_claimed_row_is_not_sent_by_a_second_sender(receiver: Receiver) -> None:
    """Two senders read the same head: the conditional UPDATE gives it to one."""
    hooks = [{"name": "ops", "url": receiver.url("/"), "secret": SECRET, "format": "json"}]
    with override_settings(ROLLOUT_WEBHOOKS=hooks):
        start()
        row = RolloutNotification.objects.order_by("id").first()
        assert row is not None
        now = timezone.now()
        assert notifications._claim(row, now)
        assert not notifications._claim(row, now)  # the same read, a second sender
        # The claimed head is leased: this round sends nothing of that rollout.
        assert notifications.deliver_notifications(now=now)["delivered"] == 0
        assert receiver.received == []


def test_backoff_doubles_up_to_five_minutes() -> None:
    assert [notifications.backoff(n) for n in range(1, 11)] == [
        2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0,
    ]  # fmt: skip


def test_the_signature_is_over_the_timestamp_and_the_body() -> None:
    sig = notifications.sign(SECRET, 1700000000, b'{"a":1}')
    assert notifications.verify(SECRET, "1700000000", b'{"a":1}', sig)
    assert not notifications.verify(SECRET, "1700000001", b'{"a":1}', sig)
    assert not notifications.verify(SECRET, "1700000000", b'{"a":2}', sig)
    assert not notifications.verify("another-secret-of-16+", "1700000000", b'{"a":1}', sig)
    assert not notifications.verify(SECRET, "soon", b'{"a":1}', sig)


def test_a_dead_endpoint_costs_a_round_one_attempt_and_others_go_on(receiver: Receiver) -> None:
    """Two rollouts wait on a dead endpoint: one attempt per round, not one per rollout;
    a live endpoint still gets everything in the same round."""
    from dashboard.rollouts import start as rollouts_start

    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    dead_port = closed.server_address[1]
    closed.server_close()  # a port nobody listens on: connections are refused
    hooks = [
        {"name": "dead", "url": f"http://127.0.0.1:{dead_port}/", "secret": SECRET},
        {"name": "live", "url": receiver.url("/live"), "secret": SECRET, "format": "json"},
    ]
    with override_settings(ROLLOUT_WEBHOOKS=hooks):
        ro, driver = start()
        driver.release()
        DRIVERS.remove(driver)
        # A second rollout's rows: the first one ended, another one starts.
        Rollout.objects.filter(pk=ro.pk).update(state=Rollout.State.ABORTED)
        rollouts_start.start_rollout(
            config={"ignore_whitespace": True}, actor="ci", enqueue_driver=False
        )
        assert len(set(RolloutNotification.objects.values_list("rollout", flat=True))) == 2
        live_rows = RolloutNotification.objects.filter(endpoint="live").count()
        got = notifications.deliver_notifications()
        assert (got["delivered"], got["failed"]) == (live_rows, 1)
        assert RolloutNotification.objects.filter(endpoint="dead", attempts__gt=0).count() == 1
    assert [r["path"] for r in receiver.received] == ["/live"] * live_rows


def test_a_steps_deadline_verdict_is_announced_and_shadow_work_is_not(
    receiver: Receiver,
) -> None:
    """``step.deadline`` is a step's verdict (paused for an operator, or rolled back): a
    receiver gets it. ``shadow.enqueued`` is work the driver sends the canary; it changes
    nothing served, so it stays on the timeline only (docs/rollouts.md#notifications)."""
    hooks = [{"name": "ops", "url": receiver.url("/"), "secret": SECRET, "format": "json"}]
    with override_settings(ROLLOUT_WEBHOOKS=hooks):
        ro, _ = start()
        with transaction.atomic():
            shadow = record_event(ro, ro.version, "shadow.enqueued", "", "", "driver",
                                  "step 10%: 3 commits sent", None, {"commits": 3})  # fmt: skip
            paused = record_event(
                ro, ro.version, "step.deadline", "", "", "driver",
                "step 10%: still inconclusive at its deadline (3/20 samples): paused for an "
                "operator", None, {"policy": "pause", "percent": 10},
            )  # fmt: skip
        announced = set(RolloutNotification.objects.values_list("event__action", flat=True))
        assert "step.deadline" in announced and "shadow.enqueued" not in announced
        assert not RolloutNotification.objects.filter(event=shadow).exists()
        notifications.deliver_notifications()
    bodies = [json.loads(r["body"]) for r in receiver.received]
    [deadline] = [b for b in bodies if b["id"] == notifications.event_id(paused)]
    assert deadline["type"] == "rollout.step.deadline"
    assert deadline["detail"] == {"policy": "pause", "percent": 10}
    assert deadline["summary"] == (
        f"rollout #{ro.pk} analysis@{ro.version.fp12}: step 10%: still inconclusive at its "
        "deadline (3/20 samples): paused for an operator"
    )
    assert all(valid(r) for r in receiver.received)
