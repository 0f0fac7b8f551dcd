"""The audit log: every operator action, who, what, when, outcome — and why.

The reason an operator types into a confirm dialog travels with the request as the
``X-Audit-Reason`` header (``AuditReasonMiddleware``); every audit entry that request
writes carries it in ``detail["reason"]``. A bulk action that runs later in a worker
stores the reason in its selector and passes it explicitly (``dead_letters.run_bulk``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote

from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from dashboard.infra import publish_event
from dashboard.models import AuditEntry

REASON_HEADER = "HTTP_X_AUDIT_REASON"
MAX_REASON = 300

# Per request (a context variable, so concurrent requests on threads or tasks never see
# each other's reason); empty outside a request that sent one.
_reason: ContextVar[str] = ContextVar("audit_reason", default="")


def current_reason() -> str:
    """The reason the current request gave for its action ("" if none)."""
    return _reason.get()


class AuditReasonMiddleware:
    """Makes the ``X-Audit-Reason`` header (percent-encoded UTF-8, at most 300
    characters kept) of a write request the reason of the audit entries it records."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        raw = request.META.get(REASON_HEADER, "")
        if not raw or request.method in {"GET", "HEAD", "OPTIONS"}:
            return self.get_response(request)
        token = _reason.set(clean_reason(unquote(raw)))
        try:
            return self.get_response(request)
        finally:
            _reason.reset(token)


def clean_reason(text: str) -> str:
    """One line of printable text, bounded: control characters (NUL, ESC, …) and lone
    surrogates are dropped, whitespace runs become one space."""
    kept = "".join(ch for ch in str(text) if ch.isspace() or not _unstorable(ch))
    return " ".join(kept.split())[:MAX_REASON]


#: The longest reason an operator may type (forms, API bodies, the CLI).
MAX_TYPED_REASON = 500


def reason_problem(text: object, *, most: int = MAX_TYPED_REASON) -> str | None:
    """Why ``text`` cannot be an operator's typed reason, None if it can: it must be a
    string of at most ``most`` characters without control characters other than
    whitespace, nor lone surrogates. Checked by every adapter *before* it acts: a NUL
    fails PostgreSQL's insert of the audit entry (the action had run, unaudited), an
    ESC reaches an operator's terminal through ``manage.py rollout status``."""
    if not isinstance(text, str) or len(text) > most:
        return f'"reason" must be a string (≤ {most} characters)'
    if any(_unstorable(ch) and ch not in "\t\n\r" for ch in text):
        return '"reason" must not hold control characters (NUL, ESC, …)'
    return None


def _unstorable(ch: str) -> bool:
    # Cc: C0/C1 controls and DEL; Cs: a lone surrogate (no UTF-8 encoding exists).
    return unicodedata.category(ch) in {"Cc", "Cs"}


def record_audit(*, user: Any, action: str, target: str, outcome: str,
                 detail: dict[str, Any] | None = None,
                 reason: str | None = None) -> AuditEntry:  # fmt: skip
    """Record one entry. ``reason`` defaults to the current request's reason."""
    real_user = user if getattr(user, "pk", None) else None
    actor = getattr(user, "username", None) or (user if isinstance(user, str) else "system")
    why = clean_reason(reason) if reason is not None else current_reason()
    data = dict(detail or {})
    if why:
        data["reason"] = why
    entry = AuditEntry.objects.create(
        user=real_user,
        actor=str(actor)[:150],
        action=action,
        target=target[:500],
        outcome=outcome[:500],
        detail=data,
    )
    # The Audit page and the overview's feed show it live (after commit, like every event).
    publish_event(
        "audit.recorded",
        {"entry": entry.pk, "action": action, "actor": entry.actor, "target": entry.target[:200],
         "outcome": entry.outcome[:200], "reason": why or None},
    )  # fmt: skip
    return entry


# ---------------------------------------------------------------------------- reading

PAGE = 100


def audit_page(
    *, action: str = "", actor: str = "", text: str = "", before: int | None = None,
    limit: int = PAGE,
) -> tuple[list[AuditEntry], int | None]:  # fmt: skip
    """One page of the log, newest first, keyset-paginated on the id (ids grow with
    time): entries older than ``before``, and the cursor of the next page (None at the
    end). One query."""
    entries: QuerySet[AuditEntry] = AuditEntry.objects.order_by("-id")
    if action:
        entries = entries.filter(action=action)
    if actor:
        entries = entries.filter(actor=actor)
    if text:
        entries = entries.filter(
            Q(target__icontains=text)
            | Q(outcome__icontains=text)
            | Q(detail__reason__icontains=text)
        )
    if before is not None:
        entries = entries.filter(pk__lt=before)
    rows = list(entries[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].pk if more and rows else None)


_RUN_IDS = re.compile(r"^runs \[([\d, ]*)\]$")


def run_links(entry: AuditEntry) -> list[tuple[str, str]]:
    """The runs an entry acted on, as (label, run page URL): the runs a dead-letter
    retry or discard named (target ``runs [3, 4]``), the job whose lock was force-
    released (``detail["holder"]["job"]``)."""
    links = []
    found = _RUN_IDS.match(entry.target)
    if found:
        ids = [int(x) for x in found.group(1).replace(" ", "").split(",") if x]
        links += [(f"run #{i}", reverse("run", args=[i])) for i in ids[:20]]
    detail = entry.detail if isinstance(entry.detail, dict) else {}  # JSON: any value
    holder = detail.get("holder")
    job = holder.get("job") if isinstance(holder, dict) else None
    if isinstance(job, str) and job:
        links.append((f"job {job[:24]}", reverse("run-by-job", args=[job])))
    return links


def audit_actions() -> list[str]:
    return sorted(set(AuditEntry.objects.order_by().values_list("action", flat=True).distinct()))
