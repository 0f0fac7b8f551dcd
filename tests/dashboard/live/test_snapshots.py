"""dashboard.live.snapshots: what the operations pages and one repository's page show, read
from real Redis masters, queues and the database."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from django.contrib.auth.models import Permission, User
from django.http import HttpResponse
from django.template import Context, Template, TemplateSyntaxError
from django.test import Client, RequestFactory
from django.utils import timezone

from dashboard.infra import events, queues
from dashboard.infra.dbpool import close_thread_connections
from dashboard.infra.events import publish_event
from dashboard.live import snapshots
from dashboard.live.snapshots import ops_snapshot, repository_live, user_can, why_waiting
from dashboard.locks import leases
from dashboard.middleware import EventActorMiddleware
from dashboard.models import Chunk, JobAttempt, JobRun, Repository
from dashboard.repositories.lifecycle import current_fingerprint, submit_repository
from dashboard.web.charts import sparklines
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from workers.locks import LockNotOwned, keys

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_operations_snapshot_has_every_section() -> None:
    repo = Repository.objects.create(url="https://example.com/t/x.git")
    for i in range(2):
        JobRun.objects.create(
            job_id=f"d{i}",
            kind="sync",
            queue="sync",
            repository=repo,
            state="dead",
            cause_key="k",
            finished_at=timezone.now(),
        )
    snap = ops_snapshot()
    assert snap["quorum"]["state"] == "ok" and len(snap["redis_nodes"]) == 3
    assert [q["name"] for q in snap["queues"]] == queues.queue_names()
    assert snap["dlq"]["dead"] == 2 and snap["dlq"]["group_count"] == 1
    assert snap["dlq"]["groups"][0]["count"] == 2
    assert snap["can"] == {}  # no user given
    # The totals-only form skips the grouping but counts the same.
    slim = ops_snapshot(dlq_groups=False)["dlq"]
    assert slim == {"groups": None, "dead": 2, "group_count": 1}


def test_operator_buttons_need_staff_and_the_explicit_permission() -> None:
    staff = User.objects.create_user("s", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))
    plain = User.objects.create_user("p")
    plain.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))
    assert user_can(User.objects.get(pk=staff.pk)) == {
        "retry": True,
        "discard": False,
        "force_release": False,
        "pause": False,
    }
    assert not any(user_can(User.objects.get(pk=plain.pk)).values())


def test_a_repository_shows_its_holders_and_why_the_rest_waits(git_repo: GitRepo) -> None:
    repo, _ = submit_repository(url=str(git_repo.path))
    assert why_waiting(repo) == ["sync: queued, position 1"]
    chunk = Chunk.objects.create(
        repository=repo,
        fingerprint=current_fingerprint(),
        key="abcd1234",
        shas="abcd1234",
        size=1,
        position=1,
    )
    run = JobRun.objects.create(
        job_id="an-1",
        kind="analyze",
        queue="q",
        repository=repo,
        chunk=chunk,
        fingerprint=chunk.fingerprint,
        attempts=1,
    )
    JobAttempt.objects.create(run=run, number=1, outcome=JobAttempt.Outcome.DEFERRED)
    leases.redlock().acquire([chunk.lock_key()], ttl=30.0, holder={"worker": "w", "job": "other"})
    live = repository_live(repo.pk)
    assert [h["key"] for h in live["holders"]] == [chunk.lock_key()]
    assert live["holders"][0]["what"] == "commit abcd1234"
    blocked = [w for w in live["waiting"] if w.startswith("chunk 1/1")]
    assert blocked and "lock held by job other" in blocked[0]
    assert live["status"] == "queued" and live["id"] == repo.pk


# ---------------------------------------------------------------- the shared snapshot cache


def _dead_letter(repo: Repository, n: int) -> None:
    JobRun.objects.create(job_id=f"c{n}", kind="sync", queue="sync", repository=repo,
                          state="dead", cause_key="k", finished_at=timezone.now())  # fmt: skip


def test_the_shared_part_is_built_once_per_ttl_and_the_buttons_per_user(settings) -> None:
    settings.SNAPSHOT_TTL = 3600.0  # nothing expires during the test
    repo = Repository.objects.create(url="https://example.com/t/c.git")
    _dead_letter(repo, 1)
    staff = User.objects.create_user("s", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="retry_jobrun"))
    plain = User.objects.create_user("p")
    # not_before: a fresh copy, not one an earlier test left in this process.
    first = ops_snapshot(user=staff, dlq_groups=False, not_before=time.monotonic())
    _dead_letter(repo, 2)  # a change made elsewhere (no event published here)
    second = ops_snapshot(user=plain, dlq_groups=False)
    assert second["at"] == first["at"] and second["dlq"]["dead"] == 1  # the shared copy
    # ... but each user's own buttons, never the other's.
    assert first["can"]["retry"] is True and second["can"]["retry"] is False
    # A socket that joined (or received an event) after the copy was built gets a
    # newer one; so does everyone after the TTL.
    newer = ops_snapshot(user=plain, dlq_groups=False, not_before=time.monotonic())
    assert newer["dlq"]["dead"] == 2 and newer["at"] > first["at"]
    settings.SNAPSHOT_TTL = 0.0
    assert ops_snapshot(dlq_groups=False)["at"] > newer["at"]


def test_an_event_published_by_this_process_drops_the_copy(settings) -> None:
    settings.SNAPSHOT_TTL = 3600.0
    repo = Repository.objects.create(url="https://example.com/t/d.git")
    before = ops_snapshot(dlq_groups=False, not_before=time.monotonic())
    _dead_letter(repo, 3)
    assert ops_snapshot(dlq_groups=False)["dlq"]["dead"] == before["dlq"]["dead"]
    publish_event("dlq.changed", {})  # outside a transaction: sent at once
    assert ops_snapshot(dlq_groups=False)["dlq"]["dead"] == before["dlq"]["dead"] + 1


def _forget_this_process_copy() -> None:
    """What another web process of this host looks like to ``shared_snapshot``: the
    same queue server and database, no copy of its own (the module's only state)."""
    snapshots._SHARED.clear()


def test_another_process_of_the_host_reads_the_stored_copy_instead_of_building(
    settings, django_assert_num_queries
) -> None:
    settings.SNAPSHOT_TTL = 3600.0
    repo = Repository.objects.create(url="https://example.com/t/e.git")
    first = ops_snapshot(dlq_groups=False, not_before=time.monotonic())
    assert queues.connection().pttl(snapshots._host_key(False)) > 0  # stored, expiring
    _dead_letter(repo, 4)  # changed elsewhere, no event here
    _forget_this_process_copy()
    with django_assert_num_queries(0):  # no build: one GET of the stored copy
        second = ops_snapshot(dlq_groups=False)
    assert second["at"] == first["at"] and second["dlq"] == first["dlq"]
    # The per-process parts are this process's, not the builder's.
    assert second["live_events_dropped"] == events.dropped_events()
    # One that needs a copy newer than the stored one (a socket that just joined)
    # builds, and stores its build for the others.
    _forget_this_process_copy()
    newer = ops_snapshot(dlq_groups=False, not_before=time.monotonic())
    assert newer["dlq"]["dead"] == first["dlq"]["dead"] + 1
    _forget_this_process_copy()
    assert ops_snapshot(dlq_groups=False)["at"] == newer["at"]


def test_an_event_published_here_is_never_undone_by_an_older_stored_copy(settings) -> None:
    settings.SNAPSHOT_TTL = 3600.0
    repo = Repository.objects.create(url="https://example.com/t/f.git")
    before = ops_snapshot(dlq_groups=False, not_before=time.monotonic())
    _dead_letter(repo, 5)
    publish_event("dlq.changed", {})
    _forget_this_process_copy()  # only the stored copy (older than the event) is left
    after = ops_snapshot(dlq_groups=False)
    assert after["dlq"]["dead"] == before["dlq"]["dead"] + 1 and after["at"] > before["at"]


def test_a_shared_page_part_is_reused_for_the_ttl_and_dropped_by_an_event_here(settings) -> None:
    built: list[int] = []

    def build() -> int:
        built.append(1)
        return len(built)

    settings.SNAPSHOT_TTL = 0.0  # off: built every time
    assert [snapshots.shared_part("t.off", build) for _ in range(2)] == [1, 2]
    settings.SNAPSHOT_TTL = 3600.0
    assert snapshots.shared_part("t.on", build) == 3
    assert snapshots.shared_part("t.on", build) == 3  # reused, same for every viewer
    assert snapshots.shared_part("t.other", build) == 4  # one entry per name
    publish_event("dlq.changed", {})  # an operator's action served by this process
    assert snapshots.shared_part("t.on", build) == 5
    # A live region's refetch builds anew (an event of another process dropped nothing
    # here), and the others get that build.
    assert snapshots.shared_part("t.on", build, fresh=True) == 6
    assert snapshots.shared_part("t.on", build) == 6
    settings.SNAPSHOT_TTL = 1e-9  # everything older than that has expired
    assert snapshots.shared_part("t.on", build) == 7


def _fragment(client: Client, path: str, start: str, end: str) -> str:
    """The part of the page at ``path`` from ``start`` up to the first ``end`` after it."""
    res = client.get(path)
    assert res.status_code == 200
    body = res.content.decode()
    return body[body.index(start) :].split(end, 1)[0]


def _locks_page(client: Client) -> str:
    return _fragment(client, "/locks/", '<table class="grid" id="locks-table"', "</table>")


def test_a_fragment_of_one_copy_is_rendered_once_and_each_viewer_keeps_their_buttons(
    settings, client: Client
) -> None:
    """``{% shared %}`` (``snapshots.shared_render``): the locks table of one snapshot
    copy is rendered once and reused by every page showing that copy — a change to the
    copy's rows (which nothing may make: copies are read-only) does not show, which is
    how the test sees the reuse — while a viewer with other permissions gets the table
    with their own buttons, and a new copy its own rows. With no TTL it is rendered
    every time."""
    settings.SNAPSHOT_TTL = 3600.0
    repo = Repository.objects.create(url="https://example.com/t/frag.git")
    lock = leases.redlock().acquire(keys.mirror(repo.pk), ttl=60, holder={"job": "j-frag"})
    try:
        ops = User.objects.create_superuser("ops-frag", password="pw-frag-123456")
        plain = User.objects.create_user("plain-frag", is_staff=True)
        plain.user_permissions.add(Permission.objects.get(codename="view_jobrun"))
        client.force_login(ops)
        fresh = ops_snapshot(dlq_groups=False, not_before=time.monotonic())  # a new copy
        first = _locks_page(client)
        assert "j-frag" in first and 'data-can-release="1"' in first
        fresh["locks"][0]["job"] = "j-changed"  # the copy's own row, changed in place
        assert _locks_page(client) == first  # the rendered fragment, reused
        client.force_login(plain)
        theirs = _locks_page(client)
        assert 'data-can-release=""' in theirs and "j-changed" in theirs  # rendered anew
        client.force_login(ops)
        lock.release()
        ops_snapshot(dlq_groups=False, not_before=time.monotonic())  # the next copy
        assert "No locks held." in _locks_page(client)
        settings.SNAPSHOT_TTL = 0.0
        assert "No locks held." in _locks_page(client)
    finally:
        with contextlib.suppress(LockNotOwned):  # released above unless a step failed
            lock.release()


def test_a_fragment_with_an_input_missing_is_rendered_every_time(settings) -> None:
    settings.SNAPSHOT_TTL = 3600.0
    loop = "{% for r in rows %}{{ r }}{% endfor %}"
    page = Template("{% shared rows missing %}" + loop + "{% endshared %}")
    rows = ["a"]
    assert page.render(Context({"rows": rows})) == "a"
    rows.append("b")
    assert page.render(Context({"rows": rows})) == "ab"  # nothing to key on: not kept
    keyed = Template("{% shared rows %}" + loop + "{% endshared %}")
    assert keyed.render(Context({"rows": rows})) == "ab"
    rows.append("c")
    assert keyed.render(Context({"rows": rows})) == "ab"  # same object: kept
    assert keyed.render(Context({"rows": list(rows)})) == "abc"  # another object: anew
    with pytest.raises(TemplateSyntaxError):
        Template("{% shared %}x{% endshared %}")


def test_the_sparklines_of_one_series_are_computed_once() -> None:
    series = {"throughput": [1, 2, 3], "backlog": [5, None, 7], "minutes": []}
    first = sparklines(series)
    assert sparklines(series) is first
    again = sparklines(dict(series))
    assert again is not first and again == first


# ------------------------------------------------- the repository page's locks from the copy


def _scans() -> int:
    """SCAN calls the lock masters have served so far (``INFO commandstats``)."""
    return sum(
        node.client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)
        for node in leases.redlock().nodes
    )


