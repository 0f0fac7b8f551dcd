"""dashboard.runs.dead_letter_counts: /metrics reuses its dead-letter group counts while the dead
set is unchanged, and every change made through gitward (a run dying, a retry, a discard, a bulk
action) shows at the very next scrape — real failing jobs, real RQ workers, real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.infra import queues
from dashboard.models import JobRun
from dashboard.repositories.lifecycle import submit_repository
from dashboard.runs import dead_letter_counts
from dashboard.runs.dead_letters import discard_runs, retry_runs
from tests.conftest import run_workers
from tests.dashboard.operations.test_prometheus import make_repo, scrape

pytestmark = pytest.mark.django_db(transaction=True)


def dead_letters() -> float:
    return scrape().total("gitward_dead_letters")


def kill_one(tmp_path: Path, monkeypatch, name: str) -> JobRun:
    """A repository whose analysis fails every attempt: one real dead letter."""
    monkeypatch.setenv("GITWARD_FAILPOINTS", f"analyze.parsing#{name}=raise")
    submit_repository(url=str(make_repo(tmp_path, name).path))
    run_workers()
    return JobRun.objects.get(kind="analyze", state="dead")


def test_counts_are_cached_until_the_dead_set_changes(tmp_path: Path, settings, monkeypatch):
    settings.METRICS_CACHE_SECONDS = 3600
    assert dead_letters() == 0
    run = kill_one(tmp_path, monkeypatch, "poison")  # runs.fail_attempt → changed()
    got = scrape()
    assert got.one("gitward_dead_letters", group=run.cause_key) == 1
    assert got.one("gitward_runs", state="dead") == 1
    # A change behind gitward's back (no changed()) is not seen: the counts are cached…
    JobRun.objects.filter(pk=run.pk).update(cause_key="edited-by-hand")
    assert scrape().one("gitward_dead_letters", group=run.cause_key) == 1
    # …but a retry through gitward is seen at once,
    monkeypatch.delenv("GITWARD_FAILPOINTS")
    assert retry_runs([run.pk]) == 1
    assert dead_letters() == 0
    # and so is the next death and a discard.
    JobRun.objects.filter(pk=run.pk).update(state="dead")
    dead_letter_counts.changed()  # (outside a transaction: bumps at once)
    assert dead_letters() == 1
    assert discard_runs([run.pk]) == 1
    assert dead_letters() == 0


def test_the_ttl_bounds_a_change_made_by_hand(tmp_path: Path, settings, monkeypatch):
    settings.METRICS_CACHE_SECONDS = 0  # no reuse at all
    run = kill_one(tmp_path, monkeypatch, "poison")
    assert dead_letters() == 1
    JobRun.objects.filter(pk=run.pk).update(state="discarded")  # by hand
    assert dead_letters() == 0


def test_a_lost_generation_never_matches_old_counts(tmp_path: Path, settings, monkeypatch):
    settings.METRICS_CACHE_SECONDS = 3600
    run = kill_one(tmp_path, monkeypatch, "poison")
    assert dead_letters() == 1
    JobRun.objects.filter(pk=run.pk).update(state="discarded")  # by hand…
    queues.connection().delete(dead_letter_counts.GENERATION)  # …and the queue server lost its keys
    assert dead_letters() == 0
