"""``manage.py analytics``: the planted patterns as text and JSON, and one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from dashboard.analytics.reports import parse_params, report
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_analysis_as_json_and_text(tmp_path: Path, capsys) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    last_day = max(c.committed_at[:10] for c in git_log(origin))
    call_command("analytics", "coupling", str(repo.pk), "--json")
    body = json.loads(capsys.readouterr().out)
    want = report("coupling", repo, parse_params({}))
    assert body["files"] == want["files"] and body["directories"] == want["directories"]
    call_command("analytics", "coupling", str(origin.path))  # by URL, as text
    out = capsys.readouterr().out
    assert "core/a.py ~ core/b.py  80" in out
    call_command(
        "analytics", "ownership", str(repo.pk), "--until", last_day, "--inactive-days", "90"
    )
    out = capsys.readouterr().out
    assert "Cy <cy@example.com>" in out and "legacy/old.py, legacy/util.py" in out
    assert "handbook   10    ada@example.com  0.9" in out
    call_command("analytics", "age", str(repo.pk), "--until", last_day, "--json")
    ages = {
        r["directory"]: r["age_months"] for r in json.loads(capsys.readouterr().out)["directories"]
    }
    assert ages["legacy"] == 7
    call_command("analytics", "hotspots", str(repo.pk), "--last", "30", "--until", last_day)
    out = capsys.readouterr().out
    assert "handbook/guide.md" in out and "core/a.py" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hotspots", "424242"], "no repository '424242'"),
        (["hotspots", "1", "--since", "2024-13-01"], "since must be an ISO date"),
        (["coupling", "1", "--min-coupling", "200"], "min_coupling must be between 0 and 100"),
        (["age", "1", "--depth", "x"], "depth must be an integer"),
    ],
)
def test_refusals_are_one_line(args: list[str], message: str) -> None:
    from dashboard.models import Repository

    Repository.objects.create(pk=1, url="https://example.com/x.git", status="ready")
    with pytest.raises(CommandError, match=message):
        call_command("analytics", *args)


def test_an_unknown_analysis_exits_non_zero_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "analytics", "churn", "1"],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "invalid choice: 'churn'" in done.stderr and "Traceback" not in done.stderr


def test_authors_and_a_files_history(tmp_path: Path, capsys) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    call_command("analytics", "authors", str(repo.pk))
    out = capsys.readouterr().out
    assert "cy@example.com" in out and "bob@example.com" in out
    call_command("analytics", "authors", str(repo.pk), "--author", "bob@example.com")
    out = capsys.readouterr().out
    assert out.splitlines()[2].startswith("Bob <bob@example.com>: 3 commits")
    call_command("analytics", "files", str(repo.pk), "--path", "core/a.py")
    out = capsys.readouterr().out
    assert "core/a.py: 11 revisions" in out and "core/b.py  80" in out
    with pytest.raises(CommandError, match="path is required"):
        call_command("analytics", "files", str(repo.pk))
    with pytest.raises(CommandError, match=r"no commit by nobody@example\.com"):
        call_command("analytics", "authors", str(repo.pk), "--author", "nobody@example.com")


def test_csv_of_one_table(tmp_path: Path, capsys) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    call_command("analytics", "coupling", str(repo.pk), "--csv", "files")
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "entity,coupled,degree,average_revs,shared_revs,revs,coupled_revs",
        "core/a.py,core/b.py,80,10,8,10,10",
    ]
    with pytest.raises(CommandError, match="--csv must be one of files, directories"):
        call_command("analytics", "age", str(repo.pk), "--csv", "pairs")


def test_each_lens_from_the_command_line_equals_git(tmp_path: Path, capsys) -> None:
    from tests.support.analytics_history import (
        LENS_CASES,
        build_lenses,
        lens_totals,
        queue_state,
    )

    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    before = queue_state()
    for case in LENS_CASES:
        want = lens_totals(origin, case)
        options = [f"--exclude={lens}" for lens in case]  # repeated, one lens each
        call_command("analytics", "hotspots", str(repo.pk), "--limit", "1000", *options, "--json")
        body = json.loads(capsys.readouterr().out)
        assert {r["path"]: (r["revs"], r["churn"]) for r in body["files"]} == want.files, case
        call_command("analytics", "authors", str(repo.pk), "--exclude", ",".join(case), "--json")
        people = json.loads(capsys.readouterr().out)["authors"]
        got = {r["author"]: (r["commits"], r["insertions"], r["deletions"]) for r in people}
        assert got == want.people, case
    call_command("analytics", "hotspots", str(repo.pk), "--exclude", "lock,bots")
    out = capsys.readouterr().out
    assert "leaving out: lock, bots (rules lenses-1; attributes: not read)" in out
    tables = out.split("\nfiles:\n", 1)[1]  # the reproduce line names the lock files
    assert "package-lock.json" not in tables and "src/version.txt" not in tables
    assert "src/app.js" in tables
    assert queue_state() == before
    with pytest.raises(CommandError, match=r"^exclude: unknown lens 'nope' \(one of generated"):
        call_command("analytics", "hotspots", str(repo.pk), "--exclude", "nope")
