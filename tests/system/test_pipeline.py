"""The pipeline end to end: submit → sync → chunks → analyze, through real RQ workers,
real Redis masters, real git and the real database; compared with git itself."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from django.db import connection

from dashboard.infra import queues
from dashboard.models import Chunk, Commit, FileChange, JobRun, Repository
from dashboard.repositories.lifecycle import current_fingerprint, submit_repository
from tests.conftest import run_syncs_only, run_workers
from tests.support.gitrepo import GitRepo, reference_commits
from tests.support.stored_commits import assert_matches_reference
from workers.git.mirror import HEAD_REF, mirror_head
from workers.git.workspace import mirror_path
from workers.remotes.policy import InvalidRemote

pytestmark = pytest.mark.django_db(transaction=True)


def assert_matches_git(repo: Repository, origin: Path) -> None:
    assert_matches_reference(repo, reference_commits(origin))


def test_it_analyses_every_commit_of_a_submitted_repository(git_repo: GitRepo) -> None:
    repo, created = submit_repository(url=str(git_repo.path))
    assert created
    assert repo.status == Repository.Status.QUEUED
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert repo.head == git_repo.head()
    assert repo.commits_total == 3
    assert_matches_git(repo, git_repo.path)
    runs = JobRun.objects.filter(repository=repo)
    assert {r.kind for r in runs} == {"sync", "analyze"}
    assert all(r.state == JobRun.State.SUCCEEDED and r.token for r in runs)
    # the analyze phases are marked in the job and stored with its success
    for r in runs.filter(kind="analyze"):
        assert r.lock_acquired_at <= r.analysed_at <= r.written_at <= r.finished_at, r.pk


def test_it_splits_history_into_chunks_each_under_its_own_lock(git_repo: GitRepo, settings) -> None:
    settings.CHUNK_SIZE = 2
    for i in range(12):
        git_repo.commit(f"change {i}", {f"f{i % 3}.txt": f"line {i}\n" * (i + 1)})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    chunks = list(Chunk.objects.filter(repository=repo))
    assert len(chunks) > 1
    assert sum(c.size for c in chunks) == 15
    assert all(c.state == Chunk.State.DONE for c in chunks)
    # Each chunk was written under its own lock with its own fencing token.
    assert len({c.token for c in chunks}) == len(chunks) or len(
        {c.lock_key() for c in chunks}
    ) == len(chunks)
    assert all(c.lock_key().startswith(f"locks:git:repo:{repo.pk}:commit:") for c in chunks)
    assert_matches_git(repo, git_repo.path)


def test_a_longer_history_gets_larger_chunks_and_still_matches_git(
    git_repo: GitRepo, settings
) -> None:
    # 48 commits, floor 2, spread 2: the target doubles to 4 and to 8 (the ceiling)
    settings.CHUNK_SIZE, settings.CHUNK_MAX, settings.CHUNK_SPREAD = 2, 8, 2
    for i in range(45):
        git_repo.commit(f"change {i}", {f"d{i % 4}/f{i % 7}.txt": f"line {i}\n" * (i % 9 + 1)})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    chunks = list(Chunk.objects.filter(repository=repo).order_by("position"))
    assert [s for c in chunks for s in c.sha_list()] == git_repo.git(
        "rev-list", "--reverse", "--topo-order", "HEAD"
    ).split()  # every commit in exactly one chunk, oldest first
    assert max(c.size for c in chunks) > 2 * 2  # larger than the floor's cap allows
    assert all(c.size <= 2 * 8 for c in chunks) and len(chunks) > 1
    assert all(c.state == Chunk.State.DONE for c in chunks)
    assert_matches_git(repo, git_repo.path)


def test_it_analyses_only_new_commits_on_resubmission(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    before = dict(Commit.objects.filter(repository=repo).values_list("sha", "pk"))
    git_repo.commit("pushed later", {"late.txt": "new\n"})
    git_repo.commit("pushed later 2", {"late.txt": "new\nnewer\n"})
    again, created = submit_repository(url=str(git_repo.path))
    assert again.pk == repo.pk and not created
    assert again.status == Repository.Status.QUEUED
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    after = dict(Commit.objects.filter(repository=repo).values_list("sha", "pk"))
    assert len(after) == 5
    # Old rows untouched (same primary keys): nothing was re-analysed.
    assert {s: after[s] for s in before} == before
    new_chunks = Chunk.objects.filter(repository=repo).order_by("position")
    assert new_chunks.last().size == 2
    assert_matches_git(repo, git_repo.path)


def test_a_duplicate_submission_enqueues_no_work(git_repo: GitRepo) -> None:
    first, created1 = submit_repository(url=str(git_repo.path))
    second, created2 = submit_repository(url=str(git_repo.path) + "/")
    assert first.pk == second.pk and created1 and not created2
    assert queues.queue(queues.SYNC_QUEUE).count == 1
    run_workers()
    assert Commit.objects.filter(repository=first).count() == 3


def test_concurrent_duplicate_submissions_store_each_commit_once(git_repo: GitRepo) -> None:
    if connection.vendor == "sqlite":
        pass  # SQLite serialises writers; the race still exercises the unique constraint path
    results: list[object] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def submit() -> None:
        try:
            barrier.wait()
            results.append(submit_repository(url=str(git_repo.path))[0].pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert Repository.objects.count() == 1
    run_workers()
    # Redeliver every analyze attempt (same run, same attempt number): each is refused
    # by the database claim, nothing runs twice.
    q = queues.analysis_queue(current_fingerprint())
    analyze_runs = list(JobRun.objects.filter(kind="analyze"))
    for run in analyze_runs:
        q.enqueue("workers.jobs.analyze_chunk", run.pk, run.attempts, job_id=f"again-{run.pk}")
    run_workers()
    for run in analyze_runs:
        assert q.fetch_job(f"again-{run.pk}").return_value().startswith("superseded")
    # A forced new attempt of finished work finds it stored and touches nothing.
    JobRun.objects.filter(kind="analyze").update(state=JobRun.State.DEAD)
    from dashboard.runs.dead_letters import retry_runs

    assert retry_runs([r.pk for r in analyze_runs]) == len(analyze_runs)
    run_workers()
    repo = Repository.objects.get()
    assert Commit.objects.filter(repository=repo).count() == 3
    assert Commit.objects.values("sha").distinct().count() == 3
    assert set(JobRun.objects.values_list("state", flat=True)) == {"succeeded"}


def test_an_unreachable_repository_fails_with_a_readable_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    missing.mkdir()
    repo, _ = submit_repository(url=str(missing))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.FAILED
    assert "not found" in repo.error or "not a git repository" in repo.error
    assert "Traceback" not in repo.error


def test_a_missing_branch_fails_with_a_readable_reason(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path), branch="no-such-branch")
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.FAILED
    assert repo.error == "branch 'no-such-branch' does not exist in the repository"


def test_a_path_outside_the_local_roots_is_refused(tmp_path: Path, settings) -> None:
    settings.LOCAL_ROOTS = [tmp_path / "allowed"]
    with pytest.raises(InvalidRemote):
        submit_repository(url=str(tmp_path))
    assert Repository.objects.count() == 0


def test_g22_a_repository_that_borrows_objects_from_outside_the_roots_is_never_served(
    tmp_path: Path, settings
) -> None:
    """docs/security.md#g22: refused at submission; and one accepted first and made to
    borrow afterwards is refused by its next sync (dead at once: permanent), before git
    fetches anything, so the secret never reaches a mirror or a page."""
    settings.LOCAL_ROOTS = [(tmp_path / "roots").resolve()]
    secret = GitRepo.create(tmp_path / "secret")
    secret.commit("the secret", {"password.txt": "hunter2\n"})
    honest = GitRepo.create(tmp_path / "roots" / "honest")
    honest.commit("hello", {"README.md": "hi\n"})
    repo, _ = submit_repository(url=str(honest.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY
    alternates = honest.path / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(str(secret.path / ".git" / "objects") + "\n")
    honest.git("update-ref", "refs/heads/main", secret.head())
    with pytest.raises(InvalidRemote, match="alternates"):
        submit_repository(url=str(honest.path) + "/.")
    Repository.objects.filter(pk=repo.pk).update(status=Repository.Status.READY)
    from dashboard.repositories.lifecycle import refresh_repository

    assert refresh_repository(repo_id=repo.pk, fingerprint=current_fingerprint())
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.FAILED and "alternates" in repo.error
    assert repo.head != secret.head()
    mirror = mirror_path(tmp_path / "workspace", repo.pk)
    found = subprocess.run(["git", "--git-dir", str(mirror), "cat-file", "-e", secret.head()],
                           capture_output=True)  # fmt: skip
    assert found.returncode != 0
    assert not Commit.objects.filter(sha=secret.head()).exists()


@pytest.mark.parametrize("branch", ["ｍａｉｎ", "fix#1", "é/ü{x}"])
def test_a_branch_git_accepts_is_analysed_not_failed_later_for_its_name(
    tmp_path: Path, branch: str
) -> None:
    """A full-width or otherwise non-ASCII branch name passes the submission check as it
    passes git's (``git check-ref-format --branch``), and the fetch takes it too: it was
    accepted, then failed for good by the mirror's narrower rule."""
    origin = GitRepo.create(tmp_path / "origin", branch=branch)
    origin.commit("on the odd branch", {"a.txt": "1\n"})
    origin.commit("again", {"a.txt": "1\n2\n"})
    repo, _ = submit_repository(url=str(origin.path), branch=branch)
    assert repo.branch == branch
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert_matches_git(repo, origin.path)


