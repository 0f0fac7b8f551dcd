"""Credentials out of text: URL userinfo and Authorization values (docs/security.md#g9).

Every log line, exception message, RQ ``exc_info`` and trace passes through
``redact`` before anyone can read it.
"""

from __future__ import annotations

import re

__all__ = ["redact"]


_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/\s?#@]*(?:@[^/\s?#@]*)*)@"
)
_AUTH_HEADER = re.compile(r"(?i)(authorization\s*[:=]\s*)(?:(?:basic|bearer|token)\s+)?\S+")


def redact(text: str) -> str:
    """Remove userinfo (``user:pass@``, ``TOKEN@``) from URLs and Authorization
    header values in ``text`` (G9: logs, exceptions, RQ ``exc_info``).

    For ssh URLs only a password is removed; a bare ssh user (``git@``) is not
    a secret and keeping it makes errors useful."""

    def fix(m: re.Match[str]) -> str:
        scheme, info = m.group("scheme"), m.group("info")
        if "ssh" in scheme.lower() and ":" not in info and "@" not in info:
            return m.group(0)
        if "ssh" in scheme.lower() and ":" in info:
            return f"{scheme}{info.split(':', 1)[0]}:<redacted>@"
        return f"{scheme}<redacted>@"

    text = _URL_USERINFO.sub(fix, text)
    return _AUTH_HEADER.sub(r"\1<redacted>", text)
