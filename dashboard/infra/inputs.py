"""What every adapter checks in untrusted input before it reaches the database or a
parser that may fail in a way of its own (docs/api.md#limits): JSON bodies and frames
bounded in depth and free of NUL characters, database ids inside the 64-bit signed
range, and the ``id`` path converter that keeps larger numbers from matching a route.

A request that breaks one of these is the client's mistake: the adapters answer 400
(JSON ``{"error": ...}`` under ``/api/``, a form error or a short page elsewhere; a
websocket closes with 1003), never a 500 with a logged traceback.
"""

from __future__ import annotations

import json
from typing import Any

#: The largest id a ``BigAutoField`` (or any 64-bit signed integer column) holds, on
#: PostgreSQL and SQLite alike; a larger one overflows the driver (SQLite:
#: ``OverflowError``) or the column (PostgreSQL: ``NumericValueOutOfRange``).
DB_INT_MAX = 2**63 - 1

#: Nesting allowed in a JSON body or websocket frame. No request of ours nests deeper
#: than 4 (``POST /api/rollouts``: body → config → a value); Python's decoder recurses
#: once per level and raises ``RecursionError`` near 1,000.
MAX_JSON_DEPTH = 32


class BadInput(ValueError):
    """Input the client must fix; the message says what, for the client's eyes."""


def parse_json(raw: bytes | str) -> Any:
    """``raw`` decoded as JSON, checked: ``BadInput`` when it is not JSON (nor UTF-8),
    nests deeper than ``MAX_JSON_DEPTH``, or holds a key or string no column can store
    (``_string_problem``)."""
    if _depth_past_limit(raw):
        raise BadInput(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except BadInput:
        raise
    except RecursionError as exc:  # unreachable after the depth scan; kept as a guard
        raise BadInput(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput("request body is not valid JSON") from exc
    problem = _string_problem(data)
    if problem:
        raise BadInput(f"the JSON holds {problem}")
    return data


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON (RFC 8259), and PostgreSQL's jsonb refuses them.
    raise BadInput(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):  # 1e999: as Infinity
        raise BadInput(f"the number {text[:40]} is out of range")
    return number


def _depth_past_limit(raw: bytes | str) -> bool:
    """Whether brackets outside strings nest past ``MAX_JSON_DEPTH``: one pass over the
    text, before the decoder recurses. (A malformed text may be counted wrong; the
    decoder refuses it anyway.)"""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False  # the common case: no scan at all
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _string_problem(data: Any) -> str:
    """What no column can store in a key or string of ``data`` ("" if nothing): a NUL
    (PostgreSQL's text and jsonb refuse it) or a lone surrogate (``"\\ud800"``: not
    UTF-8, so no driver can encode it). Iterative: no recursion needed."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a NUL character (\\u0000)"
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return "a lone surrogate (\\ud800-\\udfff), which is not text"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return ""


def is_db_id(value: Any) -> bool:
    """A JSON value usable as a row id: an int (not a bool) in 1 … ``DB_INT_MAX``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= DB_INT_MAX


def has_nul(text: str) -> bool:
    return "\x00" in text


class IdConverter:
    """The ``<id:name>`` path converter: Django's ``int`` bounded to ``DB_INT_MAX``. A
    larger number matches no route (a 404), instead of reaching the database as an id
    it cannot hold. Registered once, in ``dashboard.apps``."""

    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > DB_INT_MAX:
            raise ValueError("past the 64-bit id range")  # Django: no match
        return number

    def to_url(self, value: int) -> str:
        return str(value)
