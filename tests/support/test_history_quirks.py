"""The quirk catalog (tests/support/history_quirks.py) end to end: each repository is checked by
``git fsck`` (the quirk is really there, at git's documented severity, and the policy
accepts it), submitted, synced and analysed by real RQ workers, and compared with what
``git log --numstat --no-renames --diff-merges=first-parent`` reports for it."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from dashboard.models import Commit, JobRun, Repository
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.gitrepo import fsck_findings, git_log_reference
from tests.support.history_quirks import CATALOG, Quirk, grafted_history
from tests.support.stored_commits import stored
from workers.git.fsck_policy import rule_for
from workers.git.workspace import mirror_path

pytestmark = pytest.mark.django_db(transaction=True)

#: What gitward stores for a date git prints none for, and for one past year 9999.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def analyse(quirk: Quirk, branch: str | None = None) -> Repository:
    repo, _ = submit_repository(url=str(quirk.path), branch=branch or quirk.branch)
    run_workers()
    repo.refresh_from_db()
    return repo


def instant(ts: int | None) -> datetime:
    if ts is None:
        return EPOCH
    if ts > int(LATEST.timestamp()):
        return LATEST
    return datetime.fromtimestamp(ts, UTC)


def offset_minutes(tz: str | None, ts: int | None) -> int:
    """git's reading of ``+hhmm`` (a number: hours = n // 100, minutes = n % 100); 0 where
    Python cannot hold it (24 h or more, or a clamped/absent date)."""
    if tz is None or ts is None or instant(ts) in (LATEST,):
        return 0
    hours, minutes = divmod(int(tz[1:]), 100)
    total = (hours * 60 + minutes) * (-1 if tz[0] == "-" else 1)
    return total if abs(total) < 24 * 60 else 0


def expected_from(reference: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for sha, want in reference.items():
        row = dict(want)
        a_ts, a_tz = row.pop("authored_ts"), row.pop("author_tz")
        c_ts, c_tz = row.pop("committed_ts"), row.pop("committer_tz")
        row["authored_at"] = instant(a_ts)
        row["author_tz"] = offset_minutes(a_tz, a_ts)
        row["committed_at"] = instant(c_ts)
        row["committer_tz"] = offset_minutes(c_tz, c_ts)
        out[sha] = row
    return out


def assert_equal_to_git(repo: Repository, quirk: Quirk) -> dict[str, dict[str, Any]]:
    reference = git_log_reference(quirk.reference or quirk.path, quirk.ref, quirk.reference_env)
    want = expected_from(reference)
    got = stored(repo)
    assert set(got) == set(want)
    for sha in want:
        assert got[sha] == want[sha], sha
    return got


@pytest.fixture(params=sorted(CATALOG))
def quirk(request: pytest.FixtureRequest, tmp_path: Path) -> Quirk:
    return CATALOG[request.param](tmp_path)


def test_each_quirk_is_what_git_fsck_reports_and_the_policy_accepts(quirk: Quirk) -> None:
    found = fsck_findings(quirk.path)
    assert {msg_id for _level, msg_id in found} == quirk.findings
    # What a fetch checks (--strict): the same, plus findings only strict looks for.
    strict = fsck_findings(quirk.path, strict=True)
    assert {msg_id for _level, msg_id in strict} == quirk.findings | quirk.strict_only
    for msg_id in quirk.strict_only:
        rule = rule_for(msg_id)
        assert rule is not None and rule.decision == "accept", msg_id
    for level, msg_id in found:
        rule = rule_for(msg_id)
        assert rule is not None, msg_id
        assert rule.decision == "accept", msg_id
        # git's default severity, as git fsck itself prints it (infos print as warnings).
        assert level == ("error" if rule.severity in ("error", "fatal") else "warning"), msg_id


def test_each_quirk_is_analysed_exactly_as_git_reports_it(quirk: Quirk) -> None:
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    got = assert_equal_to_git(repo, quirk)
    assert repo.commits_total == len(got) > 0


# --------------------------------------------------------------------------- the details


def test_odd_time_zones_keep_git_s_offset_or_fall_back_to_utc(tmp_path: Path) -> None:
    quirk = CATALOG["odd-time-zones"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    by_subject = {c["subject"]: c for c in stored(repo).values()}
    assert by_subject["offset +1400"]["author_tz"] == 14 * 60
    assert by_subject["offset -1200"]["author_tz"] == -12 * 60
    assert by_subject["offset -1260"]["author_tz"] == -13 * 60  # git: 12 h + 60 min
    assert by_subject["offset +51800"]["author_tz"] == 0  # +518:00 is not an offset
    assert by_subject["offset +000"]["author_tz"] == 0
    when = datetime(2004, 11, 9, 11, 33, 20, tzinfo=UTC) + timedelta(days=3)
    assert by_subject["offset +51800"]["authored_at"] == when


def test_odd_dates_are_git_s_instants_clamped_to_what_python_holds(tmp_path: Path) -> None:
    quirk = CATALOG["odd-dates"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    dates = {c["subject"]: c["authored_at"] for c in stored(repo).values()}
    assert dates["date 0"] == EPOCH
    assert dates["date 1"] == datetime(5138, 11, 16, 9, 46, 39, tzinfo=UTC)
    assert dates["date 2"] == LATEST  # git: year 33658
    assert dates["date 3"] == EPOCH  # git reads the overflow as 0
    assert dates["date 4"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert dates["date 5"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert dates["date 6"] == EPOCH  # no offset: git prints no date


def test_malformed_emails_are_stored_as_git_splits_them(tmp_path: Path) -> None:
    quirk = CATALOG["odd-emails"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    who = {c["subject"]: (c["author_name"], c["author_email"]) for c in stored(repo).values()}
    assert who["ident 0"] == ("Ada", "")
    assert who["ident 1"] == ("", "")  # no <>: git shows no author at all
    assert who["ident 2"] == ("Ada Lovelace", "ada at example dot com")
    assert who["ident 3"] == ("", "ada@example.com")
    assert who["ident 4"] == ("Ada", "ada@example.com")


def test_declared_encodings_are_converted_to_utf8(tmp_path: Path) -> None:
    quirk = CATALOG["legacy-encodings"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    commits = sorted(stored(repo).values(), key=lambda c: c["committed_at"])
    subjects = {c["subject"] for c in commits}
    assert "Café crème: déjà vu" in subjects
    declared = next(c for c in commits if c["subject"] == "Café crème: déjà vu")
    assert declared["author_name"] == "Zoë Brontë"
    # An encoding git cannot convert from, and undeclared Latin-1: bytes that are not
    # UTF-8 become U+FFFD (never a crash, never surrogates PostgreSQL refuses).
    assert "na\ufffdve fa\ufffdade" in subjects
    assert "ungesch\ufffdtzt Gr\ufffd\ufffde" in subjects


def test_gitlinks_count_as_one_changed_line_each(tmp_path: Path) -> None:
    quirk = CATALOG["gitlinks"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    files = {c["subject"]: c["files"] for c in stored(repo).values()}
    assert ("vendor/lib", 1, 0, False) in files["add submodule"]
    assert files["bump submodule"] == [("vendor/lib", 1, 1, False)]


def test_a_66_parent_octopus_keeps_every_parent(tmp_path: Path) -> None:
    quirk = CATALOG["octopus-66"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    (merge,) = Commit.objects.filter(repository=repo, is_merge=True)
    assert len(merge.parent_list()) == 66
    # First-parent diff: everything but branch 0's file is new relative to parent 1.
    assert merge.files_changed == 65


def test_replacements_do_not_change_what_is_analysed(tmp_path: Path) -> None:
    quirk = CATALOG["replaced-history"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    assert_equal_to_git(repo, quirk)
    replaced_view = git_log_reference(quirk.path, quirk.ref)  # git honours refs/replace
    assert set(replaced_view) != set(stored(repo))
    assert "the replacement" in {c["subject"] for c in replaced_view.values()}


def test_a_grafted_remote_is_refused_as_git_clone_refuses_it(tmp_path: Path) -> None:
    quirk = grafted_history(tmp_path)
    assert len(git_log_reference(quirk.path, quirk.ref)) == 2  # git honours info/grafts
    clone = subprocess.run(
        ["git", "clone", "-q", "--bare", f"file://{quirk.path}", str(tmp_path / "clone")],
        capture_output=True,
        env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"},
    )
    assert clone.returncode != 0 and b"did not receive expected object" in clone.stderr
    repo = analyse(quirk)
    assert repo.status == Repository.Status.FAILED
    assert repo.error.startswith("the repository sent an incomplete history (object ")
    assert JobRun.objects.get(repository=repo, kind="sync").attempts == 1  # not retried
    assert Commit.objects.count() == 0


def test_a_shallow_origin_gives_a_shallow_mirror_whose_boundary_is_a_root(
    tmp_path: Path,
) -> None:
    quirk = CATALOG["shallow-history"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    assert (mirror_path(Path(settings.WORKSPACE), repo.pk) / "shallow").is_file()
    got = stored(repo)
    assert len(got) == 2
    roots = [c for c in got.values() if not c["parents"]]
    assert len(roots) == 1
    # The boundary is diffed against the empty tree, as git log shows it there.
    assert roots[0]["files_changed"] == 5


def test_without_a_branch_the_remote_head_is_analysed(tmp_path: Path) -> None:
    master = CATALOG["head-on-master"](tmp_path / "m")
    repo = analyse(master)
    assert repo.status == Repository.Status.READY, repo.error
    assert {c["subject"] for c in stored(repo).values()} == {"master root", "master work"}
    main = analyse(master, branch="main")
    assert main.pk != repo.pk and main.status == Repository.Status.READY, main.error
    assert {c["subject"] for c in stored(main).values()} == {"unrelated main"}
    trunk = CATALOG["trunk-default-branch"](tmp_path / "t")
    repo = analyse(trunk)
    assert repo.status == Repository.Status.READY, repo.error
    assert repo.commits_total == 2


def test_empty_trees_and_empty_commits_change_no_files(tmp_path: Path) -> None:
    quirk = CATALOG["empty-trees"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    changed = [c["files_changed"] for c in sorted(stored(repo).values(), key=lambda c: c["sha"])]
    assert sorted(changed) == [0, 0, 0, 2, 2]


def test_a_commit_of_thousands_of_files_is_stored_in_full(tmp_path: Path) -> None:
    quirk = CATALOG["huge-commit"](tmp_path)
    repo = analyse(quirk)
    assert repo.status == Repository.Status.READY, repo.error
    sizes = sorted(c["files_changed"] for c in stored(repo).values())
    assert sizes == [2500, 5000]
