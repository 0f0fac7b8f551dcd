"""Counts with their nouns, one rule for every message: ``1 run``, ``2 runs``,
``1 repository``, ``1,204 repositories``. Used by the templates (``|count``) and the CLI
(``manage.py dlq``, ``submit``, ``up``, ``worker``), so the page and the terminal agree."""

from __future__ import annotations

from typing import Any


def count(value: Any, noun: str) -> str:
    """``value`` with ``noun`` singular or plural: ``noun`` is ``singular,plural`` or a
    singular that takes an ``s``. Thousands are separated; a non-number counts as 0."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = 0.0
    singular, _, plural = noun.partition(",")
    number = f"{int(x):,}" if x == int(x) else f"{x:,.1f}"
    return f"{number} {singular if x == 1 else (plural or singular + 's')}"
