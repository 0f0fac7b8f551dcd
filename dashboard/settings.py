"""gitward settings: environment only, with defaults that run on a fresh machine.

Every variable is read through ``dashboard.infra.env`` helpers and parsed here, at start-up:
a bad value raises ``ImproperlyConfigured`` naming the variable and the expected form
(``manage.py`` prints it as one line and exits 1), never a bare ``ValueError`` or a
failure at request time. Rules that relate several variables are Django system checks
(``dashboard/infra/system_checks.py``). Every variable is documented in README.md; a test checks the
README table is complete.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from dashboard import rollouts as _rollouts
from dashboard.infra import env_bool, env_float, env_int, env_list, env_mapping, env_str
from workers.git import parse_limits
from workers.runtime import FORM as SENTINEL_FORM
from workers.runtime import is_sentinel_url, parse_failpoints, parse_sentinel_url


def _invalid(name: str, expected: str, got: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{name} must be {expected}, got {got!r}")


def _seconds_list(name: str, items: list[str]) -> list[float]:
    """Each comma-separated item a finite number of seconds >= 0."""
    out = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise _invalid(name, "comma-separated seconds >= 0 (e.g. 2,10)", item)
        out.append(value)
    return out


def _networks(name: str, items: list[str]) -> list[str]:
    """Each item a CIDR (host bits allowed: ``10.1.2.3/8`` means ``10.0.0.0/8``)."""
    out = []
    for item in items:
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise _invalid(name, "comma-separated CIDRs (e.g. 10.0.0.0/8,fd00::/8)", item) from None
    return out


def _redis_urls(name: str, items: list[str], *, schemes: tuple[str, ...]) -> list[str]:
    """Each item a URL with one of ``schemes``; no master listed twice."""
    for item in items:
        parts = urlsplit(item)
        if parts.scheme not in schemes or not (parts.netloc or parts.path):
            expected = "Redis URLs (" + ", ".join(f"{s}://…" for s in schemes) + ")"
            raise _invalid(name, expected, item)
    if len(set(items)) != len(items):
        # A master listed twice would vote twice: two real nodes could make a "majority".
        raise _invalid(name, "distinct Redis masters (each listed once)", ",".join(items))
    return items


def _check_queue_url(url: str) -> None:
    """``REDIS_URL``: a plain Redis URL or the Sentinel form (``workers.runtime.redis_urls``)."""
    if is_sentinel_url(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise _invalid("REDIS_URL", f"{SENTINEL_FORM} ({exc})", url) from None
        return
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.netloc or parts.path):
        raise _invalid("REDIS_URL", "a Redis URL (redis://host:6379/0)", url)


def channel_layer_host(url: str, timeout: float) -> dict[str, object]:
    """channels-redis's host entry for ``url`` (or its Sentinel form) with our connect
    timeout. No read timeout: a consumer's receive blocks in BZPOPMIN for seconds by
    design; publishes and group joins are bounded by ``dashboard.infra.events`` instead."""
    options: dict[str, object] = {"socket_connect_timeout": timeout}
    if not is_sentinel_url(url):
        return {"address": url, **options}
    target = parse_sentinel_url(url)
    host: dict[str, object] = {
        "master_name": target.service,
        "sentinels": [list(s) for s in target.sentinels],
        "sentinel_kwargs": {"socket_connect_timeout": timeout, "socket_timeout": timeout},
        "db": target.db,
        **options,
    }
    if target.username:
        host["username"] = target.username
    if target.password:
        host["password"] = target.password
    return host


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _invalid(name, "one of " + ", ".join(choices), value)
    return value


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GITWARD_VAR_DIR", str(BASE_DIR / "var"))).resolve()

# ---------------------------------------------------------------------------- core
DEBUG = env_bool("GITWARD_DEBUG", False)
PRODUCTION = env_bool("GITWARD_PRODUCTION", False)


def _secret_key() -> str:
    """The key from the environment, else one generated once and kept under var/."""
    from_env = env_str("GITWARD_SECRET_KEY", "")
    if from_env:
        return from_env
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        # Two processes starting at once may both write; each writes a valid key and the
        # last rename wins. Both then re-read the same file on their next start.
        tmp = path.with_suffix(f".{secrets.token_hex(4)}")
        tmp.write_text(key)
        tmp.replace(path)
        return path.read_text().strip()


SECRET_KEY = _secret_key()
if PRODUCTION and not os.environ.get("GITWARD_SECRET_KEY"):
    raise ImproperlyConfigured("GITWARD_PRODUCTION needs GITWARD_SECRET_KEY (a long random value)")
ALLOWED_HOSTS = env_list("GITWARD_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
if "*" in ALLOWED_HOSTS:
    # The websocket Origin check trusts ALLOWED_HOSTS: a wildcard would let any site in.
    raise ImproperlyConfigured("GITWARD_ALLOWED_HOSTS must list host names, not '*'")
CSRF_TRUSTED_ORIGINS = env_list("GITWARD_CSRF_TRUSTED_ORIGINS", "")
for _origin in CSRF_TRUSTED_ORIGINS:
    if urlsplit(_origin).scheme not in {"http", "https"} or not urlsplit(_origin).netloc:
        raise _invalid(
            "GITWARD_CSRF_TRUSTED_ORIGINS", "comma-separated origins (https://host)", _origin
        )

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "dashboard.middleware.EventActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.middleware.ContentSecurityPolicyMiddleware",
    # Before any view or process_view (CSRF reads request.POST): 400/413 for bad bodies.
    "dashboard.middleware.RequestInputMiddleware",
    "dashboard.accounts.audit.AuditReasonMiddleware",
    "dashboard.middleware.QueueUnavailableMiddleware",
]

#: Request limits (docs/api.md#limits), answered by dashboard.middleware.RequestInputMiddleware:
#: a larger body is a 413, more fields (query or form) a 400. Django's defaults, stated: no
#: request of ours comes near them (the largest, a rollout's config, is a few kilobytes).
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
DATA_UPLOAD_MAX_NUMBER_FILES = 100

ROOT_URLCONF = "dashboard.urls"
ASGI_APPLICATION = "dashboard.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.middleware.queue_server_context",
                "dashboard.middleware.live_socket_context",
                # After Django's built-in csrf processor, whose token it replaces while
                # a reusable page renders (dashboard/web/page_cache.py).
                "dashboard.web.page_cache.page_marks",
            ],
            # |ago, |shortid, |count, |level on every page (dashboard/templatetags).
            "builtins": ["dashboard.templatetags.gitward"],
        },
    }
]

# ---------------------------------------------------------------------------- database
_DEFAULT_DATABASE_URL = f"sqlite:///{VAR_DIR / 'gitward.sqlite3'}"
DATABASE_URL = env_str("DATABASE_URL", _DEFAULT_DATABASE_URL) or _DEFAULT_DATABASE_URL
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
except ValueError:
    DATABASES = {"default": {"NAME": ""}}
if not DATABASES["default"].get("NAME"):
    # Only the scheme is echoed: the URL may carry a password.
    raise _invalid(
        "DATABASE_URL",
        "a database URL naming a database (postgres://user@host:5432/name or sqlite:///path)",
        urlsplit(DATABASE_URL).scheme + "://…",
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several worker processes write to one file: WAL lets readers run beside the
    # writer, IMMEDIATE takes the write lock at BEGIN (no deadlocking lock upgrades),
    # and the timeout makes writers queue instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 60,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file (not :memory:) so that worker subprocesses in fault tests share it; one per
    # test process so that two suites in one checkout never share a database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Which process holds each connection, in pg_stat_activity (a forked child renames
    # its own: dashboard/infra/dbpool.py).
    _command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = (
        f"gitward {os.getpid()} {_command}".strip()[:63]
    )
#: Connections one process may hold on PostgreSQL (a psycopg pool; 0: no pool, a new
#: connection per request as before). Workers never pool (dashboard/infra/dbpool.py).
DB_POOL_SIZE = env_int("GITWARD_DB_POOL_SIZE", 8, minimum=0)
#: How long a request waits for a free pooled connection before it is answered 503.
DB_POOL_TIMEOUT = env_float("GITWARD_DB_POOL_TIMEOUT", 10.0, minimum=0.1)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and DB_POOL_SIZE:
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": DB_POOL_SIZE,
        "timeout": DB_POOL_TIMEOUT,
        # Idle connections above min_size are closed after this (the pool shrinks
        # back once a burst is over).
        "max_idle": 60.0,
    }
    # The pool checks a connection before handing it out (one empty query): after a
    # database restart, requests get fresh connections rather than broken ones.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ---------------------------------------------------------------------------- redis
STATE_FILE = VAR_DIR / "state.json"


def _embedded_redis_urls() -> list[str]:
    """Redis URLs of the nodes a running ``manage.py up`` started (var/state.json)."""
    try:
        state = json.loads(STATE_FILE.read_text())
    except (FileNotFoundError, ValueError):
        return []
    urls = state.get("redis_urls", [])
    return [str(u) for u in urls] if isinstance(urls, list) else []


REDIS_URLS = _redis_urls(
    "REDIS_URLS",
    env_list("REDIS_URLS", "") or _embedded_redis_urls(),
    schemes=("redis", "rediss", "unix"),
)
REDIS_URL = env_str("REDIS_URL", "") or (REDIS_URLS[0] if REDIS_URLS else "")
if REDIS_URL:
    _check_queue_url(REDIS_URL)
EMBEDDED_REDIS_NODES = env_int("GITWARD_EMBEDDED_REDIS_NODES", 3, minimum=1)
#: Connect and read timeout (seconds) of every queue-server client, web and worker alike
#: (workers raise the read timeout above their blocking dequeue).
QUEUE_TIMEOUT = env_float("GITWARD_QUEUE_TIMEOUT", 1.0, minimum=0.05)

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "dashboard.infra.events.ResilientChannelLayer",
        "CONFIG": {
            "hosts": [channel_layer_host(REDIS_URL or "redis://127.0.0.1:6379/0", QUEUE_TIMEOUT)],
            "capacity": 1000,
        },
    }
}

# ---------------------------------------------------------------------------- locks
LOCK_TTL = env_float("GITWARD_LOCK_TTL", 30.0, minimum=0.5)
LOCK_RETRY_COUNT = env_int("GITWARD_LOCK_RETRY_COUNT", 3, minimum=0)
LOCK_RETRY_DELAY = env_float("GITWARD_LOCK_RETRY_DELAY", 0.2, minimum=0.0)
LOCK_RETRY_JITTER = env_float("GITWARD_LOCK_RETRY_JITTER", 0.1, minimum=0.0)
LOCK_DRIFT_FACTOR = env_float("GITWARD_LOCK_DRIFT_FACTOR", 0.01, minimum=0.0)
if LOCK_DRIFT_FACTOR >= 1:
    raise _invalid(
        "GITWARD_LOCK_DRIFT_FACTOR", "a fraction of the TTL below 1", str(LOCK_DRIFT_FACTOR)
    )
LOCK_NODE_TIMEOUT = env_float("GITWARD_LOCK_NODE_TIMEOUT", 0.05, minimum=0.001)

# ---------------------------------------------------------------------------- processes
HOST = env_str("HOST", "127.0.0.1")
PORT = env_int("PORT", 8000, minimum=0, maximum=65535)
WORKERS = env_int("WORKERS", 2, minimum=0)
#: Web server processes ``up`` runs on the port: two per core this process may run on,
#: at least two (the views are Python-bound, one interpreter lock per process; on the
#: 2-core machine 4 processes served the load test best: BENCHMARKS.md, "Load").
WEB_WORKERS = env_int("GITWARD_WEB_WORKERS", max(2, 2 * len(os.sched_getaffinity(0))), minimum=1)
WORKSPACE = Path(env_str("GITWARD_WORKSPACE", str(VAR_DIR / "workspace"))).resolve()
ADMIN_PASSWORD = env_str("GITWARD_ADMIN_PASSWORD", "")

# ---------------------------------------------------------------------------- analysis
CHUNK_SIZE = env_int("GITWARD_CHUNK_SIZE", 1000, minimum=1)
#: Chunk targets grow with the history, from CHUNK_SIZE up to CHUNK_MAX, while the history
#: still splits into CHUNK_SPREAD targets (workers/chunks.chunk_target).
CHUNK_MAX = env_int("GITWARD_CHUNK_MAX", 4000, minimum=1)
if CHUNK_MAX < CHUNK_SIZE:
    if os.environ.get("GITWARD_CHUNK_MAX"):
        raise _invalid("GITWARD_CHUNK_MAX", f">= GITWARD_CHUNK_SIZE ({CHUNK_SIZE})", str(CHUNK_MAX))
    CHUNK_MAX = CHUNK_SIZE  # a larger GITWARD_CHUNK_SIZE alone: fixed-size targets
CHUNK_SPREAD = env_int("GITWARD_CHUNK_SPREAD", 4, minimum=1)
GIT_TIMEOUT = env_float("GITWARD_GIT_TIMEOUT", 900.0, minimum=1.0)
JOB_TIMEOUT = env_int("GITWARD_JOB_TIMEOUT", 1800, minimum=10)
#: A sync's work horse analyses the first chunk it planned itself, right after the sync
#: succeeded, instead of enqueueing it (one RQ job fewer per submission: workers/jobs.py).
INLINE_CHUNK = env_bool("GITWARD_INLINE_CHUNK", True)
MAX_ATTEMPTS = env_int("GITWARD_MAX_ATTEMPTS", 3, minimum=1)
#: How many analyze runs of one repository may wait in one RQ queue at once; the rest are
#: parked in the database and released one by one (docs/scheduling.md). 0: no limit (FIFO).
FAIR_WEIGHT = env_int("GITWARD_FAIR_WEIGHT", 2, minimum=0)
#: Workers a pool runs on top of WORKERS that take only small interactive jobs (the
#: reserved interactive slot, docs/scheduling.md#the-reserved-interactive-slot), and the
#: largest known history (commits) whose interactive jobs count as small.
INTERACTIVE_WORKERS = env_int("GITWARD_INTERACTIVE_WORKERS", 1, minimum=0)
INTERACTIVE_MAX_COMMITS = env_int("GITWARD_INTERACTIVE_MAX_COMMITS", 1000, minimum=0)
#: Seconds at most between two looks of an idle reserved-slot worker at its queues; an
#: express job enqueued wakes it at once (workers/pool.py, ``dequeue_express``).
EXPRESS_POLL = env_float("GITWARD_EXPRESS_POLL", 0.2, minimum=0.01)
#: Niceness a regular worker's work horse adds to itself for a job that is not express
#: (docs/scheduling.md#the-reserved-interactive-slot): the CPU goes to small work first.
BULK_NICE = env_int("GITWARD_BULK_NICE", 10, minimum=0, maximum=19)
#: Seconds at most a chunk that is not express holds back its write (all its slices
#: together) while an express job runs (docs/scheduling.md#bulk-writes-yield-to-express-work);
#: 0: never.
BULK_WRITE_YIELD = env_float("GITWARD_BULK_WRITE_YIELD", 10.0, minimum=0.0)
#: On SQLite, the rows (commits and file rows) a bulk chunk writes between two looks at
#: whether express work waits for the write lock; if so it commits and yields
#: (docs/scheduling.md#bulk-writes-in-slices-on-sqlite). PostgreSQL writes a chunk in one
#: transaction whatever its size.
SQLITE_WRITE_SLICE = env_int("GITWARD_SQLITE_WRITE_SLICE", 1000, minimum=1)
RETRY_BACKOFF = _seconds_list("GITWARD_RETRY_BACKOFF", env_list("GITWARD_RETRY_BACKOFF", "2,10"))
WORKER_DEAD_AFTER = env_float("GITWARD_WORKER_DEAD_AFTER", 30.0, minimum=1.0)

# ---------------------------------------------------------------------------- scheduling
#: This worker host's name for scheduling (docs/scheduling.md): the per-host queues of
#: mirror affinity and the host recorded on each attempt. Default: the machine's name.
HOST_ID = env_str("GITWARD_HOST_ID", "") or socket.gethostname()
try:
    #: Per-git-host fetch limits (docs/scheduling.md#per-host-fetch-limits).
    FETCH_LIMITS = parse_limits(env_str("GITWARD_FETCH_LIMITS", ""))
except ValueError as _exc:
    raise _invalid(
        "GITWARD_FETCH_LIMITS",
        'a JSON object like {"github.com": {"concurrency": 4, "rate": 2, "burst": 10}}',
        str(_exc),
    ) from None
FETCH_SLOT_WAIT = env_float("GITWARD_FETCH_SLOT_WAIT", 10.0, minimum=0.0)
FETCH_SLOT_LEASE = env_float("GITWARD_FETCH_SLOT_LEASE", 60.0, minimum=1.0)
FETCH_BACKOFF = env_float("GITWARD_FETCH_BACKOFF", 60.0, minimum=0.0)
#: Seconds a chunk waits on the queue of a worker host holding its mirror before any
#: host may take it (docs/scheduling.md#mirror-affinity); 0: no affinity.
AFFINITY_WAIT = env_float("GITWARD_AFFINITY_WAIT", 10.0, minimum=0.0)
#: Seconds a stopping worker (SIGTERM) may spend finishing its job before it hands the
#: job back (workers/pool.py). The deployment files allow this plus Pool.STOP_MARGIN.
WORKER_GRACE_DEFAULT = 60.0
WORKER_GRACE = env_float("GITWARD_WORKER_GRACE", WORKER_GRACE_DEFAULT, minimum=1.0)
#: Seconds a web process reuses the shared part of the operations snapshot
#: (dashboard/live/snapshots.py); 0 builds it for every page and socket.
SNAPSHOT_TTL = env_float("GITWARD_SNAPSHOT_TTL", 1.0, minimum=0.0)
RECONCILE_INTERVAL = env_float("GITWARD_RECONCILE_INTERVAL", 15.0, minimum=0.5)
#: Push webhooks (docs/api.md#push-webhooks): the quiet period after a push before its
#: sync, the longest a stream of pushes may delay it, and the largest body accepted.
HOOK_DEBOUNCE = env_float("GITWARD_HOOK_DEBOUNCE", 10.0, minimum=0.0)
HOOK_MAX_WAIT = env_float("GITWARD_HOOK_MAX_WAIT", 120.0, minimum=0.0)
HOOK_MAX_BYTES = env_int("GITWARD_HOOK_MAX_BYTES", 1_048_576, minimum=1024)
#: Scheduled refresh (docs/lifecycle.md#scheduled-refresh): the first interval (0: off),
#: the bounds it adapts within, and how many due repositories one round refreshes.
REFRESH_INTERVAL = env_float("GITWARD_REFRESH_INTERVAL", 0.0, minimum=0.0)
REFRESH_MIN = env_float("GITWARD_REFRESH_MIN", 300.0, minimum=1.0)
REFRESH_MAX = env_float("GITWARD_REFRESH_MAX", 86400.0, minimum=1.0)
REFRESH_BATCH = env_int("GITWARD_REFRESH_BATCH", 50, minimum=1)
#: The scheduled verifier (docs/analytics.md#verification): seconds between two passes
#: of one repository (0: off), commits re-derived per pass, repositories one reconciler
#: round enqueues, and what a mismatch does (``flag`` it, or also ``withhold`` results).
VERIFY_INTERVAL = env_float("GITWARD_VERIFY_INTERVAL", 3600.0, minimum=0.0)
VERIFY_SAMPLE = env_int("GITWARD_VERIFY_SAMPLE", 500, minimum=1)
VERIFY_BATCH = env_int("GITWARD_VERIFY_BATCH", 20, minimum=1)
VERIFY_ON_MISMATCH = env_str("GITWARD_VERIFY_ON_MISMATCH", "flag").strip().lower()
if VERIFY_ON_MISMATCH not in {"flag", "withhold"}:
    raise _invalid("GITWARD_VERIFY_ON_MISMATCH", "flag or withhold", VERIFY_ON_MISMATCH)
#: Background precomputation of the analytics' aggregates after each completed analysis
#: (docs/analytics.md#precomputation).
PRECOMPUTE_AGGREGATES = env_bool("GITWARD_PRECOMPUTE_AGGREGATES", True)
RATE_SUBMIT_PER_MINUTE = env_int("GITWARD_RATE_SUBMIT_PER_MINUTE", 30, minimum=0)
RATE_API_PER_MINUTE = env_int("GITWARD_RATE_API_PER_MINUTE", 600, minimum=0)
#: The analytics' bots lens and identity map (docs/analytics.md#lenses).
BOT_AUTHORS = env_list("GITWARD_BOT_AUTHORS", "")
IDENTITY_MAP = env_mapping("GITWARD_IDENTITY_MAP")
LOCAL_ROOTS = [Path(p).resolve() for p in env_list("GITWARD_LOCAL_ROOTS", "")]
ALLOWED_HOSTS_NETS = _networks(
    "GITWARD_ALLOWED_HOSTS_NETS", env_list("GITWARD_ALLOWED_HOSTS_NETS", "")
)
RESOLVE_HOSTS = env_bool("GITWARD_RESOLVE_HOSTS", True)
#: Clients (by REMOTE_ADDR) that may scrape /metrics without a token: Prometheus's network.
# Seconds a web process may reuse its dead-letter group counts for /metrics while the
# dead set has not changed (dashboard/runs/dead_letter_counts.py); 0 computes them at every scrape.
METRICS_CACHE_SECONDS = env_float("GITWARD_METRICS_CACHE_SECONDS", 30.0, minimum=0)
# false: no process records counters or histograms (dashboard/observability/counters.py) — only to
# measure what recording costs (bench/analysis.py --metrics-ab).
METRICS_RECORDING = env_bool("GITWARD_METRICS_RECORDING", True)
METRICS_NETWORKS = _networks("GITWARD_METRICS_NETWORKS", env_list("GITWARD_METRICS_NETWORKS", ""))

# ---------------------------------------------------------------------------- rollout gates
# Freeze windows and notification webhooks (docs/rollouts.md#freeze-windows,
# docs/rollouts.md#notifications), parsed here into plain dicts that
# dashboard/rollouts/freeze.py and dashboard/rollouts/notifications.py read.
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _json_objects(name: str, raw: str) -> list[dict[str, object]]:
    try:
        value = json.loads(raw or "[]")
    except ValueError:
        raise _invalid(name, "a JSON list of objects", raw[:80]) from None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _invalid(name, "a JSON list of objects", raw[:80])
    names = [v.get("name") for v in value]
    if not all(isinstance(n, str) and n.strip() for n in names) or len(set(names)) != len(names):
        raise _invalid(name, 'objects with distinct non-empty "name"s', raw[:80])
    return value


def _hhmm(name: str, value: object) -> str:
    text = str(value)
    hh, _, mm = text.partition(":")
    if not (hh.isdigit() and mm.isdigit() and len(mm) == 2 and 0 <= int(mm) < 60):
        raise _invalid(name, "times as HH:MM (00:00 to 24:00, UTC)", text)
    if not (0 <= int(hh) < 24 or (int(hh) == 24 and int(mm) == 0)):
        raise _invalid(name, "times as HH:MM (00:00 to 24:00, UTC)", text)
    return f"{int(hh):02d}:{mm}"


def _freeze_windows(name: str, raw: str) -> list[dict[str, object]]:
    """Absolute windows ``{"name", "from", "until"}`` (ISO 8601 with a time zone) and weekly
    ones ``{"name", "days"?, "start", "end"}`` (UTC, ``end`` before ``start`` crosses
    midnight, ``days`` the weekdays the window starts on, every day if absent)."""
    from datetime import datetime as _dt

    out: list[dict[str, object]] = []
    for item in _json_objects(name, raw):
        keys = set(item) - {"name"}
        if keys == {"from", "until"}:
            try:
                start = _dt.fromisoformat(str(item["from"]))
                end = _dt.fromisoformat(str(item["until"]))
            except ValueError:
                raise _invalid(name, '"from"/"until" as ISO 8601 times', str(item)[:80]) from None
            if start.tzinfo is None or end.tzinfo is None or end <= start:
                raise _invalid(name, '"from" before "until", both with a time zone', str(item))
            out.append({"name": item["name"], "from": start.isoformat(), "until": end.isoformat()})
        elif keys in ({"start", "end"}, {"days", "start", "end"}):
            days = item.get("days", list(_DAYS))
            if not isinstance(days, list) or not days or any(d not in _DAYS for d in days):
                raise _invalid(name, f'"days" as a list of {", ".join(_DAYS)}', str(days))
            start_s, end_s = _hhmm(name, item["start"]), _hhmm(name, item["end"])
            if start_s == end_s:
                raise _invalid(
                    name, 'a weekly window whose "start" differs from its "end"', start_s
                )
            out.append(
                {
                    "name": item["name"],
                    "days": [_DAYS.index(d) for d in days],
                    "start": start_s,
                    "end": end_s,
                }
            )
        else:
            raise _invalid(
                name, 'windows {"name", "from", "until"} or {"name", "days"?, "start", "end"}',
                str(item)[:80],
            )  # fmt: skip
    return out


def _webhooks(name: str, raw: str) -> list[dict[str, str]]:
    """Endpoints ``{"name", "url", "secret", "format"?}`` (format ``json``, the default, or
    ``slack``)."""
    out: list[dict[str, str]] = []
    for item in _json_objects(name, raw):
        url, secret, fmt = item.get("url"), item.get("secret"), item.get("format", "json")
        unknown = set(item) - {"name", "url", "secret", "format"}
        if unknown:
            raise _invalid(name, 'endpoints {"name", "url", "secret", "format"?}', str(unknown))
        if not isinstance(url, str) or urlsplit(url).scheme not in {"http", "https"}:
            raise _invalid(name, '"url" an http(s) URL', str(url)[:80])
        if not urlsplit(url).hostname:
            raise _invalid(name, '"url" an http(s) URL', url[:80])
        if not isinstance(secret, str) or len(secret) < 16:
            raise _invalid(name, '"secret" a string of at least 16 characters', "(hidden)")
        if fmt not in {"json", "slack"}:
            raise _invalid(name, '"format" json or slack', str(fmt))
        out.append({"name": str(item["name"]), "url": url, "secret": secret, "format": fmt})
    return out


FREEZE_WINDOWS = _freeze_windows("GITWARD_FREEZE_WINDOWS", env_str("GITWARD_FREEZE_WINDOWS", ""))
ROLLOUT_WEBHOOKS = _webhooks("GITWARD_ROLLOUT_WEBHOOKS", env_str("GITWARD_ROLLOUT_WEBHOOKS", ""))
#: Seconds one webhook delivery may take (connect and answer).
WEBHOOK_TIMEOUT = env_float("GITWARD_WEBHOOK_TIMEOUT", 5.0, minimum=0.1)


def _specs(
    name: str, raw: str, validate: Callable[[object], dict[str, object]]
) -> list[dict[str, object]]:
    """``GITWARD_ROLLOUT_CHECKS`` / ``GITWARD_ROLLOUT_GATES``: a JSON list of specs, each
    checked by ``dashboard.rollouts.conditions`` (docs/rollouts.md#checks-and-gates)."""
    out = []
    for item in _json_objects(name, raw):
        try:
            out.append(validate(item))
        except ValueError as exc:
            raise _invalid(name, "a list of valid specs", str(exc)) from None
    return out


#: Prometheus's base URL for the rollouts' PromQL checks (``/api/v1/query`` is appended).
PROMETHEUS_URL = env_str("GITWARD_PROMETHEUS_URL", "").rstrip("/")
if PROMETHEUS_URL and urlsplit(PROMETHEUS_URL).scheme not in {"http", "https"}:
    raise _invalid("GITWARD_PROMETHEUS_URL", "an http(s) URL", PROMETHEUS_URL[:80])
#: Seconds one Prometheus query may take before the measurement is inconclusive.
PROMETHEUS_TIMEOUT = env_float("GITWARD_PROMETHEUS_TIMEOUT", 5.0, minimum=0.1)
ROLLOUT_CHECKS = _specs(
    "GITWARD_ROLLOUT_CHECKS",
    env_str("GITWARD_ROLLOUT_CHECKS", ""),
    _rollouts.validate_check,
)
ROLLOUT_GATES = _specs(
    "GITWARD_ROLLOUT_GATES", env_str("GITWARD_ROLLOUT_GATES", ""), _rollouts.validate_gate
)

# ---------------------------------------------------------------------------- fault injection
# workers/runtime/failpoints.py reads these at call time (it imports no Django, and a test arms a
# point for one worker); parsing them here makes a typo stop the process at start-up.
FAILPOINTS = env_str("GITWARD_FAILPOINTS", "")
try:
    parse_failpoints(FAILPOINTS)
except ValueError as exc:
    raise ImproperlyConfigured(f"GITWARD_FAILPOINTS: {exc}") from None
FAILPOINTS_ONCE = env_str("GITWARD_FAILPOINTS_ONCE", "")
if FAILPOINTS_ONCE and not Path(FAILPOINTS_ONCE).is_dir():
    raise _invalid("GITWARD_FAILPOINTS_ONCE", "an existing directory", FAILPOINTS_ONCE)

# ---------------------------------------------------------------------------- auth, web
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
# Only the Docker image collects static files; otherwise WhiteNoise serves them from the finders.
STATIC_ROOT = env_str("GITWARD_STATIC_ROOT", "") or None
STATICFILES_DIRS = [BASE_DIR / "dashboard" / "static"]
WHITENOISE_USE_FINDERS = True
SESSION_COOKIE_HTTPONLY = True
# Django's database sessions, loaded with one plain SELECT (dashboard/accounts/session_store.py).
SESSION_ENGINE = "dashboard.accounts.session_store"
#: The user of each request in one plain SELECT (dashboard/accounts/auth_backend.py). ModelBackend
#: stays listed for sessions logged in before, whose stored backend path is Django's.
AUTHENTICATION_BACKENDS = [
    "dashboard.accounts.auth_backend.UserBackend",
    "django.contrib.auth.backends.ModelBackend",
]
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

if PRODUCTION:
    # Behind TLS: cookies never travel in clear, browsers remember to use HTTPS.
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("GITWARD_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("GITWARD_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOG_LEVEL = _choice(
    "GITWARD_LOG_LEVEL",
    env_str("GITWARD_LOG_LEVEL", "INFO").upper(),
    ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
)
# JSON lines for log shippers, or text for people; both carry the running job's context
# (job, trace, repository, lock, token, worker, version) and redact credentials from every
# line (dashboard/observability/logs.py).
LOG_FORMAT = _choice(
    "GITWARD_LOG_FORMAT", env_str("GITWARD_LOG_FORMAT", "text").strip().lower(), ("json", "text")
)
# OpenTelemetry: with an OTLP/HTTP endpoint, every job attempt's spans are exported too
# (dashboard/observability/otlp.py; needs the `otel` extra). The SDK reads these and the other
# standard OTEL_EXPORTER_OTLP_* / OTEL_RESOURCE_ATTRIBUTES variables itself; they are parsed here
# only to decide whether to export and to document them.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "")
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "gitward")
OTEL_EXPORTER_OTLP_TIMEOUT = env_float("OTEL_EXPORTER_OTLP_TIMEOUT", 2.0, minimum=0.1)
OTLP_EXPORT = bool(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and not (
    env_bool("OTEL_SDK_DISABLED", False)
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "dashboard.observability.logs.ContextFilter"}},
    "formatters": {
        "json": {"()": "dashboard.observability.logs.JsonFormatter"},
        "text": {"()": "dashboard.observability.logs.TextFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"rq.worker": {"level": "WARNING"}},
}