def _holders(client: Client, repo: Repository) -> str:
    return _fragment(client, f"/repos/{repo.pk}/", '<ul id="repo-holders">', "</ul>")


def test_the_repository_page_takes_its_locks_from_a_fresh_copy_without_scanning(
    settings, client: Client
) -> None:
    """With a snapshot copy of this process fresh enough for a page, the repository page
    shows that copy's rows of its own repository (the same keys and holders a direct
    reading gives) and asks no master for a SCAN; an event published here, no TTL, or
    the repository socket's reading (``shared=False``) read the masters again."""
    settings.SNAPSHOT_TTL = 3600.0
    repo = Repository.objects.create(url="https://example.com/t/rl-mine.git")
    other = Repository.objects.create(url="https://example.com/t/rl-other.git")
    redlock = leases.redlock()
    mine = redlock.acquire(keys.mirror(repo.pk), ttl=60, holder={"worker": "w1", "job": "j-mine"})
    theirs = redlock.acquire(
        keys.mirror(other.pk), ttl=60, holder={"worker": "w2", "job": "j-theirs"}
    )
    try:
        client.force_login(User.objects.create_user("viewer-rl", password="pw-rl-123456"))
        ops_snapshot(dlq_groups=False, not_before=time.monotonic())  # a fresh copy here
        scans = _scans()
        shown = _holders(client, repo)
        assert _scans() == scans  # not one SCAN on any master
        assert keys.mirror(repo.pk) in shown and "j-mine" in shown
        assert "j-theirs" not in shown and keys.mirror(other.pk) not in shown
        direct = leases.lock_rows(repo_id=repo.pk)
        copied = snapshots.repository_locks(repo.pk, shared=True)
        assert [(r["key"], r["job"], r["worker"]) for r in copied] == [
            (r["key"], r["job"], r["worker"]) for r in direct
        ]
        # The socket's first reading is always the masters' own.
        scans = _scans()
        assert [h["key"] for h in repository_live(repo.pk)["holders"]] == [keys.mirror(repo.pk)]
        assert _scans() > scans
        # An event this process published: the copy may predate it, so the masters again.
        publish_event("dlq.changed", {})
        scans = _scans()
        assert "j-mine" in _holders(client, repo)
        assert _scans() > scans
        settings.SNAPSHOT_TTL = 0.0
        scans = _scans()
        assert "j-mine" in _holders(client, repo)
        assert _scans() > scans
    finally:
        mine.release()
        theirs.release()


