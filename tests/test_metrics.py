"""dashboard.metrics: the Prometheus text is exact for what the system holds (real
queues, locks on three masters, rows in the database)."""

from __future__ import annotations

import pytest

from dashboard import leases, queues
from dashboard.metrics import metrics_text
from dashboard.models import JobRun, Repository
from workers import lockkeys

pytestmark = pytest.mark.django_db(transaction=True)


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_every_gauge_reports_what_is_there() -> None:
    repo = Repository.objects.create(url="https://example.com/t/x.git", status="ready")
    JobRun.objects.create(job_id="a", kind="sync", queue="sync", repository=repo, state="dead")
    queues.queue(queues.SYNC_QUEUE).enqueue("workers.jobs.sync_repository", 1, 1, job_id="j")
    queues.set_paused(queues.MAINTENANCE_QUEUE, True)
    leases.redlock().acquire([lockkeys.mirror(repo.pk)], ttl=30.0, holder={"worker": "w"})
    text = metrics_text()
    got = samples(text)
    assert "# TYPE gitward_attempts_total counter" in text
    assert got['gitward_queue_backlog{queue="sync"}'] == 1
    assert got['gitward_queue_paused{queue="maintenance"}'] == 1
    assert got['gitward_queue_paused{queue="sync"}'] == 0
    assert got['gitward_runs{state="dead"}'] == 1 and got['gitward_runs{state="queued"}'] == 0
    assert got['gitward_repositories{status="ready"}'] == 1
    assert got["gitward_redis_masters_up"] == 3 and got["gitward_redis_masters"] == 3
    assert got["gitward_locks_held"] == 1