def test_identities_longer_than_512_characters_are_stored_whole(git_repo: GitRepo) -> None:
    """git keeps an author's or committer's name and e-mail whatever their length; so
    does gitward (they were cut at 512 characters)."""
    name, email = "Ada " + "L" * 3000, "ada" + "x" * 1500 + "@example.com"
    git_repo.commit("long", {"long.txt": "x\n"}, author=(name, email))
    git_repo.git("commit", "--amend", "--quiet", "--no-edit", "--reset-author",
                 GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email,
                 GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email)  # fmt: skip
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    stored = Commit.objects.get(repository=repo, sha=git_repo.head())
    assert (stored.author_name, stored.author_email) == (name, email)
    assert (stored.committer_name, stored.committer_email) == (name, email)
    assert (stored.author_canonical_name, stored.author_canonical_email) == (name, email)
    assert_matches_git(repo, git_repo.path)


def hostile_history(tmp_path: Path) -> GitRepo:
    """Merges (two-parent and octopus), a root commit, binary files, a rename, an empty
    commit, non-ASCII names and messages, names with spaces/tabs/newlines, a .mailmap."""
    r = GitRepo.create(tmp_path / "hostile")
    r.commit(
        "root: ünïcödé 日本語",
        {"a b.txt": "one\ntwo\n"},
        author=("Zoë Łukasz", "zoe@example.com"),
        tz="+0530",
    )
    r.commit("binary", {"img.bin": bytes(range(256)) * 4, "tab\tname.txt": "t\n"}, tz="-0800")
    r.git("mv", "a b.txt", "renamed.txt")
    r.commit("rename as delete+add")
    r.commit("nothing", allow_empty=True)
    r.commit("newline name", {"new\nline.txt": "x\ny\n"})
    base = r.head()
    for name in ("left", "right", "third"):
        r.git("checkout", "-q", "-b", name, base)
        r.commit(
            f"on {name}",
            {f"{name}.txt": f"{name}\n" * 3, "renamed.txt": f"one\n{name}\n"}
            if name == "left"
            else {f"{name}.txt": f"{name}\n"},
        )
    r.git("checkout", "-q", "main")
    r.git(
        "merge",
        "-q",
        "--no-ff",
        "-m",
        "merge left",
        "left",
        GIT_AUTHOR_DATE="1800000000 +0000",
        GIT_COMMITTER_DATE="1800000000 +0000",
    )
    r.git(
        "merge",
        "-q",
        "--no-ff",
        "-m",
        "octopus",
        "right",
        "third",
        GIT_AUTHOR_DATE="1800003600 +0000",
        GIT_COMMITTER_DATE="1800003600 +0000",
    )
    r.commit(
        "mailmap", {".mailmap": "Zoe Canonical <zoe@example.com> Zoë Łukasz <zoe@example.com>\n"}
    )
    return r