def _forget_own_events() -> None:
    """The copies below are backdated by hours; events earlier tests published (minutes
    ago, by nobody in particular) would be newer than them."""
    with events.OWN_EVENTS.lock:
        events.OWN_EVENTS.by_user.clear()
        events.OWN_EVENTS.anyone = 0.0


def _in_thread(**kwargs: object) -> tuple[threading.Thread, list[dict]]:
    """``ops_snapshot(dlq_groups=False, **kwargs)`` on a thread of its own (as a request
    has), which hands its database connections back when done."""
    got: list[dict] = []

    def run() -> None:
        try:
            got.append(ops_snapshot(dlq_groups=False, **kwargs))  # type: ignore[arg-type]
        finally:
            close_thread_connections()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def test_while_a_copy_is_being_built_pages_take_the_current_one_up_to_twice_the_ttl(
    settings,
) -> None:
    """Pages do not queue behind a build in progress when this process's copy is at
    most twice the TTL old; sockets (``not_before``), a copy older than that, or one
    that may predate an event published here still wait for the build."""
    settings.SNAPSHOT_TTL = 3600.0
    ttl = settings.SNAPSHOT_TTL
    repo = Repository.objects.create(url="https://example.com/t/stale.git")
    first = ops_snapshot(dlq_groups=False, not_before=time.monotonic())
    started, count, data = snapshots._SHARED[False]
    _dead_letter(repo, 9)  # changed elsewhere: a build would show it
    builder = snapshots._SHARED_LOCKS[False]
    _forget_own_events()  # earlier tests' events are not this copy's concern

    def aged(by: float) -> None:  # the copy as if built ``by`` seconds earlier
        snapshots._SHARED[False] = (started - by, count, data)
        queues.connection().delete(snapshots._host_key(False))  # no fresher stored copy

    aged(1.5 * ttl)  # expired, within twice the TTL
    with builder:  # another thread is building
        page, got = _in_thread()
        page.join(timeout=30)
        assert not page.is_alive() and got[0]["at"] == first["at"]  # served, not waiting
        socket_ask, socket_got = _in_thread(not_before=time.monotonic())
        socket_ask.join(timeout=0.5)
        assert socket_ask.is_alive()  # a socket waits for the build
    socket_ask.join(timeout=30)
    assert socket_got[0]["dlq"]["dead"] == first["dlq"]["dead"] + 1
    started, count, data = snapshots._SHARED[False]
    for setup in ("too old", "an event here"):
        if setup == "too old":
            aged(2.5 * ttl)
        else:
            aged(1.5 * ttl)
            publish_event("dlq.changed", {})
        with builder:
            page, got = _in_thread()
            page.join(timeout=0.5)
            assert page.is_alive(), setup  # waits for the build
        page.join(timeout=30)
        assert got and got[0]["at"] > data["at"], setup


