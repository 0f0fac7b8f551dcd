"""The Sentinel form of a Redis URL, for a highly available queue server.

``redis+sentinel://[[user]:password@]host1:26379,host2:26379/<service>[/<db>]``

* the hosts are the **Sentinels** (port 26379 when left out), at least one;
* ``<service>`` is the master group name the Sentinels monitor (``sentinel monitor
  <service> …``), required;
* ``<db>`` is the database index on that master (0 when left out);
* ``user``/``password`` authenticate to the master (not to the Sentinels).

Plain ``redis://``, ``rediss://`` and ``unix://`` URLs are not parsed here (redis-py
reads them itself). This module imports no Django: settings turn ``ValueError`` into
``ImproperlyConfigured``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
FORM = "redis+sentinel://[[user]:password@]host:26379[,host:26379…]/<service>[/<db>]"


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() == SCHEME


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse the form above; ``ValueError`` naming what is wrong otherwise."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != SCHEME or not sep:
        raise ValueError(f"not a {SCHEME}:// URL")
    if "?" in rest or "#" in rest:
        raise ValueError("no query or fragment is supported")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        hostlist, userinfo = netloc, ""
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # "secret@host": the redis:// convention for a bare password
            username, password = None, unquote(user)
    sentinels = tuple(_host_port(item) for item in hostlist.split(",")) if hostlist else ()
    if not sentinels:
        raise ValueError("at least one Sentinel host:port is required")
    parts = [p for p in path.split("/")] if path else []
    if not parts or not parts[0]:
        raise ValueError("the master group name (/<service>) is required")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError("the path must be /<service> or /<service>/<db number>")
    db = int(parts[1]) if len(parts) == 2 else 0
    return SentinelTarget(sentinels, unquote(parts[0]), db, username, password)


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    parts = urlsplit(f"//{item}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad Sentinel port in {item!r}") from exc
    if not parts.hostname:
        raise ValueError(f"empty Sentinel host in {item!r}")
    return parts.hostname, port or DEFAULT_SENTINEL_PORT


def safe_sentinel_url(target: SentinelTarget) -> str:
    """The URL back, without its password (for pages and logs)."""
    hosts = ",".join(f"{h}:{p}" for h, p in target.sentinels)
    auth = "***@" if target.password else ""
    return f"{SCHEME}://{auth}{hosts}/{target.service}/{target.db}"
