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
#: once per level and raises ``RecursionError`` near 1,000 (caught: the same refusal).
MAX_JSON_DEPTH = 32


class BadInput(ValueError):
    """Input the client must fix; the message says what, for the client's eyes."""


def parse_json(raw: bytes | str) -> Any:
    """``raw`` decoded as JSON, checked: ``BadInput`` when it is not JSON (nor UTF-8; nor
    NaN, Infinity or a float past 1.8e308, which jsonb refuses), nests deeper than
    ``MAX_JSON_DEPTH``, or holds a key or string no column can store
    (``_value_problem``)."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except BadInput:
        raise
    except RecursionError as exc:
        # The decoder recurses once per level: past the interpreter's limit (about 1,000
        # levels) it raises this, cleanly, before any value of it is used.
        raise BadInput(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput("request body is not valid JSON") from exc
    problem = _value_problem(data)
    if problem:
        raise BadInput(problem)
    return data


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON (RFC 8259), and PostgreSQL's jsonb refuses them.
    raise BadInput(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):  # 1e999: as Infinity
        raise BadInput(f"the number {text[:40]} is out of range")
    return number


def _value_problem(data: Any) -> str:
    """What is wrong with a decoded value ("" if nothing): nesting past
    ``MAX_JSON_DEPTH``, or a key or string no column can store — a NUL (PostgreSQL's
    text and jsonb refuse it) or a lone surrogate (``"\\ud800"``: not UTF-8, so no
    driver can encode it). Level by level: a value up to the decoder's own limit is
    walked without recursion, and a wide one without a tuple per item."""
    deeper = f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"
    level, index = [data], 0  # the values at nesting ``index`` (a container there: index + 1)
    while level:
        children: list[Any] = []
        for item in level:
            if isinstance(item, str):
                if "\x00" in item:
                    return "the JSON holds a NUL character (\\u0000)"
                if not item.isascii():
                    try:
                        item.encode("utf-8")
                    except UnicodeEncodeError:
                        return "the JSON holds a lone surrogate (\\ud800-\\udfff): not text"
            elif isinstance(item, list):
                if index >= MAX_JSON_DEPTH:
                    return deeper
                children += item
            elif isinstance(item, dict):
                if index >= MAX_JSON_DEPTH:
                    return deeper
                children += item.keys()
                children += item.values()
        level, index = children, index + 1
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
