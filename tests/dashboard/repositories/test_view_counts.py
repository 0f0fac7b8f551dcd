"""Repository page views counted in memory and written in batches
(``dashboard.repositories.view_counts``):
exact counts per day, no database write per view, concurrent flushes that lose nothing,
a failed flush that keeps its counts, deleted repositories skipped."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.models import Repository, RepositoryView
from dashboard.repositories import view_counts
from dashboard.repositories.view_counts import flush_views, pending_views, record_view
from tests.support.checked_threads import CheckedThread

pytestmark = pytest.mark.django_db(transaction=True)


def _views(repo: Repository) -> dict[str, int]:
    return {v.day.isoformat(): v.views for v in RepositoryView.objects.filter(repository=repo)}


def test_views_are_counted_in_memory_and_written_by_the_flush() -> None:
    repo = Repository.objects.create(url="https://example.com/v/a.git")
    other = Repository.objects.create(url="https://example.com/v/b.git")
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(5):
            record_view(repo.pk)
        record_view(other.pk)
    assert ctx.captured_queries == [] and pending_views() == 6
    assert not RepositoryView.objects.exists()
    assert flush_views() == 6 and pending_views() == 0
    today = timezone.localdate().isoformat()
    assert _views(repo) == {today: 5} and _views(other) == {today: 1}
    for _ in range(2):
        record_view(repo.pk)
    assert flush_views() == 2
    assert _views(repo) == {today: 7}  # added to the row, not written over it
    assert flush_views() == 0


def test_a_repository_page_view_writes_nothing_until_the_flush() -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-123456"))
    repo = Repository.objects.create(url="https://example.com/v/page.git")
    assert client.get(f"/repos/{repo.pk}/").status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(f"/repos/{repo.pk}/").status_code == 200
    writes = [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith("SELECT")]
    assert writes == []
    assert pending_views() == 2
    flush_views()
    assert _views(repo) == {timezone.localdate().isoformat(): 2}


def test_a_view_flushes_once_the_interval_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repository.objects.create(url="https://example.com/v/due.git")
    record_view(repo.pk)
    assert pending_views() == 1
    monkeypatch.setattr(view_counts, "FLUSH_SECONDS", 0.0)
    record_view(repo.pk)  # due: this view writes both
    assert pending_views() == 0
    assert _views(repo) == {timezone.localdate().isoformat(): 2}


def test_concurrent_flushes_lose_no_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every view flushes (interval 0) from four threads, each with its own database
    connection: the first inserts of the day's row meet the unique constraint and the
    later ones add in the database; the total is exact."""
    monkeypatch.setattr(view_counts, "FLUSH_SECONDS", 0.0)
    repo = Repository.objects.create(url="https://example.com/v/race.git")

    def view(n: int) -> None:
        try:
            for _ in range(n):
                record_view(repo.pk)
        finally:
            connection.close()

    threads = [CheckedThread(target=view, args=(25,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flush_views()
    assert _views(repo) == {timezone.localdate().isoformat(): 100}


def test_views_of_each_day_go_to_that_days_row(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repository.objects.create(url="https://example.com/v/days.git")
    today = timezone.localdate()
    yesterday = today - timedelta(days=1)
    monkeypatch.setattr(timezone, "localdate", lambda: yesterday)
    record_view(repo.pk)
    record_view(repo.pk)
    monkeypatch.setattr(timezone, "localdate", lambda: today)
    record_view(repo.pk)
    flush_views()
    assert _views(repo) == {yesterday.isoformat(): 2, today.isoformat(): 1}


def test_a_deleted_repositorys_views_are_skipped() -> None:
    gone = Repository.objects.create(url="https://example.com/v/gone.git")
    kept = Repository.objects.create(url="https://example.com/v/kept.git")
    record_view(gone.pk)
    record_view(kept.pk)
    gone.delete()
    assert flush_views() == 1
    assert _views(kept) == {timezone.localdate().isoformat(): 1}
    assert RepositoryView.objects.count() == 1


def test_a_failed_flush_keeps_its_views_for_the_next_one() -> None:
    """The database refuses the write (SQLite: another connection holds the write lock
    past this connection's timeout): the page's flush logs and keeps the counts, and
    the next flush writes them."""
    if connection.vendor != "sqlite":
        pytest.skip("holds SQLite's write lock from a second connection")
    repo = Repository.objects.create(url="https://example.com/v/locked.git")
    for _ in range(3):
        record_view(repo.pk)
    connection.close()
    options = connection.settings_dict["OPTIONS"]
    saved = options.get("timeout")
    options["timeout"] = 0.2
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert flush_views() == 0
        assert pending_views() == 3
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        connection.close()
        options["timeout"] = saved
    assert flush_views() == 3
    assert _views(repo) == {timezone.localdate().isoformat(): 3}
