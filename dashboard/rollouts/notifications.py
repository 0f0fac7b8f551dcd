"""Signed outbound webhooks for rollout transitions and verdicts
(docs/rollouts.md#notifications).

**Outbox.** Every timeline event of a rollout whose action is in ``NOTIFIED`` (a version
transition, a rollout state change, a warming verdict) gets one ``RolloutNotification``
row per endpoint of ``GITWARD_ROLLOUT_WEBHOOKS``, written by a ``post_save`` receiver of
``RolloutEvent`` (:func:`connect_notifications`): Django sends it inside the ``save`` that
inserts the event, so the row commits or rolls back with the transition itself. Nothing committed is
left unannounced, nothing rolled back is announced.

**Order.** Every notified event of a rollout is written while its transaction holds the
rollout row's lock (``steps.locked_rollout``, ``do_transition``, the driver's
``acquire``; the start inserts the row itself), so a later event of a rollout gets a
larger id *and* commits later: id order is commit order, per rollout. The sender only
ever sends the oldest undelivered row of an (endpoint, rollout) pair; the next one waits
until it is delivered.

**Delivery** (:func:`deliver_notifications`, each reconciler round): at least once. A row
is claimed with a conditional UPDATE that moves its ``next_attempt_at`` forward by a
lease, so two senders (two reconcilers) never send one row at once; a sender that dies
after sending and before marking leaves the row to be sent again after the lease, which
is why every request carries an id to deduplicate on. A failed attempt (no connection,
timeout, non-2xx) is retried with exponential backoff (``BACKOFF_BASE`` doubling up to
``BACKOFF_MAX``), indefinitely.

**Signature.** ``X-Gitward-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>"
with the endpoint's secret>`` and ``X-Gitward-Timestamp: <unix seconds>``; the id is
``X-Gitward-Event-Id`` (and ``id`` in the JSON payload).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Min
from django.db.models.signals import post_save
from django.utils import timezone

from dashboard.models import RolloutEvent, RolloutNotification

log = logging.getLogger(__name__)

#: Timeline actions announced: version transitions, rollout state changes, verdicts — the
#: warming gate's, and a step's at its deadline (``step.deadline``: still inconclusive,
#: paused for an operator or rolled back). ``shadow.enqueued`` is not one: work the driver
#: sends the canary changes nothing that is served (docs/rollouts.md#notifications).
NOTIFIED = frozenset({"transition", "rollout", "verdict", "step.deadline"})
BACKOFF_BASE = 2.0
BACKOFF_MAX = 300.0
#: Seconds a claimed row is not offered to another sender, beyond the request timeout.
LEASE_MARGIN = 30.0
#: Deliveries one round makes at most (a reconciler round stays bounded).
ROUND_LIMIT = 200
USER_AGENT = "gitward-webhooks/1"


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1`` after ``attempts`` failed ones: 2, 4, 8, …
    up to 300."""
    return min(BACKOFF_MAX, BACKOFF_BASE * 2 ** max(0, attempts - 1))


def event_id(event: RolloutEvent) -> str:
    """The id a receiver deduplicates on: one per timeline event, the same on every retry
    and every endpoint."""
    return f"gitward-rollout-event-{event.pk}"


# ---------------------------------------------------------------------------- the outbox


def _on_event_saved(sender: object, instance: RolloutEvent, created: bool, **kwargs: Any) -> None:
    if not created or instance.rollout_id is None or instance.action not in NOTIFIED:
        return
    endpoints = settings.ROLLOUT_WEBHOOKS
    if not endpoints:
        return
    now = timezone.now()
    RolloutNotification.objects.bulk_create(
        RolloutNotification(
            event=instance, rollout_id=instance.rollout_id, endpoint=e["name"], next_attempt_at=now
        )
        for e in endpoints
    )


