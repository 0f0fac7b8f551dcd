"""Test harness: real redis-server processes, a real database, real git, real RQ workers.

Three Redis masters are started once per session on free loopback ports and flushed
before every test. Git repositories are built in per-test temporary folders, which are
also the only local roots submissions may use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test.signals import setting_changed
from rq import SimpleWorker

from dashboard.infra import queues
from dashboard.observability import counters
from dashboard.repositories import view_counts
from dashboard.web import page_cache
from tests.support import db_pool_slots
from tests.support.channel_layer_reset import reset_channel_layers
from tests.support.checked_threads import unreported
from tests.support.gitrepo import GitRepo
from tests.support.lock_timing import HEALTHY_NODE_TIMEOUT
from tests.support.mirror_writers import processes, redlock, shim, synced  # noqa: F401  (fixtures)
from tests.support.sysproc import OWNER_VARIABLE, processes_of
from workers.runtime.redis_server import RedisNode

#: Every process this test process starts carries its pid (see ``sysproc.processes_of``).
#: Under pytest-xdist each worker sets its own.
os.environ[OWNER_VARIABLE] = str(os.getpid())
#: The processes tests start (``manage.py up``, workers) run no scheduled verification
#: either unless a test sets it (see ``_isolated_paths``).
os.environ.setdefault("GITWARD_VERIFY_INTERVAL", "0")
#: Nor precompute the aggregates after an analysis (tests read them cold unless a test turns it
#: on: tests/dashboard/analytics/test_precomputation.py).
os.environ.setdefault("GITWARD_PRECOMPUTE_AGGREGATES", "false")
#: Mirror affinity off in the worker processes tests start (they inherit this), as in this
#: process (``_isolated_paths``): tests read a chunk's job off its version's shared queue.
#: Affinity itself is tested with it on (tests/dashboard/runs/test_affinity.py,
#: tests/system/test_fetch_hosts.py; docs/scheduling.md#mirror-affinity).
os.environ["GITWARD_AFFINITY_WAIT"] = "0"
#: No reserved interactive slot in a pool unless a test asks for it: the pool tests count
#: their workers. The slot is tested with it on (tests/workers/test_pool.py,
#: tests/system/test_fairness.py; docs/scheduling.md#the-reserved-interactive-slot).
os.environ["GITWARD_INTERACTIVE_WORKERS"] = "0"

#: Started once by multiprocessing for the rest of the session (spawn start method).
LONG_LIVED = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
#: How long a test's processes may take to exit after it ended (a SIGTERMed pool's warm
#: shutdown, a killed process's children getting their death signal).
LEFTOVER_GRACE = 10.0
#: Command lines of the processes alive when a test started: the session- and module-
#: scoped fixtures' (the Redis masters). One of them restarted during a test (a killed
#: master brought back, on its own port) has a new pid but the same command line.
_SHARED: set[str] = set()


def _leftovers(before: set[int], *, shared_too: bool = False) -> dict[int, str]:
    """This session's running processes but ``before`` and the long-lived ones (and,
    unless ``shared_too``, the fixtures' shared servers)."""
    mine = processes_of(str(os.getpid()), os.getpid())
    return {
        pid: cmd
        for pid, cmd in mine.items()
        if pid not in before
        and (shared_too or cmd not in _SHARED)
        and not any(name in cmd for name in LONG_LIVED)
    }


