"""System checks for rules that relate several settings (docs/configuration.md).

Each variable on its own is parsed at import by ``dashboard/settings.py``. The rules here
span variables, so ``manage.py check`` lists every broken one at once; ``up``, ``worker``
and the other commands run these checks first and refuse to start on an error. Checks
registered with ``deploy=True`` run only under ``check --deploy`` (production advice that
the local ``make run`` defaults knowingly ignore).

Ids: ``gitward.E…`` stop the process, ``gitward.W…`` are printed and let it start.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from workers.git import death_prefix

#: Fewest lock masters for which losing one still leaves a majority.
MIN_TOLERANT_MASTERS = 3


def lock_drift(ttl: float) -> float:
    """The Redlock's clock drift allowance for ``ttl`` (``drift_factor·ttl + 2 ms``)."""
    return float(ttl) * float(settings.LOCK_DRIFT_FACTOR) + 0.002


@register("gitward")
def check_lock_timing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The lease must outlast three node timeouts plus the drift allowance.

    The heartbeat extends every TTL/3 and one extension round may wait a full node
    timeout on a slow master; with a shorter lease a healthy holder's lock expires
    between two heartbeats, and the validity of a fresh lock is spent before it is used.
    """
    ttl = float(settings.LOCK_TTL)
    node_timeout = float(settings.LOCK_NODE_TIMEOUT)
    needed = 3 * node_timeout + lock_drift(ttl)
    if ttl > needed:
        return []
    return [
        Error(
            f"GITWARD_LOCK_TTL={ttl:g} is too short for GITWARD_LOCK_NODE_TIMEOUT="
            f"{node_timeout:g}: the lease must be longer than 3 node timeouts plus the "
            f"clock drift allowance ({needed:.3f} s)",
            hint="raise GITWARD_LOCK_TTL or lower GITWARD_LOCK_NODE_TIMEOUT",
            id="gitward.E001",
        )
    ]


@register("gitward")
def check_production(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Production never runs with debug pages or armed fault injection."""
    if not settings.PRODUCTION:
        return []
    errors: list[CheckMessage] = []
    if settings.DEBUG:
        errors.append(
            Error(
                "GITWARD_PRODUCTION and GITWARD_DEBUG are both on: debug pages show "
                "settings and tracebacks to anyone",
                hint="unset GITWARD_DEBUG",
                id="gitward.E002",
            )
        )
    if settings.FAILPOINTS:
        errors.append(
            Error(
                "GITWARD_FAILPOINTS is set with GITWARD_PRODUCTION: workers would kill, "
                "stop or fail themselves at the named points",
                hint="unset GITWARD_FAILPOINTS (it is for the fault tests)",
                id="gitward.E003",
            )
        )
    return errors


@register("gitward")
def check_timeouts(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """git's own deadline must come before RQ's, so a hung fetch ends with a clear error."""
    if float(settings.GIT_TIMEOUT) < float(settings.JOB_TIMEOUT):
        return []
    return [
        Warning(
            f"GITWARD_GIT_TIMEOUT={settings.GIT_TIMEOUT:g} is not below GITWARD_JOB_TIMEOUT="
            f"{settings.JOB_TIMEOUT}: RQ kills a hung git job before git's timeout reports it",
            hint="keep GITWARD_GIT_TIMEOUT below GITWARD_JOB_TIMEOUT",
            id="gitward.W001",
        )
    ]


@register("gitward")
def check_death_signal(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Without ``setpriv`` a git process outlives a work horse killed by SIGKILL."""
    if death_prefix():
        return []
    return [
        Warning(
            "setpriv (util-linux) is not on PATH: git runs without --pdeathsig, so a git "
            "process whose work horse is killed keeps running until it finishes by itself",
            hint="install util-linux",
            id="gitward.W002",
        )
    ]


@register("gitward", deploy=True)
def check_redis_layout(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Production advice on the Redis nodes: enough masters, a queue server of its own."""
    warnings: list[CheckMessage] = []
    urls = list(settings.REDIS_URLS)
    masters = len(urls) or int(settings.EMBEDDED_REDIS_NODES)
    if masters < MIN_TOLERANT_MASTERS:
        warnings.append(
            Warning(
                f"{masters} lock master(s): losing one stops every lock",
                hint="list 3 (or 5) independent masters in REDIS_URLS",
                id="gitward.W003",
            )
        )
    if urls and settings.REDIS_URL in urls:
        warnings.append(
            Warning(
                "REDIS_URL (queues, channel layer, rate limits) is one of the lock masters "
                "in REDIS_URLS: losing that node stops enqueueing and live updates",
                hint="set REDIS_URL to a separate, highly available Redis",
                id="gitward.W004",
            )
        )
    return warnings


@register("gitward")
def check_otlp(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """An OTLP endpoint without the SDK installed: spans would silently not be exported."""
    if settings.OTLP_EXPORT and not _installed("opentelemetry.exporter.otlp.proto.http"):
        return [
            Warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not "
                "installed: job spans are not exported",
                hint="pip install 'gitward[otel]'",
                id="gitward.W005",
            )
        ]
    return []


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
