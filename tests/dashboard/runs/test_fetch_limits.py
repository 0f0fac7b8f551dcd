"""dashboard.runs.fetch_limits: the deployment's fetch gate, each host's status and the
reason provider, against a real Redis queue server (docs/scheduling.md#per-host-fetch-limits)."""

from __future__ import annotations

import pytest

from dashboard.infra import queues
from dashboard.models import Repository
from dashboard.runs import fetch_limits
from workers.git import HostLimit, back_off

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://GitHub.com/a/b.git", "github.com"),
        ("http://127.0.0.2:8080/r.git", "127.0.0.2"),
        ("git@gitlab.com:a/b.git", "gitlab.com"),
        ("/srv/git/r", None),
        ("file:///srv/git/r", None),
    ],
)
def test_host_of(url: str, host: str | None) -> None:
    assert fetch_limits.host_of(url) == host


def test_the_reason_provider_names_a_full_host_and_a_backoff(settings: object) -> None:
    settings.FETCH_LIMITS = {"github.com": HostLimit(concurrency=1)}  # type: ignore[attr-defined]
    repo = Repository.objects.create(url="https://github.com/team/tool")
    local = Repository.objects.create(url="/srv/git/tool")
    assert fetch_limits.fetch_wait_reason(repo) is None
    with fetch_limits.fetch_gate().slot("github.com"):
        assert fetch_limits.fetch_wait_reason(repo) == "host limit github.com 1/1"
        [status] = fetch_limits.host_statuses()
        assert (status.host, status.in_use, status.limit.concurrency) == ("github.com", 1, 1)
    assert fetch_limits.fetch_wait_reason(local) is None
    back_off(queues.connection(), "github.com", 30)
    reason = fetch_limits.fetch_wait_reason(repo)
    assert reason is not None and reason.startswith("host github.com backing off until ")


def test_the_gate_publishes_fetch_changed_and_the_rows_follow(settings: object) -> None:
    """The deployment's gate tells the operators' live view (``fetch.changed``, a tick:
    not in the activity feed) whenever a slot is taken or let go, and the Git hosts
    table's rows (in the operations snapshot) show the change: cap, in use, tokens,
    backoff (docs/live-view.md)."""
    from dashboard.infra import activity_feed
    from tests.support.live_tap import Tap

    settings.FETCH_LIMITS = {  # type: ignore[attr-defined]
        "github.com": HostLimit(concurrency=2, rate=0.001, burst=5)
    }
    tap = Tap()
    with fetch_limits.fetch_gate().slot("github.com"):
        [row] = fetch_limits.fetch_host_rows() or []
        assert (row["host"], row["in_use"], row["limit"], row["waiting"]) == ("github.com", 1, 2, 0)
        assert row["rate"] == 0.001 and row["burst"] == 5 and 4.0 <= row["tokens"] < 4.1
        assert row["backoff_until"] is None and row["backoff_text"] is None
        tap.until(lambda evs: [e["type"] for e in evs].count("fetch.changed") >= 1)
    tap.until(lambda evs: [e["type"] for e in evs].count("fetch.changed") >= 2)
    assert {e["host"] for e in tap.events if e["type"] == "fetch.changed"} == {"github.com"}
    assert not activity_feed.is_activity({"type": "fetch.changed", "host": "github.com"})
    [row] = fetch_limits.fetch_host_rows() or []
    assert row["in_use"] == 0
    until = back_off(queues.connection(), "github.com", 30)
    [row] = fetch_limits.fetch_host_rows() or []
    assert row["backoff_until"] == until and row["backoff_text"] and "backoff until" in row["text"]
