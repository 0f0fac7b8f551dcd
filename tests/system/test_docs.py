"""docs/configuration.md documents every setting; the README shows the two commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def settings_variables() -> set[str]:
    source = (ROOT / "dashboard" / "settings.py").read_text()
    return set(re.findall(r'env_(?:str|int|float|bool|list|mapping)\(\s*"([A-Z_]+)"', source))


def test_every_environment_variable_is_in_the_configuration_table() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", page, flags=re.M))
    found = settings_variables()
    assert len(found) > 20  # the scan itself works
    assert found - documented == set(), "undocumented settings"
    assert documented - found == set(), "documented settings that do not exist"


def test_the_readme_shows_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme


def test_ci_runs_the_readme_test_command_on_both_databases() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "postgres://" in ci
