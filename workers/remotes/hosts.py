"""Hosts a remote may name: host names, IP literals and what they resolve to
(docs/security.md, attack catalog rows G5-G7, G12, G13).

The SSRF wall: a host is refused by name when it is internal by convention, by
address when any address it names or resolves to is loopback, private, link-local,
metadata, … (unless ``RemotePolicy.allowed_nets`` trusts it; metadata never is), and
the addresses validated here are the ones the worker pins, so a DNS rebinding between
validation and connect cannot reach an internal address.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from workers.remotes.policy import InvalidRemote, IPAddress, RemotePolicy, show

__all__ = ["check_address", "parse_host", "resolve_pinned"]

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?$")

# Names that by convention resolve to the local machine or an intranet.  They
# are refused by name so that a resolver with a search domain or a split-horizon
# DNS cannot hand us an internal address we then fail to notice (G5/G6).
_INTERNAL_SUFFIXES = (
    "localhost",
    "local",
    "localdomain",
    "internal",  # ICANN private-use TLD; also metadata.google.internal
    "intranet",
    "lan",
    "home",
    "corp",
    "home.arpa",
    "arpa",  # in-addr.arpa / ip6.arpa PTR names are never repositories
)

# Cloud metadata endpoints: never reachable, even inside allowed_nets, because
# they hand out instance credentials (G5, Capital One-style SSRF).
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS / GCP / Azure / OpenStack / DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer (looks public, is not)
        "192.0.0.192",  # Oracle Cloud
    )
)
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_COMPAT = ipaddress.IPv6Network("::/96")

# --------------------------------------------------------------------------- addresses


def _refusal(addr: IPAddress, policy: RemotePolicy) -> str | None:
    """Why ``addr`` may not be contacted, or None when it may."""
    if addr in _METADATA:
        return "is a cloud metadata address"
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            # fe80::1%eth0: zone ids only exist for link-local targets.
            return "has an IPv6 zone id"
        # IPv6 spellings of IPv4 addresses: check the embedded address, or
        # ``[::ffff:127.0.0.1]`` / NAT64 / 6to4 reach loopback and metadata.
        mapped = addr.ipv4_mapped
        if mapped is not None:
            return _refusal(mapped, policy)
        if addr in _NAT64:
            return _refusal(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), policy)
        six_to_four = addr.sixtofour
        if six_to_four is not None:
            inner = _refusal(six_to_four, policy)
            if inner is not None:
                return inner
        if addr.teredo is not None and not _allowed(addr, policy):
            # Teredo hides the client address behind an XOR; refuse the range.
            return "is a Teredo tunnel address"
        if addr in _NAT64_LOCAL and not _allowed(addr, policy):
            return "is a local-use NAT64 address"
        if addr in _COMPAT and int(addr) > 1 and not _allowed(addr, policy):
            # ::a.b.c.d (deprecated IPv4-compatible); some stacks route it to IPv4.
            return "is an IPv4-compatible IPv6 address"
    if _allowed(addr, policy):
        return None
    if addr.is_unspecified:
        # 0.0.0.0 / :: are treated as "this host" by Linux connect().
        return "is unspecified (this host)"
    if addr.is_loopback:
        return "is loopback"
    if addr.is_link_local:
        return "is link-local"
    if addr.is_multicast:
        return "is multicast"
    if isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT:
        return "is carrier-grade NAT (shared) space"
    if isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local:
        return "is site-local"
    if addr.is_reserved:
        return "is reserved"
    if addr.is_private:
        return "is private"
    if not addr.is_global:
        # TEST-NETs, benchmarking 198.18/15, 192.0.0/24, … (Gitea's list).
        return "is not a public address"
    return None


def _allowed(addr: IPAddress, policy: RemotePolicy) -> bool:
    return any(addr.version == net.version and addr in net for net in policy.allowed_nets)


def _parse_ip(ip: str) -> IPAddress:
    try:
        return ipaddress.ip_address(ip)
    except ValueError:
        raise InvalidRemote(f"resolver returned an invalid address {show(ip)}") from None


def check_address(ip: str, policy: RemotePolicy) -> None:
    """Raise InvalidRemote unless ``ip`` is a public address or inside ``policy.allowed_nets``."""
    addr = _parse_ip(ip)
    why = _refusal(addr, policy)
    if why is not None:
        raise InvalidRemote(f"address {addr} {why}; internal addresses are not accepted")


def _parse_ipv4_number(part: str) -> int | None:
    """One dotted part in inet_aton syntax (decimal, 0x hex, 0-prefixed octal)."""
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
        if digits == "":
            return 0
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not digits or not all(c in "0123456789abcdefABCDEF"[:base] for c in digits):
        return None
    return int(digits, base)


def _parse_legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """Parse every IPv4 spelling libc/curl accept (``127.1``, ``0x7f000001``,
    ``0177.0.0.1``, ``2130706433``).  Returns None if ``host`` is not numeric.

    Attackers spell 127.0.0.1 in these forms precisely because naive filters
    only know dotted-decimal (G5).  Raises for "numeric but invalid" such as
    ``1.1.1.1.1`` or ``256.1.1.1`` (WHATWG: a host ending in a number must be
    an IPv4 address)."""
    parts = host.split(".")
    last = parts[-1]
    ends_in_number = bool(last) and (
        last.isdigit() or (last[:2] in ("0x", "0X") and _parse_ipv4_number(last) is not None)
    )
    if not ends_in_number:
        return None
    numbers = [_parse_ipv4_number(p) if p else None for p in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise InvalidRemote(f"host {show(host)} is not a valid IPv4 address or host name")
    values = [n for n in numbers if n is not None]
    *head, tail = values
    if any(n > 255 for n in head) or tail >= 256 ** (5 - len(values)):
        raise InvalidRemote(f"host {show(host)} is not a valid IPv4 address")
    total = tail
    for i, n in enumerate(head):
        total += n << (8 * (3 - i))
    return ipaddress.IPv4Address(total)


# --------------------------------------------------------------------------- hosts


def _check_hostname(host: str) -> str:
    """Validate and normalise a DNS host name; returns the lower-case form."""
    if not host.isascii():
        raise InvalidRemote("non-ASCII host names are not accepted; use the punycode (xn--) form")
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]  # FQDN dot: same host, one dedup key
    if not name:
        raise InvalidRemote("the URL has no host")
    if len(name) > 253:
        raise InvalidRemote("host name is too long")
    labels = name.split(".")
    for label in labels:
        # LDH rule: a label may not start with '-', which also stops
        # ``ssh://-oProxyCommand=…`` (CVE-2017-1000117, G12).
        if not _LABEL.match(label):
            raise InvalidRemote(f"host {show(name)} is not a valid host name")
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise InvalidRemote(f"host {show(name)} has an invalid punycode label") from None
    for suffix in _INTERNAL_SUFFIXES:
        if name == suffix or name.endswith("." + suffix):
            raise InvalidRemote(f"host {show(name)} is an internal name; not accepted")
    if len(labels) < 2:
        # Single-label names ("redis", "db", "host") resolve through the search
        # domain to intranet services.
        raise InvalidRemote(f"host {show(name)} is not a fully qualified domain name")
    return name


def parse_host(raw_host: str) -> tuple[str, IPAddress | None]:
    """Return (host as written in the canonical URL, literal address or None)."""
    if raw_host.startswith("["):
        inner = raw_host[1:-1]
        if "%" in inner:
            # fe80::1%25eth0: zone ids only exist to reach link-local targets.
            raise InvalidRemote(f"host {show(raw_host)} is not a valid IPv6 address (zone id)")
        try:
            # No zone ids (``%25eth0``) and no IPvFuture: only plain IPv6.
            addr6 = ipaddress.IPv6Address(inner)
        except ValueError:
            raise InvalidRemote(f"host {show(raw_host)} is not a valid IPv6 address") from None
        return f"[{addr6.compressed}]", addr6
    if not raw_host:
        raise InvalidRemote("the URL has no host")
    if not raw_host.isascii():
        return _check_hostname(raw_host), None
    lowered = raw_host.lower()
    addr4 = _parse_legacy_ipv4(lowered[:-1] if lowered.endswith(".") else lowered)
    if addr4 is not None:
        # Canonical dotted-quad: git/curl never see the exotic spelling.
        return str(addr4), addr4
    return _check_hostname(raw_host), None


def _default_resolve(host: str, port: int | None) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def resolve_pinned(host: str, port: int, policy: RemotePolicy) -> tuple[str, ...]:
    """Resolve ``host`` and return its addresses for the worker to pin; refuse the
    host when it does not resolve or when ANY address is internal."""
    resolver = policy.resolve or _default_resolve
    try:
        answers = resolver(host, port)
    except (OSError, UnicodeError, ValueError):
        answers = []
    if not answers:
        # GitLab: "Host cannot be resolved" is a refusal, not a pass (G6).
        raise InvalidRemote(f"host {show(host)} could not be resolved")
    pinned: list[str] = []
    for answer in answers:
        addr = _parse_ip(str(answer))
        why = _refusal(addr, policy)
        if why is not None:
            # ANY internal answer refuses the host: with several A records the
            # client may pick any of them (G6, Gitea checkByAllowBlockList).
            raise InvalidRemote(
                f"host {show(host)} resolves to {addr}, which {why}; "
                "internal addresses are not accepted"
            )
        text = str(addr)
        if text not in pinned:
            pinned.append(text)
    return tuple(pinned)
