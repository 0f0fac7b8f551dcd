"""What gitward stored for a repository, in the shape of ``tests.support.gitrepo``'s references."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dashboard.models import Commit, FileChange, Repository
from dashboard.repositories.lifecycle import current_fingerprint


def stored(repo: Repository) -> dict[str, dict[str, Any]]:
    """Every commit stored for ``repo`` under the current analyzer version, by sha
    (offsets as stored: minutes east of UTC)."""
    out = {}
    for c in Commit.objects.filter(repository=repo, fingerprint=current_fingerprint()):
        files = sorted(
            (f.path, f.added, f.deleted, f.binary) for f in FileChange.objects.filter(commit=c)
        )
        out[c.sha] = {
            "sha": c.sha,
            "parents": c.parent_list(),
            "author_name": c.author_name,
            "author_email": c.author_email,
            "authored_at": c.authored_at,
            "author_tz": c.author_tz,
            "committer_name": c.committer_name,
            "committer_email": c.committer_email,
            "committed_at": c.committed_at,
            "committer_tz": c.committer_tz,
            "subject": c.subject,
            "is_merge": c.is_merge,
            "files": files,
            "files_changed": c.files_changed,
            "insertions": c.insertions,
            "deletions": c.deletions,
        }
    return out


def assert_matches_reference(repo: Repository, ref: dict[str, dict[str, Any]]) -> None:
    """Stored results equal ``tests.support.gitrepo.reference_commits``: the same commits, the
    same instants and everything else alike (the offsets are checked by the API tests)."""
    got = stored(repo)
    assert set(got) == set(ref)
    for sha, want in ref.items():
        have = dict(got[sha])
        del have["author_tz"], have["committer_tz"]
        assert have.pop("authored_at") == datetime.fromisoformat(want["authored_at"])
        assert have.pop("committed_at") == datetime.fromisoformat(want["committed_at"])
        expected = {k: v for k, v in want.items() if k not in {"authored_at", "committed_at"}}
        assert have == expected, sha


def assert_counts_exact() -> None:
    """The kept count of stored commits (``dashboard.repositories.commit_counts``) equals
    ``COUNT(*)`` for every (repository, fingerprint) that has commits or a count row."""
    from django.db.models import Count

    from dashboard.models import CommitCount

    counted = {
        (r, fp): n
        for r, fp, n in Commit.objects.order_by()
        .values_list("repository_id", "fingerprint")
        .annotate(n=Count("id"))
    }
    kept = {
        (r, fp): n
        for r, fp, n in CommitCount.objects.values_list("repository_id", "fingerprint", "commits")
        if n
    }
    assert kept == counted