def test_hostile_but_valid_histories_match_git_exactly(tmp_path: Path, settings) -> None:
    settings.CHUNK_SIZE = 2
    origin = hostile_history(tmp_path)
    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert_matches_git(repo, origin.path)
    merges = Commit.objects.filter(repository=repo, is_merge=True)
    assert sorted(len(m.parent_list()) for m in merges) == [2, 3]
    binary = FileChange.objects.get(repository=repo, path="img.bin")
    assert binary.binary and binary.added == binary.deleted == 0
    assert FileChange.objects.filter(path="new\nline.txt").count() == 1
    # Aggregates are mailmap-aware: the canonical name is what the summary shows.
    from dashboard.repositories.summaries import repository_summary

    authors = repository_summary(repo, current_fingerprint())["authors"]
    assert "Zoe Canonical" in {a["name"] for a in authors}


def _sync_only(git_repo: GitRepo) -> Repository:
    """Submit and run only the sync job: the mirror fetched, chunks planned and queued."""
    repo, _ = submit_repository(url=str(git_repo.path))
    run_syncs_only()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.ANALYZING and repo.head == git_repo.head()
    return repo


@pytest.mark.parametrize("damage", ["gone", "behind"])
def test_an_analyze_job_fetches_a_mirror_that_is_gone_or_lacks_its_commits(
    git_repo: GitRepo, settings, damage: str
) -> None:
    """The analyze job trusts the mirror without running git only when its head ref is
    the head the repository was planned from; a mirror that is gone, or an older one
    (another host synced: its ref is behind and the chunk's commits are missing), is
    fetched under the mirror lock first, and the results still equal git's."""
    repo = _sync_only(git_repo)
    path = mirror_path(Path(settings.WORKSPACE), repo.pk)
    assert mirror_head(path) == repo.head
    shutil.rmtree(path)
    if damage == "behind":
        git_repo.git("branch", "old", "HEAD~2")
        for args in (
            ["init", "-q", "--bare", str(path)],
            ["--git-dir", str(path), "symbolic-ref", "HEAD", HEAD_REF],
            ["--git-dir", str(path), "fetch", "-q", str(git_repo.path), f"old:{HEAD_REF}"],
        ):
            subprocess.run(["git", *args], check=True)
        assert mirror_head(path) not in (None, repo.head)
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert mirror_head(path) == git_repo.head()
    assert_matches_git(repo, git_repo.path)


