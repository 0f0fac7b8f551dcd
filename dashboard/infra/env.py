"""Typed environment helpers that fail loudly (ImproperlyConfigured) on bad values."""

from __future__ import annotations

import json
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


def env_mapping(name: str) -> dict[str, str]:
    """A JSON object of non-empty strings (``{"a": "b"}``), or ``@PATH`` of a file holding
    one; unset or empty: ``{}``."""
    DOCUMENTED[name] = ""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    if raw.startswith("@"):
        try:
            with open(raw[1:], encoding="utf-8") as fh:
                raw = fh.read()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}: cannot read {raw[1:]!r}: {exc}") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str)
        and isinstance(v, str)
        and k.strip()
        and v.strip()
        and "\x00" not in k + v
        for k, v in data.items()
    ):
        raise ImproperlyConfigured(f"{name} must map non-empty strings to non-empty strings")
    return data
