"""Who may do what, and the record of it: the first administrator, the audit log,
the authentication backend, sessions and rate limits. See docs/security.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.accounts.audit import (
        audit_actions,
        audit_page,
        current_reason,
        reason_problem,
        record_audit,
        run_links,
    )
    from dashboard.accounts.first_admin import ensure_admin
    from dashboard.accounts.rate_limits import check

__all__ = [
    "audit_actions",
    "audit_page",
    "check",
    "current_reason",
    "ensure_admin",
    "reason_problem",
    "record_audit",
    "run_links",
]

#: Each public name and the module that defines it. A module loads when one of its names is
#: first read (PEP 562), so settings can import a package before Django's app registry is
#: ready, and a name is read from its module each time: a test that patches the module is
#: seen here too. See docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "audit_actions": "dashboard.accounts.audit",
    "audit_page": "dashboard.accounts.audit",
    "current_reason": "dashboard.accounts.audit",
    "reason_problem": "dashboard.accounts.audit",
    "record_audit": "dashboard.accounts.audit",
    "run_links": "dashboard.accounts.audit",
    "ensure_admin": "dashboard.accounts.first_admin",
    "check": "dashboard.accounts.rate_limits",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
