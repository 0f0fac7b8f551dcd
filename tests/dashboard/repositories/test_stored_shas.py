"""dashboard.repositories.commits.stored_shas: exactly the stored shas of one (repository,
fingerprint), and on PostgreSQL a plan that probes the unique index once per sha even
when the table's statistics know nothing of the repository (a backfill that began after
the last ANALYZE), instead of scanning every stored commit of the repository against the
whole array (docs/scheduling.md#stored-commit-checks-on-postgresql)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from dashboard.models import Commit, Repository
from dashboard.repositories.commits import stored_shas, stored_shas_query

pytestmark = pytest.mark.django_db(transaction=True)

WHEN = datetime(2024, 1, 1, tzinfo=UTC)
PERSON: dict[str, Any] = {
    **{f"{who}_{part}": "a" for who in ("author", "committer") for part in ("name", "email")},
    "author_canonical_name": "a",
    "author_canonical_email": "a",
    "authored_at": WHEN,
    "committed_at": WHEN,
    "subject": "s",
}


def _sha(i: int, salt: str) -> str:
    """A 40-hex sha: one ``salt`` letter, then ``i``."""
    return f"{salt}{i:039x}"


def _store(repo: Repository, fp: str, shas: list[str]) -> None:
    Commit.objects.bulk_create(
        [Commit(repository=repo, fingerprint=fp, sha=sha, **PERSON) for sha in shas],
        batch_size=1000,
    )


def test_exactly_the_stored_shas_of_that_repository_and_fingerprint() -> None:
    a = Repository.objects.create(url="https://example.com/a.git")
    b = Repository.objects.create(url="https://example.com/b.git")
    mine = [_sha(i, "a") for i in range(300)]
    _store(a, "fp", mine[:200])
    _store(a, "other", mine[200:])  # same repository, another fingerprint
    _store(b, "fp", mine[200:])  # same shas, another repository
    asked = mine[150:250] + mine[150:160] + [_sha(i, "f") for i in range(20)]  # repeats, absent
    assert stored_shas(a.pk, "fp", asked) == set(mine[150:200])
    assert stored_shas(b.pk, "fp", asked) == set(mine[200:250])
    assert stored_shas(a.pk, "other", asked) == set(mine[200:250])
    assert stored_shas(a.pk, "fp", []) == set()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner")
def test_postgresql_probes_the_index_per_sha_without_statistics_for_the_repository() -> None:
    old = Repository.objects.create(url="https://example.com/old.git")
    _store(old, "fp", [_sha(i, "b") for i in range(500)])
    with connection.cursor() as cursor:  # statistics from before the new repository's rows
        cursor.execute("ANALYZE dashboard_commit")
    new = Repository.objects.create(url="https://example.com/new.git")
    stored = [_sha(i, "c") for i in range(20_000)]
    _store(new, "fp", stored)
    asked = stored[::40] + [_sha(i, "d") for i in range(500)]  # 500 stored, 500 not

    sql, params = stored_shas_query("postgresql", new.pk, "fp", asked)
    with connection.cursor() as cursor:
        cursor.cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        (raw,) = cursor.cursor.fetchone()
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    scans = [n for n in _nodes(plan) if n.get("Relation Name") == "dashboard_commit"]
    assert scans, plan
    for scan in scans:
        # each probe reads only rows with its own sha: none read and thrown away
        assert scan.get("Rows Removed by Filter", 0) == 0, scan
        assert "sha" in scan.get("Index Cond", ""), scan
    assert stored_shas(new.pk, "fp", asked) == set(stored[::40])
