"""Validation and normalisation of user-submitted git remotes (DESIGN.md §8).

Every repository URL a user types ends up as an argument to ``git clone`` /
``git fetch`` inside a worker.  This module is the first wall (git's own
``GIT_ALLOW_PROTOCOL`` / ``protocol.*.allow`` settings are the second, see
research/reliability.md §1.3): it accepts only a small, well-understood URL
grammar and refuses everything else with a one-line message.

Design choices (each refusal names the attack it stops, catalog rows G1-G13):

* We parse by hand instead of with ``urllib.parse``: urllib is lenient (it
  accepts backslashes, several ``@``, empty ports, odd IPv4 spellings) and a
  lenient parser that disagrees with git/curl is exactly how SSRF filters are
  bypassed.  We accept the intersection of what the parsers agree on.
* Query strings and fragments are **refused**, not stripped: git remotes never
  need them and they carry the ``?%0ahost=`` smuggling tricks (G11).
* Non-ASCII host names are **refused**, not IDNA-mapped: IDNA2003 maps
  ``mißile.com`` to ``missile.com`` and fullwidth letters to ASCII, so the host
  shown to the user would differ from the host git contacts (G13).  Users can
  type the ``xn--`` form, which is validated to decode.
* ``Remote.url`` is the dedup key (lower-case scheme/host, default port
  dropped, trailing ``/`` and one ``.git`` dropped).  ``Remote.git_url()`` is
  what the worker hands to git: same canonical host/port (so git never
  re-parses an exotic spelling such as ``0x7f.1``) but the user's path
  (``.git`` kept), because dumb-HTTP and plain ssh servers need the real path.
* ``Remote.pinned_addresses`` are the addresses validated here; the worker must
  pin them (``http.curloptResolve``) so a DNS rebinding between validation and
  connect cannot reach an internal address (G7).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes

__all__ = [
    "ALLOWED_SCHEMES",
    "InvalidRemote",
    "Remote",
    "RemotePolicy",
    "check_address",
    "normalise_branch",
    "parse_remote",
    "redact",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_SCHEMES = frozenset({"https", "http", "ssh", "git", "file"})
_NETWORK_SCHEMES = ("https", "http", "ssh", "git")
_DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}

MAX_URL_LENGTH = 2048
MAX_BRANCH_LENGTH = 255


class InvalidRemote(ValueError):
    """A refused remote or branch.  ``str(exc)`` is one safe, human-readable line."""

    def __init__(self, message: str) -> None:
        # Messages are built from validated fragments only, but redact and
        # flatten anyway so that no future message can leak a token or inject
        # a second line into a log / form error / JSON body.
        super().__init__(" ".join(redact(message).split()))


@dataclass(frozen=True)
class Remote:
    url: str
    scheme: str
    host: str | None
    port: int | None
    pinned_addresses: tuple[str, ...] = ()
    # What git receives.  compare=False: two spellings of the same repository
    # (``x`` vs ``x.git``) are the same Remote.
    fetch_url: str = field(default="", compare=False)

    def git_url(self) -> str:
        """The string to pass to git after ``--`` (for ``file``: the resolved path)."""
        return self.fetch_url or self.url


def _default_resolve(host: str, port: int | None) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


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


# --------------------------------------------------------------------------- helpers


def _show(value: str, limit: int = 80) -> str:
    """Quote a (validated) fragment for a message: printable, bounded, one line."""
    shown = "".join(ch if ch.isprintable() else "?" for ch in value)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return repr(shown)


def _has_unsafe_chars(text: str) -> bool:
    # Control chars (CR/LF/NUL/TAB) split git config lines and HTTP headers
    # (G11, GHSA-v87r-6q3f-2j67); format chars (bidi overrides, zero-width,
    # soft hyphen) make a URL display differently from what git fetches (G13);
    # any whitespace is never part of a remote and hides argument splitting.
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] in ("C", "Z"):
            return True
    return False


# URL schemes git would hand to a "remote helper" or a curl transport.  Any
# ``x::address`` is git's transport-helper syntax (``ext::sh -c …`` is RCE,
# CVE-2022-24439); we refuse ``::`` anywhere outside an IPv6 bracket so that
# GitPython's own broader ``(.+)::.+`` check can never be the one to fail.
_BRACKETS = re.compile(r"\[[^\]]*\]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.DOTALL)
_SCP = re.compile(r"^([^@/:\[\]]+)@(\[[^\]/]*\]|[^:/\[\]@]+):(.*)$", re.DOTALL)
_SSH_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._\-]{0,63}$")
_PORT = re.compile(r"^[0-9]{1,5}$")
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?$")
# Path characters allowed in http(s)/git/ssh URLs: RFC 3986 pchar minus ``$``
# (and without ``{}``/backtick, which are not pchar anyway) so that
# ``$DJANGO_SECRET_KEY`` / ``${SECRET}`` can never be expanded by any layer
# (G10, GHSA-rwj8-pgh3-r573).  ``%`` only as a well-formed escape, so
# ``%SECRET%`` is refused as well.
_URL_PATH = re.compile(r"^[A-Za-z0-9\-._~!&'()*+,;=:@/%]*$")
_SCP_PATH = re.compile(r"^[A-Za-z0-9\-._~!&'()*+,;=:@/]*$")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

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
        raise InvalidRemote(f"resolver returned an invalid address {_show(ip)}") from None


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
        raise InvalidRemote(f"host {_show(host)} is not a valid IPv4 address or host name")
    values = [n for n in numbers if n is not None]
    *head, tail = values
    if any(n > 255 for n in head) or tail >= 256 ** (5 - len(values)):
        raise InvalidRemote(f"host {_show(host)} is not a valid IPv4 address")
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
            raise InvalidRemote(f"host {_show(name)} is not a valid host name")
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise InvalidRemote(f"host {_show(name)} has an invalid punycode label") from None
    for suffix in _INTERNAL_SUFFIXES:
        if name == suffix or name.endswith("." + suffix):
            raise InvalidRemote(f"host {_show(name)} is an internal name; not accepted")
    if len(labels) < 2:
        # Single-label names ("redis", "db", "host") resolve through the search
        # domain to intranet services.
        raise InvalidRemote(f"host {_show(name)} is not a fully qualified domain name")
    return name


def _parse_host(raw_host: str) -> tuple[str, IPAddress | None]:
    """Return (host as written in the canonical URL, literal address or None)."""
    if raw_host.startswith("["):
        inner = raw_host[1:-1]
        if "%" in inner:
            # fe80::1%25eth0: zone ids only exist to reach link-local targets.
            raise InvalidRemote(f"host {_show(raw_host)} is not a valid IPv6 address (zone id)")
        try:
            # No zone ids (``%25eth0``) and no IPvFuture: only plain IPv6.
            addr6 = ipaddress.IPv6Address(inner)
        except ValueError:
            raise InvalidRemote(f"host {_show(raw_host)} is not a valid IPv6 address") from None
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


def _resolve(host: str, port: int, policy: RemotePolicy) -> tuple[str, ...]:
    resolver = policy.resolve or _default_resolve
    try:
        answers = resolver(host, port)
    except (OSError, UnicodeError, ValueError):
        answers = []
    if not answers:
        # GitLab: "Host cannot be resolved" is a refusal, not a pass (G6).
        raise InvalidRemote(f"host {_show(host)} could not be resolved")
    pinned: list[str] = []
    for answer in answers:
        addr = _parse_ip(str(answer))
        why = _refusal(addr, policy)
        if why is not None:
            # ANY internal answer refuses the host: with several A records the
            # client may pick any of them (G6, Gitea checkByAllowBlockList).
            raise InvalidRemote(
                f"host {_show(host)} resolves to {addr}, which {why}; "
                "internal addresses are not accepted"
            )
        text = str(addr)
        if text not in pinned:
            pinned.append(text)
    return tuple(pinned)


# --------------------------------------------------------------------------- paths


def _normalise_escapes(path: str) -> str:
    """RFC 3986 §6.2.2: decode escaped unreserved chars, upper-case the rest."""

    def fix(m: re.Match[str]) -> str:
        ch = chr(int(m.group(1), 16))
        return ch if ch in _UNRESERVED else "%" + m.group(1).upper()

    return _ESCAPE.sub(fix, path)


def _check_url_path(path: str, *, scp: bool) -> str:
    """Validate a remote path; returns it without trailing slashes."""
    pattern = _SCP_PATH if scp else _URL_PATH
    if not pattern.match(path):
        raise InvalidRemote(
            "the repository path contains characters that are not accepted "
            "(spaces, $, backslashes, quotes, non-ASCII…)"
        )
    if _BAD_ESCAPE.search(path):
        raise InvalidRemote("the repository path has an invalid %-escape")
    decoded = unquote_to_bytes(path)
    # %0a/%0d/%00 decode to config-line and header injection (G11).
    if any(b < 0x20 or b == 0x7F for b in decoded) or b"\\" in decoded:
        raise InvalidRemote("the repository path contains encoded control characters")
    if re.search(r"%(?:2[Ff]|5[Cc])", path):
        # %2F / %5C: a separator that dedup and the server may see differently.
        raise InvalidRemote("the repository path contains an encoded '/' or '\\'")
    text = unquote(path, errors="replace")
    trimmed = path.rstrip("/")
    segments = text.rstrip("/").split("/")
    body = segments[1:] if segments and segments[0] == "" else segments
    if not trimmed or not body or body == [""]:
        raise InvalidRemote("the URL has no repository path")
    for segment in body:
        if segment in ("", ".", ".."):
            # '..' and '//' are normalised differently by curl, servers and our
            # dedup key: refuse rather than guess.
            raise InvalidRemote("the repository path contains empty, '.' or '..' segments")
        if segment.startswith("-"):
            # Option-looking segments reach git-upload-pack / ssh argv (G2, G12).
            raise InvalidRemote("a repository path segment starts with '-'")
    return trimmed


def _strip_dot_git(path: str) -> str:
    last = path.rsplit("/", 1)[-1]
    # Keep "x.git" when stripping would leave "", "." or ".." (not a name).
    if last.endswith(".git") and last[: -len(".git")] not in ("", ".", ".."):
        return path[: -len(".git")]
    return path


def _local_remote(path_text: str, policy: RemotePolicy) -> Remote:
    if not policy.local_roots:
        # G4: /etc, /srv/app/repos/other-user, file:///… are refused by
        # default; GitPython does not block local clones (reliability §0.1).
        raise InvalidRemote("local paths are not accepted")
    if not path_text.startswith("/"):
        raise InvalidRemote("local paths must be absolute")
    if any(seg.startswith("-") for seg in path_text.split("/")):
        raise InvalidRemote("a path segment starts with '-'")
    # realpath resolves '..' and every symlink, so a link inside a root that
    # points outside it (or ``root/../etc``) is judged by where it really goes.
    resolved = Path(os.path.realpath(path_text))
    roots = [Path(os.path.realpath(root)) for root in policy.local_roots]
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        # Same message whether or not the target exists: no existence oracle.
        raise InvalidRemote("local path is not under an allowed repository root")
    text = str(resolved)
    if _has_unsafe_chars(text) or any(seg.startswith("-") for seg in text.split("/")):
        raise InvalidRemote("local path resolves to a name that is not accepted")
    try:
        is_dir = resolved.is_dir()
    except OSError:
        is_dir = False
    if not is_dir:
        raise InvalidRemote("local path is not an existing directory")
    return Remote(
        url=text, scheme="file", host=None, port=None, pinned_addresses=(), fetch_url=text
    )


# --------------------------------------------------------------------------- entry point


def _network_remote(
    scheme: str,
    user: str | None,
    raw_host: str,
    port: int | None,
    path: str,
    policy: RemotePolicy,
    *,
    scp: bool,
) -> Remote:
    if user is not None:
        if ":" in user or scheme != "ssh":
            # https://user:pass@h, https://TOKEN@h: the token would land in
            # .git/config, RQ job args, exc_info and logs (G9).
            raise InvalidRemote("credentials in URLs are not accepted")
        if not _SSH_USER.match(user):
            # ssh://-x@host: an option-looking user is passed to ssh (G12).
            raise InvalidRemote("the ssh user name is not valid")
    # Host and literal-address checks come first: they are the security
    # decision and the most useful message for an SSRF attempt.
    host_text, literal = _parse_host(raw_host)
    if literal is not None:
        check_address(str(literal), policy)
    if port is not None:
        if not 1 <= port <= 65535:
            raise InvalidRemote(f"port {port} is out of range")
        if port == _DEFAULT_PORTS[scheme]:
            port = None
        elif port < 1024:
            # Privileged ports other than the scheme's own are SMTP, SMB, …:
            # cross-protocol SSRF targets, never git servers (GitLab rule).
            raise InvalidRemote(f"port {port} is not allowed for {scheme}")
    trimmed = _check_url_path(path, scp=scp)
    effective_port = port if port is not None else _DEFAULT_PORTS[scheme]
    pinned: tuple[str, ...] = ()
    if literal is not None:
        pinned = (str(literal),)
    elif policy.resolve_hosts:
        # Last: only a URL that is otherwise valid costs a DNS query.
        pinned = _resolve(host_text, effective_port, policy)
    userinfo = f"{user}@" if user is not None else ""
    hostport = host_text + (f":{port}" if port is not None else "")
    if scp:
        key_path = "/" + trimmed.lstrip("/")
        fetch = f"{userinfo}{host_text}:{trimmed}"
    else:
        key_path = _normalise_escapes(trimmed)
        fetch = f"{scheme}://{userinfo}{hostport}{key_path}"
    url = f"{scheme}://{userinfo}{hostport}{_strip_dot_git(key_path)}"
    return Remote(
        url=url,
        scheme=scheme,
        host=host_text.strip("[]"),
        port=port,
        pinned_addresses=pinned,
        fetch_url=fetch,
    )


def parse_remote(raw: str, policy: RemotePolicy) -> Remote:
    """Validate a user-submitted remote; return its canonical form or raise InvalidRemote."""
    if not isinstance(raw, str):
        raise InvalidRemote("the repository URL must be text")
    if len(raw) > MAX_URL_LENGTH:
        # Bounded work for every later step; also GitLab's limit.
        raise InvalidRemote(f"the repository URL is longer than {MAX_URL_LENGTH} characters")
    text = raw.strip(" ")
    if not text.strip():
        raise InvalidRemote("enter a repository URL")
    if _has_unsafe_chars(text):
        raise InvalidRemote("the repository URL contains control or whitespace characters")
    if text.startswith("-"):
        # ``--upload-pack=…``, ``-u …``, ``-oProxyCommand=…`` (G2, G12).
        raise InvalidRemote("the repository URL looks like a command-line option")
    if "\\" in text:
        # C:\x, \\host\share, and WHATWG's "backslash is a slash" parser
        # differential (G4).
        raise InvalidRemote("backslashes are not accepted in repository URLs")
    if "::" in _BRACKETS.sub("", text):
        raise InvalidRemote("transport::address remotes are not accepted")

    match = _SCHEME.match(text)
    if match is not None:
        scheme, rest = match.group(1).lower(), match.group(2)
        if scheme == "file":
            if not rest.startswith("/"):
                # file://host/… would be a UNC-style remote share.
                raise InvalidRemote("file URLs must have the form file:///absolute/path")
            if "?" in rest or "#" in rest:
                raise InvalidRemote("query strings and fragments are not accepted")
            local = unquote_to_bytes(rest)
            if any(b < 0x20 or b == 0x7F for b in local):
                raise InvalidRemote("the path contains encoded control characters")
            try:
                local_path = unquote(rest, errors="strict")
            except UnicodeDecodeError:
                raise InvalidRemote("the path is not valid UTF-8") from None
            return _local_remote(local_path, policy)
        if scheme not in _NETWORK_SCHEMES:
            raise InvalidRemote(
                f"scheme {_show(scheme)} is not accepted; use https, http, ssh or git"
            )
        if not rest.isascii():
            raise InvalidRemote(
                "non-ASCII characters are not accepted; use punycode/percent-encoding"
            )
        if "?" in rest or "#" in rest:
            raise InvalidRemote("query strings and fragments are not accepted")
        authority, slash, path = rest.partition("/")
        path = slash + path
        user: str | None = None
        if "@" in authority:
            if authority.count("@") > 1:
                # https://a@evil@good: parsers disagree about which host wins.
                raise InvalidRemote("credentials in URLs are not accepted")
            user, _, authority = authority.partition("@")
        port: int | None = None
        if authority.startswith("["):
            close = authority.find("]")
            if close == -1:
                raise InvalidRemote("unterminated IPv6 address in the URL")
            host, after = authority[: close + 1], authority[close + 1 :]
        else:
            host, colon, after = authority.partition(":")
            after = colon + after
        if after:
            if not after.startswith(":") or not _PORT.match(after[1:]):
                raise InvalidRemote("the port must be a number between 1 and 65535")
            port = int(after[1:])
        return _network_remote(scheme, user, host, port, path, policy, scp=False)

    if text.startswith("/"):
        return _local_remote(text, policy)

    scp = _SCP.match(text)
    if scp is not None:
        user, host, path = scp.group(1), scp.group(2), scp.group(3)
        if not text.isascii():
            raise InvalidRemote("non-ASCII host names are not accepted; use the punycode form")
        if "?" in path or "#" in path:
            raise InvalidRemote("query strings and fragments are not accepted")
        return _network_remote("ssh", user, host, None, path, policy, scp=True)

    if text.startswith(("./", "../", "~", ".")) or "/" in text.split(":", 1)[0]:
        raise InvalidRemote("relative paths are not accepted")
    raise InvalidRemote(
        "unrecognised repository URL; use https://host/owner/repo or user@host:owner/repo"
    )


# --------------------------------------------------------------------------- branches

_BRANCH_FORBIDDEN = frozenset("~^:?*[\\")


def normalise_branch(raw: str | None) -> str:
    """Validate a branch name (``git check-ref-format --branch`` rules, stricter).

    Returns "" for "use the default branch".  A leading ``refs/heads/`` is
    dropped.  Refuses anything git could read as an option or a revision
    expression (``--output=…``, ``HEAD@{-1}``, ``a..b``), G3."""
    if raw is None:
        return ""
    name = raw.strip(" ")
    if not name:
        return ""
    if len(name) > MAX_BRANCH_LENGTH:
        raise InvalidRemote(f"branch name is longer than {MAX_BRANCH_LENGTH} characters")
    if _has_unsafe_chars(name):
        raise InvalidRemote("branch name contains control or whitespace characters")
    if name.startswith("-"):
        # --output=/tmp/pwn, -o/tmp/pwn, --exec=…: option injection into git.
        raise InvalidRemote("branch name must not start with '-'")
    if name.startswith("refs/heads/"):
        name = name[len("refs/heads/") :]
        if not name:
            raise InvalidRemote("branch name is empty")
    if any(ch in _BRANCH_FORBIDDEN for ch in name):
        raise InvalidRemote("branch name contains one of ~ ^ : ? * [ \\")
    if ".." in name:
        # Range syntax and ../ path traversal (CVE-2023-41040).
        raise InvalidRemote("branch name must not contain '..'")
    if "@{" in name or name == "@":
        # Reflog syntax (HEAD@{-1}) selects another revision.
        raise InvalidRemote("branch name must not contain '@{' or be '@'")
    if name.startswith("/") or name.endswith("/") or "//" in name:
        raise InvalidRemote("branch name must not start or end with '/' or contain '//'")
    if name.endswith(".") or name.endswith(".lock"):
        raise InvalidRemote("branch name must not end with '.' or '.lock'")
    for component in name.split("/"):
        if component.startswith(".") or component.startswith("-"):
            raise InvalidRemote("a branch name component must not start with '.' or '-'")
        if component.endswith(".lock"):
            raise InvalidRemote("a branch name component must not end with '.lock'")
    if name == "HEAD":
        raise InvalidRemote("'HEAD' is not a branch name")
    return name


# --------------------------------------------------------------------------- redaction

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
