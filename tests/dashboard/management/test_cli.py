"""The management commands: submit, results, api_token — exit codes and one-line errors."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from dashboard.models import AnalyzerVersion, ApiToken, Repository
from dashboard.versions.state_machine import ensure_baseline, register_version
from dashboard.web.humanize import count
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)


def test_submit_then_results(git_repo: GitRepo, capsys) -> None:
    call_command("submit", str(git_repo.path), "--json")
    state = json.loads(capsys.readouterr().out)
    assert state["status"] == "queued"
    run_workers()
    call_command("results", str(state["id"]))
    out = capsys.readouterr().out
    assert "ready" in out and "commits 3/3" in out and "Ada Lovelace (3)" in out
    call_command("results", str(git_repo.path), "--json")
    body = json.loads(capsys.readouterr().out)
    assert body["summary"]["totals"]["commits"] == 3
    assert body["commits_analyzed"] == 3


def test_submit_wait_returns_when_the_analysis_finished(git_repo: GitRepo, capsys) -> None:
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            call_command("submit", str(git_repo.path), "--wait", "--timeout", "60", "--json")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    t = threading.Thread(target=submit)
    t.start()
    deadline = time.monotonic() + 30
    while not Repository.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    while t.is_alive() and time.monotonic() < deadline:
        run_workers()
        time.sleep(0.1)
    t.join(30)
    assert not errors
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1])["status"] == "ready"


def test_submit_wait_times_out_with_exit_code_3(git_repo: GitRepo) -> None:
    with pytest.raises(CommandError) as info:
        call_command("submit", str(git_repo.path), "--wait", "--timeout", "0.3")
    assert info.value.returncode == 3
    assert "timed out" in str(info.value)


def test_submit_wait_on_a_failing_repository_exits_2(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    call_command("submit", str(tmp_path / "empty"))
    run_workers()
    with pytest.raises(CommandError) as info:
        call_command("submit", str(tmp_path / "empty"), "--wait", "--timeout", "0.5")
    # Resubmission re-queues the failed repository: it is not re-synced without a worker.
    assert info.value.returncode in {2, 3}


@pytest.mark.parametrize(
    "url", ["ftp://x/y", "-oProxyCommand=evil", "ext::sh -c touch% /tmp/pwn", "/etc"]
)
def test_submit_refuses_bad_urls_in_one_line(url: str) -> None:
    with pytest.raises(CommandError) as info:
        call_command("submit", "--", url)  # "--": argparse would eat an option-looking URL
    message = str(info.value)
    assert message.startswith("invalid repository: ") and "\n" not in message
    assert Repository.objects.count() == 0


def test_results_for_an_unknown_repository(capsys) -> None:
    with pytest.raises(CommandError, match="no repository '77'"):
        call_command("results", "77")


def test_api_token_prints_a_working_token(client, capsys) -> None:
    User.objects.create_user("dave")
    call_command("api_token", "dave")
    raw = capsys.readouterr().out.strip()
    assert raw.startswith("gw_") and ApiToken.objects.get().digest == ApiToken.hash(raw)
    assert raw not in ApiToken.objects.values_list("digest", flat=True)
    res = client.get("/api/repos/1", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert res.status_code == 404 and res.json() == {"error": "repository not found"}
    with pytest.raises(CommandError, match="no user"):
        call_command("api_token", "nobody")


@pytest.mark.parametrize(
    ("n", "noun", "text"),
    [
        (0, "run", "0 runs"),
        (1, "run", "1 run"),
        (2, "run", "2 runs"),
        (1, "repository,repositories", "1 repository"),
        (1204, "repository,repositories", "1,204 repositories"),
        (1.5, "worker", "1.5 workers"),
        (None, "commit", "0 commits"),
    ],
)
def test_counts_take_the_right_noun_in_every_cli_message(n, noun, text) -> None:
    assert count(n, noun) == text


def test_submit_names_one_commit_in_the_singular(tmp_path, capsys) -> None:
    one = GitRepo.create(tmp_path / "one")
    one.commit("only", {"a.txt": "a\n"})
    call_command("submit", str(one.path))
    out = capsys.readouterr().out
    assert out.startswith("submitted repository") and "0/0 commits" in out
    run_workers()
    call_command("submit", str(one.path))
    again = capsys.readouterr().out
    assert again.startswith("already known:") and again.rstrip().endswith("1/1 commit"), again


def test_results_never_print_terminal_control_from_repository_data(
    git_repo: GitRepo, capsys
) -> None:
    """An author name and a path holding ESC sequences (a window retitle, a screen clear,
    8-bit CSI, a bidi override) are printed escaped by ``results`` in every format; the
    JSON still decodes to git's exact text."""
    evil_name = "Eve\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
    evil_path = "src/\x1b[31mred\x1b[0m.py"
    git_repo.commit("evil", {evil_path: "x = 1\n"}, author=(evil_name, "eve@example.com"))
    call_command("submit", str(git_repo.path))
    run_workers()
    capsys.readouterr()
    for args in ((), ("--json",), ("--commits",)):
        call_command("results", str(git_repo.path), *args)
        out = capsys.readouterr().out
        assert not any(ch in out for ch in "\x1b\x07\x9b\u202e"), args
        if args == ("--json",):
            authors = json.loads(out)["summary"]["authors"]
            assert evil_name in {a["name"] for a in authors}  # the JSON value is exact
    call_command("results", str(git_repo.path))
    out = capsys.readouterr().out
    assert "Eve\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e (1)" in out
    assert "src/\\x1b[31mred\\x1b[0m.py (1)" in out
    call_command("results", str(git_repo.path), "--commits")
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    evil = next(r for r in rows if r["subject"] == "evil")
    assert evil["author_name"] == evil_name
    assert [f["path"] for f in evil["files"]] == [evil_path]