@pytest.fixture(autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """A test that leaves a process running (a worker pool, its workers, a horse, a
    server) fails here, and what it left is SIGKILLed by pid, so one failure cannot leave
    an orphaned pool behind for the rest of the session and beyond.

    Defined first, so it is set up before any other function-scoped fixture and torn
    down after them all: processes of the session- and module-scoped fixtures (the Redis
    masters) were started before the test and are in ``before``, and once restarted
    they are known by their command line (``_SHARED``); those of function fixtures are
    ended by their own teardown before this check. Race: a process may still be exiting
    when the test ends; it gets ``LEFTOVER_GRACE`` to go."""
    running = processes_of(str(os.getpid()), os.getpid())
    before = set(running)
    _SHARED.update(running.values())
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = _leftovers(before)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _leftovers(before)
    if not left:
        return
    for pid in left:  # started by this test (our marker, not there before it): ours to end
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    raise AssertionError(
        f"the test left {len(left)} process(es) running (now SIGKILLed): "
        + "; ".join(f"{pid}: {cmd[:160]}" for pid, cmd in sorted(left.items()))
    )


#: How long the threads a test started may take to hand back their pooled connections
#: after it ended (a daemon's round in flight, an ``on_lost`` hook still publishing).
POOL_SLOT_GRACE = 10.0


@pytest.fixture(autouse=True)
def _no_pool_slot_left_behind() -> Iterator[None]:
    """On PostgreSQL with a pool: a test that ends with more of this process's pooled
    connections taken by other threads than it started with fails here, naming the
    threads it started (``tests/support/db_pool_slots.py``): a thread that queries and never hands
    its connection back would hold a slot of a web process for ever, and over the
    suite the test process's pool ran dry. What asgiref's shared thread kept for the
    test harness (Channels' communicator, Django's ``AsyncClient``) is handed back
    first (still out at the end of the session, it made the test database's teardown
    fail: "being accessed by other users"). Race: a thread the
    test started may still be finishing; it gets ``POOL_SLOT_GRACE`` to give its slot
    back."""
    of = db_pool_slots.pool()
    before = db_pool_slots.taken_by_others(of) if of is not None else 0
    pool_settings = db_pool_slots.pool_settings()
    started = db_pool_slots.StartedThreads()
    started.start()
    try:
        yield
    finally:
        started.stop()
    if db_pool_slots.restore_pool_settings(pool_settings):
        raise AssertionError(
            "the test changed the database's pool settings for the rest of the process "
            "(a worker run in the test process? run it in a process of its own, as "
            "tests/workers/test_pool.py does); they are restored"
        )
    of_now = db_pool_slots.pool()
    if of_now is None:
        return  # SQLite, no pool, or the test closed it (with whatever it lent)
    if of_now is not of:
        before = 0  # opened (again) during the test
    db_pool_slots.hand_back_asgi_thread(grace=POOL_SLOT_GRACE)
    left = db_pool_slots.slots_left(of_now, before=before, grace=POOL_SLOT_GRACE)
    if left:
        raise AssertionError(
            f"the test left {left} pooled database connection(s) taken by other threads "
            f"(each holds a slot of the pool for good; a thread must close its "
            f"connections: dashboard.infra.dbpool.close_thread_connections); " + started.describe()
        )


def _own_node(data_dir: Path) -> RedisNode:
    """A started node that is really ours: under pytest-xdist another worker may take the
    same free port a moment earlier, and PING would then be answered by its server."""
    for _ in range(5):
        node = RedisNode(data_dir).start()
        if node.client().info("server")["process_id"] == node.pid:
            return node
        node.kill()
    raise RuntimeError("no free port for a test Redis node")


class FewIterationsPBKDF2(PBKDF2PasswordHasher):
    """Django's PBKDF2 hasher at 1,000 iterations instead of 1,000,000: a password hashed
    by this process (every fixture's user, every failed login's timing-equaliser hash)
    cost 0.33 s of CPU, and the suite hashes hundreds. The same algorithm name: the
    iterations are written in the hash, so a server process the test starts (``up``,
    with the real hasher) still verifies these passwords. Tests of the hashing itself set
    their own ``PASSWORD_HASHERS`` (tests/dashboard/accounts/test_auth_backend.py);
    docs/testing.md#trimmed-on-2026-12-07."""

    iterations = 1_000


@pytest.fixture(scope="session", autouse=True)
def _cheap_password_hashing() -> None:
    # Set in place, as ``redis_nodes`` sets the Redis URLs (an ``override_settings``
    # held for the session would swap the settings object back at its teardown, under
    # the metrics flusher still reading them); the signal empties Django's hasher cache.
    hashers = [f"{__name__}.FewIterationsPBKDF2"]
    settings.PASSWORD_HASHERS = hashers
    setting_changed.send(sender=None, setting="PASSWORD_HASHERS", value=hashers, enter=True)


@pytest.fixture(scope="session")
def redis_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisNode]]:
    # Session-scoped, so one set per test process: each xdist worker has its own nodes
    # (and its own tmp dirs and SQLite file; pytest-django suffixes database names).
    base = tmp_path_factory.mktemp("redis")
    nodes = [_own_node(base / f"n{i}") for i in range(3)]
    urls = [n.url for n in nodes]
    settings.REDIS_URLS = urls
    settings.REDIS_URL = urls[0]
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [urls[0]]
    yield nodes
    for n in nodes:
        n.kill()


