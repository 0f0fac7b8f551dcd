"""Every reader serves the served fingerprint's numbers and no other version's (issue
11.1: results and every cache derived from them are keyed by fingerprint).

One repository holds results under two analyzer versions that disagree on everything a
reader shows (commit count, totals, authors, languages, hotspots, weekly chart, which
commits exist). Each reader — the repository page and its chart, the repository list
and its counts, the status/summary/commits API, the commit lookup, the live snapshot
and ``manage.py results`` — is asked before and after the current version changes; the
summary cache of the first version is warm when the switch happens, so a cache keyed
by repository alone would be caught serving it."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from dashboard.live.snapshots import repository_live
from dashboard.models import AnalyzerVersion, Commit, FileChange, Repository, Summary
from dashboard.repositories.commit_counts import add_stored
from dashboard.repositories.lifecycle import current_fingerprint, repository_rows, repository_status
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State
T0 = datetime(2024, 1, 1, 12, tzinfo=UTC)

#: fingerprint role → (commits as (sha digit, insertions, path), author)
RESULTS = {
    "base": ([("a", 1111, "base_only.py"), ("b", 2222, "base_only.py"), ("c", 3333, "x.rs")],
             "Base Author"),
    "new": ([("a", 7, "new_only.go"), ("d", 9, "new_only.go"), ("f", 5, "new_only.go")],
            "New Author"),
}  # fmt: skip
# The same number of commits under both: a cache keyed by repository (or invalidated
# only by a changed count) would serve the other version's numbers.


def store(repo: Repository, fingerprint: str, role: str) -> None:
    rows, author = RESULTS[role]
    for i, (digit, ins, path) in enumerate(rows):
        at = T0 + timedelta(weeks=i if role == "base" else 10 + i)
        c = Commit.objects.create(
            repository=repo, fingerprint=fingerprint, sha=digit * 40,
            author_name=author, author_email=f"{role}@example.org",
            author_canonical_name=author, author_canonical_email=f"{role}@example.org",
            authored_at=at, committer_name=author, committer_email=f"{role}@example.org",
            committed_at=at, subject=f"{role} commit {digit}", files_changed=1,
            insertions=ins, deletions=0,
        )  # fmt: skip
        language = "Python" if path.endswith(".py") else ("Go" if path.endswith(".go") else "Rust")
        FileChange.objects.create(
            commit=c, repository=repo, fingerprint=fingerprint, path=path, added=ins,
            deleted=0, language=language,
        )  # fmt: skip
    # As write_chunk does in its transaction: the kept count of stored commits.
    add_stored(repo.pk, fingerprint, len(rows))


def make_current(version: AnalyzerVersion, previous: AnalyzerVersion) -> None:
    """The current version changes (what promote and rollback commit, without the
    rest of a rollout: this test is about the readers)."""
    AnalyzerVersion.objects.filter(pk=previous.pk).update(state=S.DRAINING)
    AnalyzerVersion.objects.filter(pk=version.pk).update(state=S.CURRENT, verified_at=T0)


def expect(client: Client, repo: Repository, role: str, fingerprint: str) -> None:
    rows, author = RESULTS[role]
    other, other_author = RESULTS["new" if role == "base" else "base"]
    total = sum(ins for _, ins, _ in rows)
    assert current_fingerprint() == fingerprint
    # The summary (and its cache), as the API serves it.
    body = client.get(f"/api/repos/{repo.pk}?summary=1").json()
    assert body["fingerprint"] == fingerprint
    assert body["commits_analyzed"] == len(rows)
    totals = body["summary"]["totals"]
    assert (totals["commits"], totals["insertions"]) == (len(rows), total)
    assert [a["name"] for a in body["summary"]["authors"]] == [author]
    assert {h["path"] for h in body["summary"]["hotspots"]} == {p for _, _, p in rows}
    assert sum(w["commits"] for w in body["summary"]["weekly"]) == len(rows)
    assert Summary.objects.get(repository=repo, fingerprint=fingerprint).commits == len(rows)
    # The commits API and the commit lookup.
    listed = client.get(f"/api/repos/{repo.pk}/commits").json()["results"]
    assert sorted(c["sha"][0] for c in listed) == sorted(d for d, _, _ in rows)
    only_other = next(d for d, _, _ in other if d not in {x for x, _, _ in rows})
    assert client.get(f"/api/repos/{repo.pk}/commits/{only_other * 12}").status_code == 404
    # The repository page, its chart and its commit list.
    page = client.get(f"/repos/{repo.pk}/").content.decode()
    assert author in page and other_author not in page
    assert f'<div class="n">+{total}</div>' in page  # the "lines added" card
    for _, _, path in other:
        assert path not in page
    # The repository list's counts, the status shape and the live snapshot.
    (row,) = repository_rows(Repository.objects.filter(pk=repo.pk))
    assert row["commits_analyzed"] == len(rows)
    assert repository_status(repo)["commits_analyzed"] == len(rows)
    assert repository_live(repo.pk)["commits_analyzed"] == len(rows)
    # The CLI.
    out = io.StringIO()
    call_command("results", str(repo.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["summary"]["totals"]["insertions"] == total
    out = io.StringIO()
    call_command("results", str(repo.pk), "--commits", stdout=out)
    assert len(out.getvalue().splitlines()) == len(rows)


def test_every_reader_serves_only_the_current_versions_numbers() -> None:
    base = ensure_baseline(actor="setup")
    new = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    repo = Repository.objects.create(
        url="https://example.org/two-versions.git",
        status=Repository.Status.READY, fingerprint=base.fingerprint, commits_total=3,
    )  # fmt: skip
    store(repo, base.fingerprint, "base")
    store(repo, new.fingerprint, "new")
    client = Client()
    client.force_login(User.objects.create_user("viewer", password="pw-viewer-123"))
    expect(client, repo, "base", base.fingerprint)  # warms the base version's summary
    make_current(new, base)  # promote
    expect(client, repo, "new", new.fingerprint)
    make_current(base, new)  # rollback: the base summary is served as cached
    expect(client, repo, "base", base.fingerprint)


def test_progress_is_of_the_served_versions_results() -> None:
    """A repository ready under one version is not 100 % done under another (after a
    promote, until the catch-up has analysed it again)."""
    base = ensure_baseline(actor="setup")
    new = state_machine.register_version(config={"detect_renames": True}, actor="setup")
    repo = Repository.objects.create(
        url="https://example.org/progress.git",
        status=Repository.Status.READY, fingerprint=base.fingerprint, commits_total=3,
    )  # fmt: skip
    store(repo, base.fingerprint, "base")
    assert repository_status(repo)["progress"] == 100.0
    make_current(new, base)
    Commit.objects.create(
        repository=repo, fingerprint=new.fingerprint, sha="e" * 40, author_name="n",
        author_email="n@x", author_canonical_name="n", author_canonical_email="n@x",
        authored_at=T0, committer_name="n", committer_email="n@x", committed_at=T0,
        subject="s",
    )  # fmt: skip
    add_stored(repo.pk, new.fingerprint, 1)
    assert repository_status(repo)["progress"] == pytest.approx(33.3)
    (row,) = repository_rows(Repository.objects.filter(pk=repo.pk))
    assert row["progress"] == pytest.approx(33.3)