def test_an_analyze_job_reads_a_mirror_whose_ref_moved_but_holds_the_commits(
    git_repo: GitRepo, settings
) -> None:
    """A mirror whose ref is not the planned head but which has the chunk's commits
    (``cat-file -e`` finds them) is used as it is: no fetch moves its ref back."""
    repo = _sync_only(git_repo)
    path = mirror_path(Path(settings.WORKSPACE), repo.pk)
    root = git_repo.shas()[-1]
    git_repo.git("--git-dir", str(path), "update-ref", HEAD_REF, root)
    assert mirror_head(path) == root != repo.head
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert mirror_head(path) == root  # not fetched again
    assert_matches_git(repo, git_repo.path)


def test_a_retry_repairs_a_mirror_whose_objects_are_gone_but_whose_ref_is_intact(
    git_repo: GitRepo, settings
) -> None:
    """The first attempt trusts the intact ref and fails on the missing objects; the
    retry asks git, finds the commit missing, and fetches (sanitising re-clones the
    broken mirror): the results still equal git's."""
    repo = _sync_only(git_repo)
    path = mirror_path(Path(settings.WORKSPACE), repo.pk)
    gone = [*(path / "objects" / "pack").iterdir(), *(path / "objects").glob("??")]
    assert gone
    for p in gone:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    assert mirror_head(path) == repo.head
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    (run,) = JobRun.objects.filter(repository=repo, kind="analyze")
    assert run.attempts == 2
    assert_matches_git(repo, git_repo.path)