@pytest.fixture(autouse=True)
def _clean_redis(redis_nodes: list[RedisNode]) -> None:
    for node in redis_nodes:
        if not node.alive():
            node.restart()
        node.client().flushall()
    queues.CIRCUIT.reset()  # a node an earlier test killed is back: no fail-fast window


@pytest.fixture(autouse=True)
def _shared_queue_client_keeps_its_timeouts(redis_nodes: list[RedisNode]) -> Iterator[None]:
    """No test may lend the shared queue client (``queues.connection()``) to an RQ worker:
    RQ raises the socket timeout of the connection it is given above its blocking dequeue
    time (415 s), and every later request of the run would then wait that long on a
    stalled queue node. In-process workers take ``queues.worker_connection()``, as
    production workers do."""
    client = queues.connection()
    expected = client.connection_pool.connection_kwargs.get("socket_timeout")
    yield
    got = client.connection_pool.connection_kwargs.get("socket_timeout")
    assert got == expected, (
        f"the shared queue client's socket timeout went from {expected} to {got}: "
        "give in-process RQ workers queues.worker_connection()"
    )


@pytest.fixture(autouse=True)
def _fresh_channel_layers() -> None:
    """Every test receives on a channel layer as if new: channels-redis keeps receive
    state on the (cached) layer that a receive cancelled on an earlier test's event loop
    leaves bound to that loop (``tests/support/channel_layer_reset.py``)."""
    reset_channel_layers()


@pytest.fixture(autouse=True)
def _threads_report_their_failures() -> Iterator[None]:
    """A ``CheckedThread`` that failed and was never joined fails its test here."""
    unreported()  # an earlier test's, already reported or from a thread still running
    yield
    failures = unreported()
    if failures:
        raise AssertionError(
            f"{len(failures)} checked thread(s) failed and were never joined: "
            + ", ".join(f"{name}: {error!r}" for name, error in failures)
        ) from failures[0][1]


@pytest.fixture(autouse=True)
def _no_page_views_pending() -> Iterator[None]:
    """Page views are counted in memory until flushed (``dashboard.repositories.view_counts``): none
    counted by an earlier test may be written under a later test's repository ids."""
    view_counts.discard_pending()
    yield
    view_counts.discard_pending()


@pytest.fixture(autouse=True)
def _isolated_paths(tmp_path: Path, settings: object) -> None:
    settings.WORKSPACE = tmp_path / "workspace"  # type: ignore[attr-defined]
    settings.LOCAL_ROOTS = [tmp_path.resolve()]  # type: ignore[attr-defined]
    settings.RESOLVE_HOSTS = False  # type: ignore[attr-defined]
    settings.RETRY_BACKOFF = [0.0, 0.0]  # type: ignore[attr-defined]  # retries run in the same burst
    # Every test sees the operations snapshot as of now (a test changes state and looks
    # again at once); the cache itself is tested in test_snapshots.py.
    settings.SNAPSHOT_TTL = 0.0  # type: ignore[attr-defined]
    # The scheduled verifier is off unless a test turns it on (its reconciler rounds
    # would add maintenance jobs to every drained queue); docs/analytics.md#verification.
    settings.VERIFY_INTERVAL = 0.0  # type: ignore[attr-defined]
    # Nor is aggregates precomputation (its job after each analysis would compute what the
    # aggregates tests expect their first read to compute); docs/analytics.md#precomputation.
    settings.PRECOMPUTE_AGGREGATES = False  # type: ignore[attr-defined]
    settings.AFFINITY_WAIT = 0.0  # type: ignore[attr-defined]  # see GITWARD_AFFINITY_WAIT above
    settings.INTERACTIVE_WORKERS = 0  # type: ignore[attr-defined]  # as GITWARD_INTERACTIVE_WORKERS
    page_cache.clear()  # pages stored by an earlier test with a TTL of its own


