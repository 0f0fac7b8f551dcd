"""What a remote may reach, and how a refusal reads (docs/security.md).

``RemotePolicy`` is the deployment's say (local roots, internal networks it trusts,
the resolver); ``InvalidRemote`` is the one error every check raises: its text is one
redacted line, safe for a form error, a JSON body or a log.  ``show`` and
``has_unsafe_chars`` are the two text helpers every check shares.
"""

from __future__ import annotations

import ipaddress
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.remotes.redaction import redact

__all__ = ["IPAddress", "IPNetwork", "InvalidRemote", "RemotePolicy", "has_unsafe_chars", "show"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class InvalidRemote(ValueError):
    """A refused remote or branch.  ``str(exc)`` is one safe, human-readable line."""

    def __init__(self, message: str) -> None:
        # Messages are built from validated fragments only, but redact and
        # flatten anyway so that no future message can leak a token or inject
        # a second line into a log / form error / JSON body.
        super().__init__(" ".join(redact(message).split()))


@dataclass(frozen=True)
class RemotePolicy:
    # Directories under which local repositories may be read.  Empty: no local
    # paths at all (Gitea allows local imports only for admins; G4).
    local_roots: tuple[Path, ...] = ()
    # Networks that are reachable even though they are internal (e.g. an
    # on-prem git server in 10.0.0.0/8).  Cloud metadata addresses stay refused.
    allowed_nets: tuple[IPNetwork, ...] = ()
    resolve: Callable[[str, int | None], list[str]] | None = None
    resolve_hosts: bool = True


def show(value: str, limit: int = 80) -> str:
    """Quote a (validated) fragment for a message: printable, bounded, one line."""
    shown = "".join(ch if ch.isprintable() else "?" for ch in value)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return repr(shown)


def has_unsafe_chars(text: str) -> bool:
    # Control chars (CR/LF/NUL/TAB) split git config lines and HTTP headers
    # (G11, GHSA-v87r-6q3f-2j67); format chars (bidi overrides, zero-width,
    # soft hyphen) make a URL display differently from what git fetches (G13);
    # any whitespace is never part of a remote and hides argument splitting.
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] in ("C", "Z"):
            return True
    return False
