"""The audit log: every operator action, who, what, when, outcome."""

from __future__ import annotations

from typing import Any

from dashboard.models import AuditEntry


def record_audit(*, user: Any, action: str, target: str, outcome: str,
                 detail: dict[str, Any] | None = None) -> AuditEntry:  # fmt: skip
    real_user = user if getattr(user, "pk", None) else None
    actor = getattr(user, "username", None) or (user if isinstance(user, str) else "system")
    return AuditEntry.objects.create(
        user=real_user,
        actor=str(actor)[:150],
        action=action,
        target=target[:500],
        outcome=outcome[:500],
        detail=detail or {},
    )
