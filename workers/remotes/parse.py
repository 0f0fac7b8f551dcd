"""Validation and normalisation of user-submitted git remotes (docs/security.md).

Every repository URL a user types ends up as an argument to ``git clone`` /
``git fetch`` inside a worker.  This module is the first wall (git's own
``GIT_ALLOW_PROTOCOL`` / ``protocol.*.allow`` settings, set on every git
process we run, are the second): it accepts only a small, well-understood URL
grammar and refuses everything else with a one-line message.

Design choices (each refusal names the attack it stops: rows G1-G13 of the attack
catalog in docs/security.md):

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

The checks live beside this module, one noun each: ``policy`` (the policy and
the refusal), ``hosts`` (host names and addresses: the SSRF wall), ``branches`` and
``redaction``.  The names callers import from here are re-exported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes

from workers.remotes.branches import normalise_branch
from workers.remotes.hosts import check_address, parse_host, resolve_pinned
from workers.remotes.local_repos import check_local_repository
from workers.remotes.policy import InvalidRemote, RemotePolicy, has_unsafe_chars, show
from workers.remotes.redaction import redact

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

ALLOWED_SCHEMES = frozenset({"https", "http", "ssh", "git", "file"})
_NETWORK_SCHEMES = ("https", "http", "ssh", "git")
_DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}

MAX_URL_LENGTH = 2048


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


# ``x::address`` is git's transport-helper syntax (``ext::sh -c …`` is RCE,
# CVE-2022-24439); we refuse ``::`` anywhere outside an IPv6 bracket so that
# GitPython's own broader ``(.+)::.+`` check can never be the one to fail.
_BRACKETS = re.compile(r"\[[^\]]*\]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.DOTALL)
_SCP = re.compile(r"^([^@/:\[\]]+)@(\[[^\]/]*\]|[^:/\[\]@]+):(.*)$", re.DOTALL)
_SSH_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._\-]{0,63}$")
_PORT = re.compile(r"^[0-9]{1,5}$")
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
    # Every trailing ".git" goes, not just one: the canonical form must be a fixed point
    # (parsing it again gives it back), and "x.git.git" → "x.git" would parse to "x".
    # Keep "x.git" when stripping would leave "", "." or ".." (not a name).
    while True:
        last = path.rsplit("/", 1)[-1]
        if not (last.endswith(".git") and last[: -len(".git")] not in ("", ".", "..")):
            return path
        path = path[: -len(".git")]


def _local_remote(path_text: str, policy: RemotePolicy) -> Remote:
    if not policy.local_roots:
        # G4: /etc, /srv/app/repos/other-user, file:///… are refused by
        # default; GitPython does not block local clones.
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
    if has_unsafe_chars(text) or any(seg.startswith("-") for seg in text.split("/")):
        raise InvalidRemote("local path resolves to a name that is not accepted")
    try:
        is_dir = resolved.is_dir()
    except OSError:
        is_dir = False
    if not is_dir:
        raise InvalidRemote("local path is not an existing directory")
    # git follows redirections inside the repository too (alternates, a .git file,
    # commondir, symlinks): each must stay under the roots (docs/security.md#g22).
    check_local_repository(resolved, roots)
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
    host_text, literal = parse_host(raw_host)
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
        pinned = resolve_pinned(host_text, effective_port, policy)
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
    """Validate a user-submitted remote; return its canonical form or raise InvalidRemote.

    The canonical form and what git gets are bounded too, not only what was typed: an
    scp-style ``git@host:path`` gains ``ssh://`` and a slash, a local path resolves to
    a longer one, and the repository's columns hold ``MAX_URL_LENGTH`` characters."""
    remote = _parse_remote(raw, policy)
    if max(len(remote.url), len(remote.git_url())) > MAX_URL_LENGTH:
        raise InvalidRemote(
            f"the repository URL is longer than {MAX_URL_LENGTH} characters once normalised"
        )
    return remote


def _parse_remote(raw: str, policy: RemotePolicy) -> Remote:
    if not isinstance(raw, str):
        raise InvalidRemote("the repository URL must be text")
    if len(raw) > MAX_URL_LENGTH:
        # Bounded work for every later step; also GitLab's limit.
        raise InvalidRemote(f"the repository URL is longer than {MAX_URL_LENGTH} characters")
    text = raw.strip(" ")
    if not text.strip():
        raise InvalidRemote("enter a repository URL")
    if has_unsafe_chars(text):
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
                f"scheme {show(scheme)} is not accepted; use https, http, ssh or git"
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
