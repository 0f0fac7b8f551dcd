"""Typed environment helpers that fail loudly (ImproperlyConfigured) on bad values."""

from __future__ import annotations

import math
import os

from django.core.exceptions import ImproperlyConfigured

#: Every variable read through these helpers, for the README completeness test.
DOCUMENTED: dict[str, str] = {}


def env_str(name: str, default: str) -> str:
    DOCUMENTED[name] = default
    return os.environ.get(name, default)


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    DOCUMENTED[name] = str(default)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be <= {maximum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    DOCUMENTED[name] = str(default)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc
    if not math.isfinite(value):  # float() accepts "nan" and "inf"; no setting means them
        raise ImproperlyConfigured(f"{name} must be a finite number, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_bool(name: str, default: bool) -> bool:
    DOCUMENTED[name] = "true" if default else "false"
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_list(name: str, default: str = "") -> list[str]:
    DOCUMENTED[name] = default
    raw = os.environ.get(name, default)
    return [item.strip() for item in raw.split(",") if item.strip()]
