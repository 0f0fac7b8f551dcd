"""dashboard.web.humanize: one rule for a count and its noun, on pages and in the CLI."""

from __future__ import annotations

import pytest

from dashboard.web.humanize import count


@pytest.mark.parametrize(
    ("value", "noun", "text"),
    [
        (1, "run", "1 run"),
        (0, "run", "0 runs"),
        (2, "run", "2 runs"),
        (1, "repository,repositories", "1 repository"),
        (1204, "repository,repositories", "1,204 repositories"),
        (1.0, "commit", "1 commit"),
        (2.5, "job", "2.5 jobs"),
        ("3", "version", "3 versions"),
        (None, "run", "0 runs"),  # a missing count is 0, never an error
        ("n/a", "line added,lines added", "0 lines added"),
    ],
)
def test_a_count_takes_the_right_form_of_its_noun(value: object, noun: str, text: str) -> None:
    assert count(value, noun) == text
