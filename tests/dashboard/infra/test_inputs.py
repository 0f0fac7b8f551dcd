"""dashboard.infra.inputs: the JSON every adapter takes is bounded in depth and holds only
what a column can store; ids fit 64 bits; the ``id`` converter refuses a larger one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dashboard.infra.inputs import (
    DB_INT_MAX,
    MAX_JSON_DEPTH,
    BadInput,
    IdConverter,
    is_db_id,
    parse_json,
)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_as_deep_as_the_limit_is_read_and_one_level_more_refused() -> None:
    assert parse_json(nested(MAX_JSON_DEPTH)) == json.loads(nested(MAX_JSON_DEPTH))
    with pytest.raises(BadInput, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        parse_json(nested(MAX_JSON_DEPTH + 1))


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_json_deeper_than_the_decoder_can_recurse_is_refused_not_raised(depth: int) -> None:
    with pytest.raises(RecursionError):
        json.loads(nested(depth))  # what the adapters met before
    with pytest.raises(BadInput, match="deeper than"):
        parse_json(nested(depth).encode())


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 500 + "{" * 500, "b": ['\\"[[['], "c": "\\\\"})
    assert parse_json(text)["a"].startswith("[[[")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"a": "x\\u0000"}', "NUL"),
        ('{"a\\u0000": 1}', "NUL"),
        ('[[["\\u0000"]]]', "NUL"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"a": "\\udfff x"}', "lone surrogate"),
        ("NaN", "NaN is not a JSON number"),
        ('{"a": -Infinity}', "-Infinity is not a JSON number"),
        ('{"a": 1e999}', "out of range"),
        ("{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_what_no_column_can_store_or_no_decoder_reads_is_refused(
    raw: str | bytes, why: str
) -> None:
    with pytest.raises(BadInput, match=why):
        parse_json(raw)


def test_a_surrogate_pair_is_text_and_kept() -> None:
    assert parse_json('"\\ud83d\\ude00"') == "\U0001f600"


#: Text a column can store: no NUL, no lone surrogate.
STORABLE = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
        | STORABLE,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STORABLE, inner, max_size=4),
        max_leaves=20,
    )
)  # fmt: skip
def test_any_storable_json_within_the_depth_round_trips(value: Any) -> None:
    assume(depth(value) <= MAX_JSON_DEPTH)
    assert parse_json(json.dumps(value)) == value


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (1, True),
        (DB_INT_MAX, True),
        (DB_INT_MAX + 1, False),
        (10**20, False),
        (0, False),
        (-1, False),
        (True, False),
        (1.0, False),
        ("1", False),
    ],
)
def test_a_db_id_is_an_int_in_the_64_bit_range(value: object, ok: bool) -> None:
    assert is_db_id(value) is ok


def test_the_id_converter_refuses_a_number_past_64_bits() -> None:
    conv = IdConverter()
    assert conv.to_python(str(DB_INT_MAX)) == DB_INT_MAX
    assert conv.to_url(7) == "7"
    with pytest.raises(ValueError):
        conv.to_python(str(DB_INT_MAX + 1))
