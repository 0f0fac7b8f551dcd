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
