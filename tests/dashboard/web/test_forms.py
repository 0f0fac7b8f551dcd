"""dashboard.web.forms: bad input is a field error naming what is wrong (the domain's own
words), never an exception; good input is cleaned into what the domain takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.web.forms import RolloutActionForm, StartRolloutForm, SubmitRepositoryForm

pytestmark = pytest.mark.django_db


def errors(form: object) -> dict[str, list[str]]:
    assert not form.is_valid()  # type: ignore[attr-defined]
    return dict(form.errors)  # type: ignore[attr-defined]


def test_a_local_repository_and_a_branch_are_cleaned(tmp_path: Path) -> None:
    form = SubmitRepositoryForm({"url": f"  {tmp_path}  ", "branch": "refs/heads/dev"})
    assert form.is_valid(), form.errors
    assert form.cleaned_data == {"url": str(tmp_path), "branch": "dev"}
    assert SubmitRepositoryForm({"url": str(tmp_path)}).is_valid()  # branch optional


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"url": ""}, "url", "required"),
        ({"url": "ftp://example.com/x.git"}, "url", "ftp"),
        ({"url": "/etc"}, "url", "not under an allowed repository root"),
        ({"url": "x" * 2049}, "url", "at most 2048"),
        ({"url": "{tmp}", "branch": "--output=/tmp/pwn"}, "branch", "must not start with '-'"),
        ({"url": "{tmp}", "branch": "a..b"}, "branch", ".."),
        ({"url": "{tmp}", "branch": "a b"}, "branch", "whitespace"),
    ],
)
def test_bad_submissions_are_field_errors(
    tmp_path: Path, data: dict[str, str], field: str, words: str
) -> None:
    data = {k: v.replace("{tmp}", str(tmp_path)) for k, v in data.items()}
    got = errors(SubmitRepositoryForm(data))
    assert list(got) == [field]
    assert words in " ".join(got[field]), got


def test_a_rollout_form_is_cleaned_into_config_and_steps() -> None:
    form = StartRolloutForm(
        {
            "queue": " analysis ",
            "detect_renames": "on",
            "exclude_paths": "vendor/**, *.min.js\n\n",
            "steps": "10%, 50\n100",
        }
    )
    assert form.is_valid(), form.errors
    data = form.cleaned_data
    assert data["queue"] == "analysis"
    assert data["steps"] == [10, 50, 100]
    assert data["config"] == {
        "detect_renames": True,
        "ignore_whitespace": False,
        "exclude_paths": ["vendor/**", "*.min.js"],
    }


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"queue": "no spaces please"}, "queue", "invalid queue name"),
        ({"steps": "ten"}, "steps", "whole percentages"),
        ({"steps": "50,10"}, "steps", "must increase"),
        ({"steps": "0,150"}, "steps", "1..100"),
        ({"steps": ""}, "steps", "required"),
        ({"exclude_paths": "/abs/path"}, "exclude_paths", "exclude_paths"),
        ({"exclude_paths": "\n".join(f"p{i}" for i in range(101))}, "exclude_paths", "at most 100"),
    ],
)
def test_bad_rollouts_are_field_errors(data: dict[str, str], field: str, words: str) -> None:
    got = errors(StartRolloutForm({"queue": "analysis", "steps": "10,50,100", **data}))
    assert list(got) == [field]
    assert words in " ".join(got[field]), got


@pytest.mark.parametrize(
    ("data", "field"),
    [({"percent": "0"}, "percent"), ({"percent": "101"}, "percent"), ({"percent": "x"}, "percent")],
)
def test_a_ramp_percentage_is_1_to_100(data: dict[str, str], field: str) -> None:
    assert list(errors(RolloutActionForm(data))) == [field]
    ok = RolloutActionForm({"percent": "25", "reason": "canary looks fine"})
    assert ok.is_valid() and ok.cleaned_data["percent"] == 25