@pytest.mark.parametrize("reason", ["clear\x1b[2J", "bell\x07", "c1\x9b"])
def test_rollout_refuses_a_reason_with_control_characters_before_acting(reason: str) -> None:
    """One line, non-zero, and the version is untouched (docs/api.md#limits): an ESC in
    a reason would reach an operator's terminal from the timeline later."""
    ensure_baseline(actor="setup")
    v = register_version(config={"detect_renames": True}, actor="setup")
    AnalyzerVersion.objects.filter(pk=v.pk).update(state=AnalyzerVersion.State.DRAINED)
    with pytest.raises(CommandError) as info:
        call_command("rollout", "retire", v.fingerprint[:12], "--reason", reason)
    assert str(info.value) == "--reason must not hold control characters (NUL, ESC, …)"
    assert AnalyzerVersion.objects.get(pk=v.pk).state == AnalyzerVersion.State.DRAINED
    call_command("rollout", "retire", v.fingerprint[:12], "--reason", "superseded")
    assert AnalyzerVersion.objects.get(pk=v.pk).state == AnalyzerVersion.State.RETIRED


@pytest.mark.django_db
def test_fair_group_sets_lists_and_clears_a_groups_weight_and_refuses_bad_input(capsys) -> None:
    """``manage.py fair_group`` (docs/cli.md, docs/scheduling.md#group-weights)."""
    from dashboard.models import FairGroup

    call_command("fair_group", "github.com/pallets", "4")
    assert capsys.readouterr().out == "group github.com/pallets: weight 4\n"
    call_command("fair_group")
    assert capsys.readouterr().out == "github.com/pallets\t4\n"
    call_command("fair_group", "github.com/pallets", "--clear")
    assert capsys.readouterr().out == "group github.com/pallets: weight cleared\n"
    assert not FairGroup.objects.exists()
    for argv, message in [
        (["g", "many"], "weight must be a whole number"),
        (["g", "-3"], "a weight is 0 (no limit) to 1000"),
        (["g"], "give a WEIGHT or --clear"),
        (["g", "2", "--clear"], "give a WEIGHT or --clear"),
    ]:
        with pytest.raises(CommandError, match=re.escape(message)):
            call_command("fair_group", *argv)
