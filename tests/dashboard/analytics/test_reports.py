"""dashboard.analytics.reports: parameters from a query or a command's options, each
refusal naming the parameter, and the report's envelope (the tables themselves are
checked against git in the other modules' tests and through the API and CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.analytics.coupling import Thresholds
from dashboard.analytics.reports import (
    KINDS,
    BadParameter,
    NotFound,
    Params,
    parse_params,
    report,
)
from dashboard.analytics.window import parse_window
from dashboard.models import Repository
from dashboard.repositories.lifecycle import current_fingerprint
from tests.support.analytics_history import analysed, build, git_log


def test_defaults_and_values() -> None:
    assert parse_params({}) == Params()
    assert parse_params({"since": "", "depth": "", "limit": None}) == Params()
    got = parse_params(
        {"since": "2024-01-01", "until": "2024-01-31", "depth": "2", "limit": "7",
         "min_revs": "1", "min_shared_revs": "2", "min_coupling": "0",
         "max_changeset_size": "9", "inactive_days": "30", "path": " src/a.py "}
    )  # fmt: skip
    assert got == Params(
        window=parse_window("2024-01-01", "2024-01-31"),
        depth=2,
        limit=7,
        inactive_days=30,
        thresholds=Thresholds(1, 2, 0, 9),
        path="src/a.py",
    )
    assert got.as_dict()["since"] == "2024-01-01" and got.as_dict()["max_changeset_size"] == 9


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"last": "14"}, "last must be one of"),
        ({"depth": "7"}, "depth must be between 1 and 6"),
        ({"limit": "0"}, "limit must be between 1 and 1000"),
        ({"min_revs": "1.5"}, "min_revs must be an integer"),
        ({"path": "a\x00b"}, "path must be a repository path"),
    ],
)
def test_refusals_name_the_parameter(values: dict, message: str) -> None:
    with pytest.raises(BadParameter, match=message):
        parse_params(values)


@pytest.mark.django_db(transaction=True)
def test_the_envelope_of_every_report(tmp_path: Path) -> None:
    repo = analysed(build(tmp_path / "origin"))
    params = parse_params({"since": "2024-01-01", "until": "2024-12-31"})
    for kind in KINDS:
        if kind == "files":  # a file's history needs its path
            params = parse_params(
                {"since": "2024-01-01", "until": "2024-12-31", "path": "core/a.py"}
            )
        body = report(kind, repo, params)
        assert body["analysis"] == kind and body["repository"] == repo.pk
        assert body["window"] == {"since": "2024-01-01", "until": "2024-12-31"}
        assert body["reproduce"] == (
            "git log --no-merges --no-renames --numstat "
            "--since=2024-01-01T00:00:00Z --until=2024-12-31T23:59:59Z"
        )
        assert body["fingerprint"] == current_fingerprint()
    assert set(report("coupling", repo, parse_params({"path": "core/a.py"}))) >= {"path", "coupled"}
    with pytest.raises(BadParameter, match="path is required"):
        report("files", repo, Params())
    with pytest.raises(NotFound, match=r"no commit changed x\.py in this window"):
        report("files", repo, parse_params({"path": "x.py"}))
    with pytest.raises(NotFound, match=r"no commit by x@y\.z in this window"):
        report("authors", repo, parse_params({"author": "x@y.z"}))
    with pytest.raises(BadParameter, match="unknown analysis 'churn'"):
        report("churn", Repository(pk=1, url="x"), Params())


@pytest.mark.django_db(transaction=True)
def test_the_provenance_names_the_analyzer_the_head_and_a_command_that_reproduces_the_rows(
    tmp_path: Path,
) -> None:
    import shlex
    import subprocess

    from workers import analysis

    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    repo.refresh_from_db()
    window = {"since": "2024-01-01", "until": "2024-12-31"}
    prov = report("hotspots", repo, parse_params(window))["provenance"]
    assert prov["head"] == repo.head == origin.head()
    assert prov["fingerprint"] == current_fingerprint()
    assert prov["config"] == analysis.DEFAULT.to_dict()
    version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout
    assert prov["git_version"] == version.strip().removeprefix("git version ")
    argv = shlex.split(prov["command"])
    assert argv[-1] == repo.head and "--since=2024-01-01T00:00:00Z" in argv
    # the command, run in a clone, prints exactly the commits the report counted
    out = origin.git(*argv[1:], "--format=@%H").splitlines()
    printed = [line[1:] for line in out if line.startswith("@")]
    assert printed and set(printed) == {
        c.sha
        for c in git_log(origin, "--since=2024-01-01T00:00:00Z", "--until=2024-12-31T23:59:59Z")
    }