def test_while_a_copy_is_built_another_users_action_does_not_make_a_page_wait(settings) -> None:
    """``live.OWN_EVENTS``: an event published while serving user A's request makes A's
    next page wait for a copy built after it, but not user B's; an event of nobody in
    particular (a background thread) makes every page wait."""
    settings.SNAPSHOT_TTL = 3600.0
    ttl = settings.SNAPSHOT_TTL
    a = User.objects.create_user("own-a")
    b = User.objects.create_user("own-b")
    ops_snapshot(dlq_groups=False, not_before=time.monotonic())
    started, count, data = snapshots._SHARED[False]
    _forget_own_events()

    def aged() -> None:
        snapshots._SHARED[False] = (started - 1.5 * ttl, count, data)
        queues.connection().delete(snapshots._host_key(False))

    def waits(user: User) -> bool:
        got: list[dict] = []

        def run() -> None:
            try:
                got.append(ops_snapshot(user=user, dlq_groups=False))
            finally:
                close_thread_connections()

        thread = threading.Thread(target=run)
        with snapshots._SHARED_LOCKS[False]:  # another thread is building
            thread.start()
            thread.join(timeout=0.5)
            waited = thread.is_alive()
        thread.join(timeout=30)
        assert got
        return waited

    request = RequestFactory().post("/")
    request.user = a
    aged()
    middleware = EventActorMiddleware(lambda r: publish_event("dlq.changed", {}) or HttpResponse())
    middleware(request)  # A's action, served here
    assert events.OWN_EVENTS.by_user[a.pk] >= started
    aged()
    assert not waits(b)  # someone else's action: B's page takes the current copy
    aged()
    assert waits(a)  # A's own: A waits for a copy built after it
    aged()
    publish_event("dlq.changed", {})  # outside any request: nobody in particular
    aged()
    assert waits(b)
    assert "dashboard.middleware.EventActorMiddleware" in settings.MIDDLEWARE
    order = settings.MIDDLEWARE
    assert order.index("dashboard.middleware.EventActorMiddleware") > order.index(
        "django.contrib.auth.middleware.AuthenticationMiddleware"
    )