def _git_totals(origin: Path) -> dict[str, int]:
    """Commits, insertions, deletions and authors of ``HEAD`` as git counts them (the
    same diff as the analysis: first parent, no renames; authors by mailmapped e-mail)."""
    ref = reference_commits(origin)
    emails = subprocess.run(
        ["git", "-C", str(origin), "log", "--format=%aE", "HEAD"],
        capture_output=True, check=True, text=True,
    ).stdout.split()  # fmt: skip
    return {
        "commits": len(ref),
        "insertions": sum(c["insertions"] for c in ref.values()),
        "deletions": sum(c["deletions"] for c in ref.values()),
        "authors": len(set(emails)),
    }


def _served_equals_git(repo: Repository, origin: Path) -> None:
    """What is served for ``repo`` is git's ``HEAD``, exactly: the stored commits are
    ``git rev-list HEAD``, the kept count, the total and the summary's totals are git's."""
    from dashboard.repositories.commit_counts import stored_commits
    from dashboard.repositories.commits import iter_commits
    from dashboard.repositories.lifecycle import repository_status
    from dashboard.repositories.summaries import repository_summary

    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    fp = current_fingerprint()
    rev_list = subprocess.run(
        ["git", "-C", str(origin), "rev-list", "HEAD"], capture_output=True, check=True, text=True
    ).stdout.split()
    stored = set(
        Commit.objects.filter(repository=repo, fingerprint=fp).values_list("sha", flat=True)
    )
    assert stored == set(rev_list)
    assert {c["sha"] for c in iter_commits(repo, fingerprint=fp)} == set(rev_list)
    state = repository_status(repo)
    assert state["commits_analyzed"] == state["commits_total"] == len(rev_list)
    assert stored_commits(repo.pk, fp) == len(rev_list)
    totals = repository_summary(repo, fp)["totals"]
    want = _git_totals(origin)
    assert {k: totals[k] for k in want} == want
    assert_matches_git(repo, origin)


def test_a_rewritten_history_serves_exactly_the_commits_of_the_new_head(
    git_repo: GitRepo, settings
) -> None:
    """Force-push to a rewritten middle, move the branch back, force-push an unrelated
    history, and forward again: after each, through real workers, what is served (commits,
    counts, totals, authors, the API's list) is git's ``HEAD`` exactly (analysis.md)."""
    settings.CHUNK_SIZE = 2
    for i in range(5):
        git_repo.commit(f"change {i}", {f"f{i % 2}.txt": f"line {i}\n" * (i + 1)})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    _served_equals_git(repo, git_repo.path)

    # a rewrite of the middle: the last three commits replaced by two others, by someone else
    git_repo.git("reset", "--quiet", "--hard", "HEAD~3")
    git_repo.commit("rewritten a", {"f0.txt": "other\n"}, author=("Mallory", "m@example.com"))
    git_repo.commit("rewritten b", {"g.txt": "x\ny\n"}, author=("Mallory", "m@example.com"))
    submit_repository(url=str(git_repo.path))
    run_workers()
    _served_equals_git(repo, git_repo.path)

    # the branch moved back: nothing new, two commits dropped
    git_repo.git("reset", "--quiet", "--hard", "HEAD~2")
    submit_repository(url=str(git_repo.path))
    run_workers()
    _served_equals_git(repo, git_repo.path)

    # a force-push of an unrelated history
    git_repo.git("checkout", "--quiet", "--orphan", "fresh")
    git_repo.git("rm", "-r", "--quiet", "--cached", ".")
    git_repo.commit("unrelated root", {"new.txt": "a\n"}, author=("Eve", "eve@example.com"))
    git_repo.commit("unrelated next", {"new.txt": "a\nb\n"})
    git_repo.git("branch", "--quiet", "-M", "fresh", "main")
    submit_repository(url=str(git_repo.path))
    run_workers()
    _served_equals_git(repo, git_repo.path)

    # and a fast-forward on top of it is incremental again, still exact
    git_repo.commit("after", {"new.txt": "a\nb\nc\n"})
    submit_repository(url=str(git_repo.path))
    run_workers()
    _served_equals_git(repo, git_repo.path)