def connect_notifications() -> None:
    """Write the outbox rows with every notified event (``DashboardConfig.ready``)."""
    post_save.connect(
        _on_event_saved, sender=RolloutEvent, weak=False, dispatch_uid="gitward-rollout-outbox"
    )


# ---------------------------------------------------------------------------- payloads


def payload(event: RolloutEvent) -> dict[str, Any]:
    """The JSON body of one event (format ``json``)."""
    ro, version = event.rollout, event.version
    kind = {"transition": "version.transition", "rollout": "rollout.state"}.get(
        event.action, f"rollout.{event.action}"
    )
    return {
        "id": event_id(event),
        "type": kind,
        "sequence": event.pk,
        "at": event.at.isoformat(),
        "rollout": {
            "id": event.rollout_id,
            "queue": ro.queue if ro is not None else None,
            "version": ro.version.fingerprint if ro is not None else None,
            "previous": ro.previous.fingerprint if ro is not None and ro.previous else None,
        },
        "version": version.fingerprint if version is not None else None,
        "from": event.from_state,
        "to": event.to_state,
        "actor": event.actor,
        "reason": event.reason,
        "detail": event.detail,
        "summary": summary(event),
    }


def summary(event: RolloutEvent) -> str:
    """One line for people: ``rollout #4 analysis@3f2a9c1e0b12: ramping → current (promoted)``."""
    ro = event.rollout
    who = f"rollout #{event.rollout_id}"
    if ro is not None:
        who += f" {ro.queue}@{ro.version.fp12}"
    if event.action == "verdict":
        ok = (event.detail.get("verdict") or {}).get("ok") is True
        return f"{who}: warming verdict {'passed' if ok else 'failed'}: {event.reason}"
    if event.action == "step.deadline":
        return f"{who}: {event.reason}"
    what = "version" if event.action == "transition" else "rollout"
    change = f"{event.from_state or '∅'} → {event.to_state}"
    ramp = event.detail.get("ramp_percent")
    if ramp is not None:
        change += f" ({ramp}%)"
    why = f" ({event.reason})" if event.reason else ""
    return f"{who}: {what} {change}{why}"


def slack_payload(event: RolloutEvent) -> dict[str, Any]:
    """The body of format ``slack``: what a Slack incoming webhook accepts."""
    text = summary(event)
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": f"{event_id(event)} · {event.at.isoformat()}"}
                ],
            },
        ],
    }


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``b"<timestamp>." + body`` with ``secret``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver checks (docs/rollouts.md#notifications shows the same in a few lines)."""
    try:
        expected = sign(secret, int(timestamp), body)
    except ValueError:
        return False
    return hmac.compare_digest(expected, signature)


def request_for(endpoint: Mapping[str, str], event: RolloutEvent) -> urllib.request.Request:
    """The signed POST of ``event`` to ``endpoint``."""
    body_obj = slack_payload(event) if endpoint.get("format") == "slack" else payload(event)
    body = json.dumps(body_obj, separators=(",", ":"), sort_keys=True).encode()
    stamp = int(time.time())
    return urllib.request.Request(  # noqa: S310 - http(s) only (settings._webhooks)
        endpoint["url"],
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Gitward-Event-Id": event_id(event),
            "X-Gitward-Timestamp": str(stamp),
            "X-Gitward-Signature": sign(endpoint["secret"], stamp, body),
        },
    )


def _send(endpoint: Mapping[str, str], event: RolloutEvent) -> str | None:
    """POST it; None when answered 2xx, else why not."""
    try:
        with urllib.request.urlopen(  # noqa: S310 - http(s) only (settings._webhooks)
            request_for(endpoint, event), timeout=settings.WEBHOOK_TIMEOUT
        ) as answer:
            answer.read(65536)
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset, timeout, DNS, bad URL
        return f"{type(exc).__name__}: {exc}"[:500]


# ---------------------------------------------------------------------------- the sender