def _mismatch(repo: Repository, sha: str) -> object:
    """One verifier pass of ``repo`` finding ``sha``'s stored row wrong, recorded through
    ``record_result`` as a pass records it (docs/analytics.md#verification)."""
    from dashboard.analytics.integrity import record_result
    from dashboard.models import Verification

    row, _ = Verification.objects.get_or_create(repository=repo, fingerprint=current_fingerprint())
    result = {
        "head": sha,
        "sampled": 10,
        "mismatches": [{"sha": sha, "git": 3, "stored": 4,
                        "fields": [{"path": "f.py", "field": "added", "git": 3, "stored": 4}]}],
        "totals": {"stored": {"commits": 10}, "git": None},
    }  # fmt: skip
    return record_result(row, result, generation=repo.generation, next_at=None)


def test_the_snapshot_carries_the_integrity_marks_and_the_git_hosts(settings) -> None:
    """The two sections that were rendered per request only: the integrity group's marks
    (what the Dead letters page compares, ``[id, checked_at]`` newest first, as the page
    lists them) and the Git hosts table's rows, in every variant of the snapshot."""
    from dashboard.analytics.integrity import clear_mismatch, mismatch_marks_of, open_mismatches
    from dashboard.runs.fetch_limits import fetch_gate
    from workers.git import HostLimit

    settings.SNAPSHOT_TTL = 0
    settings.FETCH_LIMITS = {"git.example.com": HostLimit(concurrency=3)}
    first = Repository.objects.create(url="https://example.com/t/a.git")
    second = Repository.objects.create(url="https://example.com/t/b.git")
    empty = snapshots.build_shared_snapshot(dlq_groups=True)
    assert empty["integrity_marks"] == [] and empty["fetch_hosts"] == []
    a = _mismatch(first, "a" * 40)
    b = _mismatch(second, "b" * 40)
    with fetch_gate().slot("git.example.com"):
        for groups in (True, False):
            snap = snapshots.build_shared_snapshot(dlq_groups=groups)
            marks = snap["integrity_marks"]
            assert [m[0] for m in marks] == [b.pk, a.pk]  # newest first
            assert marks == mismatch_marks_of(open_mismatches(limit=50))  # the page's
            assert [(h["host"], h["in_use"], h["limit"]) for h in snap["fetch_hosts"]] == [
                ("git.example.com", 1, 3)
            ]
    assert json_safe(snap)
    # A new pass of an open mismatch moves its mark; a clear drops it.
    again = _mismatch(first, "c" * 40)
    marks = snapshots.build_shared_snapshot(dlq_groups=False)["integrity_marks"]
    assert [m[0] for m in marks] == [a.pk, b.pk] and marks[0][1] == again.checked_at.isoformat()
    assert clear_mismatch(b.pk, user="tester")
    assert [m[0] for m in snapshots.build_shared_snapshot(dlq_groups=False)["integrity_marks"]] == [
        a.pk
    ]
    [host] = snapshots.build_shared_snapshot(dlq_groups=False)["fetch_hosts"]
    assert host["in_use"] == 0


def json_safe(value: object) -> bool:
    import json

    return bool(json.dumps(value))


def test_the_results_marks_move_when_new_results_land(git_repo: GitRepo) -> None:
    """An analytics page's marks (``results_marks``) are the socket's: equal while nothing
    changed, different once a push is analysed and once a verification pass records."""
    git_repo.commit("one", {"f.py": "1\n"})
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    before = repository_live(repo.pk, marks=True)["results_marks"]
    assert before == repository_live(repo.pk, marks=True)["results_marks"]
    assert "results_marks" not in repository_live(repo.pk)  # the repository page's
    git_repo.commit("two", {"g.py": "2\n"})
    submit_repository(url=str(git_repo.path))
    run_workers()
    pushed = repository_live(repo.pk, marks=True)["results_marks"]
    assert pushed != before
    repo.refresh_from_db()
    _mismatch(repo, git_repo.shas()[0])
    assert repository_live(repo.pk, marks=True)["results_marks"] != pushed
