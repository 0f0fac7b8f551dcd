"""The condition language of checks and the validation of check and gate specs
(docs/rollouts.md#checks-and-gates): parsed, never evaluated as Python."""

from __future__ import annotations

import pytest

from dashboard.rollouts.conditions import evaluate, parse_condition, validate_check, validate_gate


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("result < 0.05", 0.01, True),
        ("result < 0.05", 0.05, False),
        ("result <= 0.05", 0.05, True),
        ("0.05 > result", 0.01, True),  # result on the right: mirrored
        ("result >= 1 and result <= 3", 2, True),
        ("result >= 1 and result <= 3", 4, False),
        ("result < 1 or result > 9", 10, True),
        ("result < 1 or result > 9", 5, False),
        ("result == 0", 0.0, True),
        ("result != 0", 0.0, False),
        ("result > -1e-3", 0, True),
        ("result < 1 or result > 5 and result < 7", 6, True),  # and binds tighter
    ],
)
def test_conditions_compare_result_with_numbers(text: str, value: float, expected: bool) -> None:
    assert evaluate(text, value) is expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "result < len([])",
        "result < x",
        "result",
        "result < 1 xor result > 2",
        "",
        "result < inf",
        "result < 1e999",
    ],
)
def test_anything_else_is_refused_never_run(text: str) -> None:
    with pytest.raises(ValueError):
        parse_condition(text)


def test_a_check_gets_its_defaults_and_needs_a_condition() -> None:
    check = validate_check({"name": "errors", "query": "sum(x)", "failure": "result > 0.1"})
    assert check == {
        "name": "errors", "query": "sum(x)", "success": None, "failure": "result > 0.1",
        "failure_limit": 0, "dry_run": False, "interval": 30.0,
    }  # fmt: skip
    for bad, why in [
        ({"name": "e", "query": "x"}, 'give a "success" or a "failure"'),
        ({"name": "e", "query": "", "success": "result < 1"}, '"query" must be'),
        ({"name": "e", "query": "x", "success": "result < 1", "failure_limit": -1}, "limit"),
        ({"name": "e", "query": "x", "success": "result < 1", "dry_run": "yes"}, "dry_run"),
        ({"name": "e", "query": "x", "success": "result < 1", "every": 3}, "unknown field"),
        ({"name": "", "query": "x", "success": "result < 1"}, '"name"'),
    ]:
        with pytest.raises(ValueError, match=why):
            validate_check(bad)


def test_a_gate_needs_an_http_url_and_a_secret() -> None:
    gate = validate_gate(
        {"name": "confirm-promotion", "url": "https://gate.example/x", "secret": "s" * 16}
    )
    assert (gate["when"], gate["on_refusal"], gate["interval"]) == ("promotion", "hold", 30.0)
    for bad, why in [
        ({"url": "ftp://gate.example/x", "secret": "s" * 16}, '"url"'),
        ({"url": "https://gate.example/x", "secret": "short"}, '"secret"'),
        ({"url": "https://gate.example/x", "secret": "s" * 16, "when": "never"}, '"when"'),
        ({"url": "https://gate.example/x", "secret": "s" * 16, "on_refusal": "x"}, "on_refusal"),
    ]:
        with pytest.raises(ValueError, match=why):
            validate_gate({"name": "g", **bad})