@pytest.fixture
def healthy_masters(settings: object) -> None:
    """The process-wide Redlock (``leases.redlock()``) with the healthy masters' node
    timeout (``tests/support/lock_timing.py``) instead of the 50 ms default: for tests whose
    masters all answer, so that a loaded machine cannot time one out. A test that
    heartbeats a lease within seconds sets ``LOCK_TTL = LEASE_TTL`` itself."""
    settings.LOCK_NODE_TIMEOUT = HEALTHY_NODE_TIMEOUT  # type: ignore[attr-defined]


@pytest.fixture
def git_repo(tmp_path: Path) -> GitRepo:
    repo = GitRepo.create(tmp_path / "origin")
    repo.commit("first commit", {"README.md": "hello\n"})
    repo.commit("add code", {"src/app.py": "print('hi')\n", "README.md": "hello\nworld\n"})
    repo.commit("more code", {"src/lib.js": "let x = 1;\nlet y = 2;\n"})
    return repo


def run_workers() -> int:
    """Drain every gitward queue with a real (in-process) RQ worker; return jobs run."""
    from dashboard.management.commands.worker import worker_queues
    from workers.pool import PauseAware

    class Worker(PauseAware, SimpleWorker):
        pass

    conn = queues.worker_connection()
    worker = Worker([queues.queue(n) for n in worker_queues()], connection=conn)
    worker.apply_pauses()
    worker.work(burst=True, with_scheduler=True, logging_level="WARNING")
    return worker.successful_job_count + worker.failed_job_count


def run_syncs_only() -> None:
    """Drain the sync queue only, each sync leaving every chunk it planned queued
    (``GITWARD_INLINE_CHUNK`` off): for tests about what happens to a planned, not yet
    analysed chunk's own RQ job."""
    from django.test import override_settings

    with override_settings(INLINE_CHUNK=False):
        SimpleWorker([queues.queue(queues.SYNC_QUEUE)], connection=queues.worker_connection()).work(
            burst=True, logging_level="WARNING"
        )


@pytest.fixture
def drain() -> object:
    return run_workers


#: Slow tests defined in modules that do not mark them themselves (`make test-fast` skips
#: every ``slow`` test; `make test` runs them all).
SLOW_TESTS = {"test_redlock_model_under_master_faults"}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if shutil.which("git") is None:  # pragma: no cover
        raise pytest.UsageError("git is required for the test suite")
    for item in items:
        if getattr(item, "originalname", item.name) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow"):
            # Under `--dist loadgroup` (make test) every slow test runs in one xdist
            # worker, one after another, while the other worker takes the fast ones.
            # The largest group goes out first (xdist's --loadscope-reorder, on by
            # default), so the slow group starts at once instead of last.
            item.add_marker(pytest.mark.xdist_group("slow"))
        elif item.get_closest_marker("xdist_group") is None:
            # Every other test runs with the rest of its file, in file order, in one
            # worker (as `--dist loadfile` would): a file is a unit, so a test never
            # runs after a different subset of its own file's tests from one run to
            # the next (docs/testing.md#markers-parallel-runs-and-what-every-test-gets).
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """pytest closes its capture streams after this: the metrics flusher thread, which
    would log a flush failure against nodes already killed, is detached first (its
    "--- Logging error ---" tracebacks ended every run).

    Every fixture is torn down by now: a process of this session still running (a
    fixture's, which no per-test check sees) is reported on stderr and SIGKILLed."""
    counters.stop_flushing()
    if session.config.pluginmanager.getplugin("dsession") is not None:
        return  # the pytest-xdist controller: its children are the workers, still running
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = _leftovers(set(), shared_too=True)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _leftovers(set(), shared_too=True)
    for pid, cmd in sorted(left.items()):
        sys.stderr.write(f"\nleft running at the end of the session (SIGKILLed): {pid}: {cmd}\n")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