def _claim(row: RolloutNotification, now: datetime) -> bool:
    """Take the row for one attempt: a conditional UPDATE on the ``next_attempt_at`` we
    read. Race: two senders read the same head; one UPDATE matches, the other's finds the
    value moved and skips the row."""
    lease = timedelta(seconds=settings.WEBHOOK_TIMEOUT + LEASE_MARGIN)
    return bool(
        RolloutNotification.objects.filter(
            pk=row.pk, delivered_at__isnull=True, next_attempt_at=row.next_attempt_at
        ).update(next_attempt_at=now + lease, attempts=row.attempts + 1)
    )


def deliver_notifications(
    *, now: datetime | None = None, limit: int = ROUND_LIMIT
) -> dict[str, int]:
    """One round: for each (endpoint, rollout) with undelivered rows, send the oldest one
    if it is due, then the next while they succeed; an endpoint that fails is left for
    the next round (its other rollouts' rows too). Returns ``{delivered, failed,
    pending}``. ``now`` is the clock the due times are compared with (a test moves it
    forward to skip a backoff); a failed row's next attempt is ``now`` + backoff."""
    endpoints = {e["name"]: e for e in settings.ROLLOUT_WEBHOOKS}
    delivered = failed = 0
    #: Endpoints that failed once this round: not tried again until the next one, so a
    #: dead endpoint costs a round one timeout, not one per rollout waiting on it (the
    #: reconciler's other steps run in the same round).
    broken: set[str] = set()
    if endpoints:
        groups = (
            RolloutNotification.objects.filter(
                delivered_at__isnull=True, endpoint__in=list(endpoints)
            )
            .values("endpoint", "rollout")
            .annotate(head=Min("id"))
            .order_by("head")
        )
        for group in groups:
            while delivered + failed < limit and group["endpoint"] not in broken:
                clock = now or timezone.now()
                row = (
                    RolloutNotification.objects.select_related(
                        "event__rollout__version", "event__rollout__previous", "event__version"
                    )
                    .filter(
                        endpoint=group["endpoint"],
                        rollout=group["rollout"],
                        delivered_at__isnull=True,
                    )
                    .order_by("id")
                    .first()
                )
                if row is None or row.next_attempt_at > clock or not _claim(row, clock):
                    break
                error = _send(endpoints[row.endpoint], row.event)
                if error is None:
                    RolloutNotification.objects.filter(pk=row.pk).update(
                        delivered_at=timezone.now(), last_error=""
                    )
                    delivered += 1
                    continue
                failed += 1
                broken.add(row.endpoint)
                log.warning(
                    "webhook %s: %s (attempt %s) failed: %s",
                    row.endpoint, event_id(row.event), row.attempts + 1, error,
                )  # fmt: skip
                RolloutNotification.objects.filter(pk=row.pk).update(
                    next_attempt_at=clock + timedelta(seconds=backoff(row.attempts + 1)),
                    last_error=error,
                )
                break  # this rollout's later events wait for this one
    pending = RolloutNotification.objects.filter(delivered_at__isnull=True).count()
    return {"delivered": delivered, "failed": failed, "pending": pending}


def notification_status(rollout_id: int) -> list[dict[str, Any]]:
    """Per endpoint: delivered, pending, the last error (the rollout's API view)."""
    out = []
    for name in sorted(
        set(
            RolloutNotification.objects.filter(rollout=rollout_id).values_list(
                "endpoint", flat=True
            )
        )
    ):
        rows = RolloutNotification.objects.filter(rollout=rollout_id, endpoint=name)
        stuck = rows.filter(delivered_at__isnull=True).order_by("id").first()
        out.append(
            {
                "endpoint": name,
                "delivered": rows.filter(delivered_at__isnull=False).count(),
                "pending": rows.filter(delivered_at__isnull=True).count(),
                "last_error": stuck.last_error if stuck is not None else "",
                "next_attempt_at": stuck.next_attempt_at.isoformat() if stuck else None,
            }
        )
    return out
