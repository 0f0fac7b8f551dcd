"""dashboard.infra.env: typed environment readers (the settings built on them, and the README
listing every variable, are covered in tests/dashboard/test_settings.py and
tests/system/test_docs.py)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard.infra.env import (
    DOCUMENTED,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_mapping,
    env_str,
)

V = "GITWARD_TEST_ENV_VALUE"


def test_defaults_apply_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(V, raising=False)
    assert env_int(V, 3) == 3 and env_float(V, 1.5) == 1.5 and env_bool(V, True) is True
    assert env_str(V, "d") == "d" and env_list(V, "a, b,,") == ["a", "b"]
    monkeypatch.setenv(V, "")
    assert env_int(V, 3) == 3 and env_float(V, 1.5) == 1.5 and env_bool(V, False) is False
    assert env_list(V, "x") == []  # set but empty: an empty list, not the default
    assert DOCUMENTED[V] == "x"  # the last reader's default is what the README lists


def test_values_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(V, "42")
    assert env_int(V, 0, minimum=42, maximum=42) == 42
    assert env_float(V, 0.0) == 42.0
    for raw, want in [("1", True), ("YES", True), (" on ", True), ("off", False), ("0", False)]:
        monkeypatch.setenv(V, raw)
        assert env_bool(V, not want) is want
    monkeypatch.setenv(V, " a ,b ")
    assert env_list(V) == ["a", "b"] and env_str(V, "") == " a ,b "


@pytest.mark.parametrize(
    ("reader", "raw", "message"),
    [
        (lambda: env_int(V, 0), "4.5", "must be an integer, got '4.5'"),
        (lambda: env_int(V, 0, minimum=5), "4", "must be >= 5, got 4"),
        (lambda: env_int(V, 0, maximum=3), "4", "must be <= 3, got 4"),
        (lambda: env_float(V, 0.0), "abc", "must be a number"),
        (lambda: env_float(V, 0.0), "nan", "must be a finite number"),
        (lambda: env_float(V, 0.0), "inf", "must be a finite number"),
        (lambda: env_float(V, 0.0, minimum=0.0), "-1", "must be >= 0.0"),
        (lambda: env_bool(V, False), "maybe", "must be a boolean"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
    reader,
    raw: str,
    message: str,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv(V, raw)
    with pytest.raises(ImproperlyConfigured) as info:
        reader()
    assert str(info.value).startswith(V) and message in str(info.value)


def test_a_mapping_from_json_or_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(V, raising=False)
    assert env_mapping(V) == {}
    monkeypatch.setenv(V, '{"old@x": "new@x"}')
    assert env_mapping(V) == {"old@x": "new@x"}
    target = tmp_path / "identities.json"
    target.write_text('{"a@x": "b@x", "c@x": "b@x"}')
    monkeypatch.setenv(V, f"@{target}")
    assert env_mapping(V) == {"a@x": "b@x", "c@x": "b@x"}
    for raw, message in [
        ("[1]", "must map non-empty strings"),
        ('{"a": 1}', "must map non-empty strings"),
        ('{"a": ""}', "must map non-empty strings"),
        ("{nope", "must be a JSON object"),
        (f"@{tmp_path / 'missing.json'}", "cannot read"),
    ]:
        monkeypatch.setenv(V, raw)
        with pytest.raises(ImproperlyConfigured, match=f"{V}.*{message}"):
            env_mapping(V)
