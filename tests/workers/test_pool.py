"""workers.pool: which workers the pool wants (a worker per staffed version, the driver
queue), and the supervision of real child processes: started per spec, restarted when
they die, retired (SIGTERM, then SIGKILL after the grace) when no longer wanted, all
stopped on shutdown; a worker's queues follow pauses and closed gates; a worker refuses
a version it did not load.

The children here are stand-ins for ``manage.py worker`` (the pool runs whatever
``manage_py`` it is given): a real Python process that records its arguments and obeys
or ignores SIGTERM, so supervision is tested in seconds. The pool with real RQ worker
children following a rollout: tests/workers/test_rollout_pool.py (slow). The ``manage.py
worker`` pool under SIGTERM: ``test_the_worker_command_stops_its_pool_on_sigterm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rq import SimpleWorker

from dashboard.infra import queues
from dashboard.models import AnalyzerVersion
from dashboard.rollouts.start import DRIVER_QUEUE
from dashboard.versions.state_machine import ensure_baseline
from tests.support.mirror_writers import wait_for
from tests.support.processes import worker_env
from tests.support.sysproc import proc_state
from workers import pool as pool_module
from workers.analysis.analyzer import CODE_VERSION, DEFAULT, AnalyzerConfig, queue_name
from workers.jobs import loaded_fingerprints
from workers.pool import PauseAware, Pool, desired_workers, run_one_worker, version_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State

STAND_IN = """
import json, os, signal, sys, time
out = os.path.join(os.environ["STAND_IN_DIR"], f"{os.getpid()}.json")
if os.environ.get("STAND_IN_IGNORE_TERM"):  # ignored, but counted
    signal.signal(signal.SIGTERM, lambda *a: open(out + ".terms", "a").write("TERM\\n"))
else:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
with open(out + ".tmp", "w") as f:
    json.dump(sys.argv[1:], f)
os.rename(out + ".tmp", out)  # written whole: the handler is installed by now
while True:
    time.sleep(60)
"""


def version(
    fp: str, state: str, *, queue: str = "analysis", code: str = CODE_VERSION
) -> AnalyzerVersion:
    extra: dict[str, Any] = {"verified_at": timezone.now()} if state in {"verified"} else {}
    return AnalyzerVersion.objects.create(
        fingerprint=fp * 64, code_version=code, state=state, queue=queue, **extra
    )


class Children:
    """Stand-in children a pool starts, seen through the files they write."""

    def __init__(self, tmp_path: Path, *, ignore_term: bool = False) -> None:
        self.dir = tmp_path / "children"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.script = tmp_path / "stand_in.py"
        self.script.write_text(STAND_IN)
        self.env = {**os.environ, "STAND_IN_DIR": str(self.dir)}
        if ignore_term:
            self.env["STAND_IN_IGNORE_TERM"] = "1"
        self.pools: list[Pool] = []

    def pool(self, size: int, **kw: Any) -> Pool:
        pool = Pool(size, manage_py=self.script, env=self.env, **kw)
        self.pools.append(pool)
        return pool

    def ready(self, pool: Pool) -> dict[int, list[str]]:
        """pid → argv of every live child, once each has installed its handler."""
        live = [c for _, c in pool.children if c.poll() is None]
        for child in live:
            wait_for(f"child {child.pid}", (self.dir / f"{child.pid}.json").exists)
        return {c.pid: json.loads((self.dir / f"{c.pid}.json").read_text()) for c in live}

    def kill_all(self) -> None:
        for pool in self.pools:
            for child in [c for _, c in pool.children] + [c for c, _ in pool.retiring]:
                if child.poll() is None:
                    child.kill()
                child.wait(timeout=10)


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    made = Children(tmp_path)
    yield made
    made.kill_all()


def replan(pool: Pool) -> None:
    pool._next_plan = 0.0  # the next check re-reads the versions table now
    pool.check()


def test_with_no_versions_the_pool_wants_the_default_shared_workers_and_the_driver() -> None:
    fp = DEFAULT.fingerprint()
    assert desired_workers(2) == [
        ("--analyzer", fp, "--shared"),
        ("--analyzer", fp, "--shared"),
        ("--queues", DRIVER_QUEUE),
    ]


def test_the_reserved_interactive_slot_is_configurable_and_absent_from_an_empty_pool(
    settings,
) -> None:
    """docs/scheduling.md#the-reserved-interactive-slot: ``GITWARD_INTERACTIVE_WORKERS``
    express workers of the served version on top of ``size``; none when ``size`` is 0.
    (The test harness turns the slot off: tests/conftest.py.)"""
    fp = DEFAULT.fingerprint()
    settings.INTERACTIVE_WORKERS = 2
    assert desired_workers(1) == [
        ("--analyzer", fp, "--shared"),
        *[("--analyzer", fp, "--shared", "--express")] * 2,
        ("--queues", DRIVER_QUEUE),
    ]
    assert desired_workers(0) == [("--queues", DRIVER_QUEUE)]
    version("o", S.CURRENT, code=OTHER_CODE)  # blue/green: no shared work, no slot either
    assert desired_workers(1) == [("--queues", DRIVER_QUEUE)]


def test_the_current_version_gets_size_workers_and_every_other_staffed_version_one() -> None:
    current = version("c", S.CURRENT)
    staffed = [version(fp, st) for fp, st in (("w", S.WARMING), ("v", S.VERIFIED),
                                                ("d", S.DRAINING))]  # fmt: skip
    for fp, st in (("r", S.REGISTERED), ("x", S.DRAINED), ("t", S.RETIRED), ("f", S.WARM_FAILED)):
        version(fp, st)  # not staffed
    version("o", S.WARMING, queue="other")  # another logical queue: not this pool's
    assert desired_workers(3) == [
        *[("--analyzer", current.fingerprint, "--shared")] * 3,
        *[("--analyzer", v.fingerprint) for v in staffed],
        ("--queues", DRIVER_QUEUE),
    ]


OTHER_CODE = "0.0.9+000000000000"


def test_the_pool_never_staffs_a_version_of_another_code() -> None:
    """Blue/green (docs/rollouts.md#code-rollouts-bluegreen): the old code is current and
    this pool runs new code; it starts no shared worker and no worker for the old code's
    versions, and puts its workers on its own version being rolled out."""
    version("c", S.CURRENT, code=OTHER_CODE)
    version("d", S.DRAINING, code=OTHER_CODE)
    assert desired_workers(3) == [("--queues", DRIVER_QUEUE)]  # nothing of its code staffed
    registered = version("n", S.REGISTERED)
    assert desired_workers(3) == [("--queues", DRIVER_QUEUE)]  # learned, not yet warming
    AnalyzerVersion.objects.filter(pk=registered.pk).update(state=S.WARMING)
    assert desired_workers(3) == [
        *[("--analyzer", registered.fingerprint)] * 3,
        ("--queues", DRIVER_QUEUE),
    ]
    mine_draining = version("m", S.DRAINING)  # an earlier attempt of this code, draining
    AnalyzerVersion.objects.filter(pk=registered.pk).update(state=S.RAMPING, ramp_percent=10,
                                                            verified_at=timezone.now())  # fmt: skip
    assert desired_workers(2) == [
        *[("--analyzer", registered.fingerprint)] * 2,
        ("--analyzer", mine_draining.fingerprint),
        ("--queues", DRIVER_QUEUE),
    ]


def test_once_its_code_is_current_the_pool_runs_the_shared_workers_again() -> None:
    """After the promotion of the new code, the old code's pool keeps one worker for its
    draining version (its gate closed) and the new code's pool serves everything."""
    old = version("o", S.DRAINING, code=OTHER_CODE)
    new = version("n", S.CURRENT)
    assert desired_workers(2) == [
        *[("--analyzer", new.fingerprint, "--shared")] * 2,
        ("--queues", DRIVER_QUEUE),
    ]
    assert ("--analyzer", old.fingerprint) not in desired_workers(2)


def test_a_pool_that_starts_reports_its_code_and_learns_it(children: Children) -> None:
    version("c", S.CURRENT, code=OTHER_CODE)
    pool = children.pool(2, grace=10)
    pool.start()
    learned = AnalyzerVersion.objects.get(code_version=CODE_VERSION)
    assert learned.state == S.REGISTERED
    assert learned.fingerprint == AnalyzerConfig.from_mapping({}).fingerprint()
    assert sorted(children.ready(pool).values()) == [
        ["worker", "--workers", "1", "--queues", DRIVER_QUEUE]
    ]


def test_on_a_fresh_queue_the_first_pool_adopts_its_code_as_the_baseline(
    children: Children,
) -> None:
    """The first fleet's code serves; a second code started later is learned beside it
    and gets no shared worker (not both fleets' defaults served at once)."""
    pool = children.pool(2, grace=10)
    pool.start()
    (base,) = AnalyzerVersion.objects.all()
    assert (base.state, base.code_version) == (S.CURRENT, CODE_VERSION)
    assert base.fingerprint == DEFAULT.fingerprint()
    assert sorted(pool.specs()) == sorted(desired_workers(2))  # the default, as before
    assert ensure_baseline(actor="setup").pk == base.pk


def test_start_runs_one_child_per_wanted_worker_with_its_arguments(
    children: Children,
) -> None:
    warming = version("w", S.WARMING)
    pool = children.pool(2, grace=10)
    pool.start()
    argv = sorted(children.ready(pool).values())
    fp = DEFAULT.fingerprint()
    assert argv == sorted(
        [
            ["worker", "--workers", "1", "--analyzer", fp, "--shared"],
            ["worker", "--workers", "1", "--analyzer", fp, "--shared"],
            ["worker", "--workers", "1", "--analyzer", warming.fingerprint],
            ["worker", "--workers", "1", "--queues", DRIVER_QUEUE],
        ]
    )
    assert sorted(pool.specs()) == sorted(desired_workers(2))


def test_an_unversioned_pool_runs_plain_workers(children: Children) -> None:
    pool = children.pool(2, versioned=False)
    pool.start()
    assert sorted(children.ready(pool).values()) == [["worker", "--workers", "1"]] * 2


def test_a_child_that_dies_is_restarted_with_the_same_arguments(children: Children) -> None:
    pool = children.pool(1, grace=10, poll=3600)
    pool.start()
    before = children.ready(pool)
    victim = next(c for spec, c in pool.children if spec[0] == "--queues")
    victim.kill()
    victim.wait(timeout=10)
    pool.check()
    after = children.ready(pool)
    assert victim.pid not in after and len(after) == len(before)
    assert sorted(after.values()) == sorted(before.values())


def test_a_drained_version_loses_its_worker_and_a_new_one_gets_one(children: Children) -> None:
    draining = version("d", S.DRAINING)
    pool = children.pool(1, grace=30, poll=3600)
    pool.start()
    old = next(c for spec, c in pool.children if draining.fingerprint in spec)
    children.ready(pool)
    AnalyzerVersion.objects.filter(pk=draining.pk).update(state=S.DRAINED)
    warming = version("w", S.WARMING)
    replan(pool)
    assert old.wait(timeout=30) == 0  # SIGTERM: it shut down on its own (warm shutdown)
    assert sorted(pool.specs()) == sorted(desired_workers(1))
    assert ("--analyzer", warming.fingerprint) in pool.specs()
    assert all(draining.fingerprint not in spec for spec in pool.specs())
    pool.check()
    assert pool.retiring == []  # reaped


def test_a_retiring_child_still_busy_after_the_grace_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Grace and the stop margin both 0: the next check after the SIGTERM kills it (the
    # worker's own hand-back within the margin is tests/system/test_shutdown.py's).
    monkeypatch.setattr(pool_module, "STOP_MARGIN", 0.0)
    stubborn = Children(tmp_path, ignore_term=True)
    try:
        draining = version("d", S.DRAINING)
        pool = stubborn.pool(1, grace=0.0, poll=3600)
        pool.start()
        stubborn.ready(pool)
        old = next(c for spec, c in pool.children if draining.fingerprint in spec)
        AnalyzerVersion.objects.filter(pk=draining.pk).update(state=S.DRAINED)
        replan(pool)  # SIGTERM, ignored; grace 0: the next check kills it
        assert old.poll() is None and proc_state(old.pid) != "gone"
        pool.check()
        assert old.returncode == -signal.SIGKILL and pool.retiring == []
    finally:
        stubborn.kill_all()


def test_stop_terminates_every_child_and_kills_those_past_the_grace(tmp_path: Path) -> None:
    obedient, stubborn = Children(tmp_path / "a"), Children(tmp_path / "b", ignore_term=True)
    try:
        polite, deaf = obedient.pool(1, grace=30), stubborn.pool(1, grace=0.5)
        for pool, made in ((polite, obedient), (deaf, stubborn)):
            pool.start()
            made.ready(pool)
        polite.stop()
        assert [c.returncode for _, c in polite.children] == [0] * len(polite.children)
        deaf.stop()
        assert {c.returncode for _, c in deaf.children} == {-signal.SIGKILL}
        deaf.check()  # a stopping pool restarts nothing
        assert all(c.poll() is not None for _, c in deaf.children)
    finally:
        obedient.kill_all()
        stubborn.kill_all()


def test_stop_sends_a_retiring_child_no_second_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retiring child already has its SIGTERM (its warm shutdown under its grace); a
    second one is a worker's cold shutdown (RQ), which would hand back the job it was
    allowed to finish."""
    monkeypatch.setattr(pool_module, "STOP_MARGIN", 0.0)
    stubborn = Children(tmp_path, ignore_term=True)
    try:
        draining = version("d", S.DRAINING)
        pool = stubborn.pool(1, grace=0.5, poll=3600)
        pool.start()
        stubborn.ready(pool)
        old = next(c for spec, c in pool.children if draining.fingerprint in spec)
        AnalyzerVersion.objects.filter(pk=draining.pk).update(state=S.DRAINED)
        replan(pool)  # retired: its SIGTERM
        wait_for("the SIGTERM", (stubborn.dir / f"{old.pid}.json.terms").exists)
        pool.stop()  # the others' SIGTERM; everyone killed past the grace
        assert (stubborn.dir / f"{old.pid}.json.terms").read_text() == "TERM\n"
        assert all(c.poll() is not None for _, c in pool.children)
    finally:
        stubborn.kill_all()


def test_a_worker_listens_only_on_queues_neither_paused_nor_gated(settings: Any) -> None:
    closed = version("d", S.DRAINING)

    class Worker(PauseAware, SimpleWorker):
        pass

    names = ["sync", queue_name(DEFAULT.fingerprint()), queue_name(closed.fingerprint)]
    worker = Worker([queues.queue(n) for n in names], connection=queues.worker_connection())
    worker.apply_pauses()
    assert [q.name for q in worker._ordered_queues] == names[:2]  # the draining gate is shut
    queues.set_paused("sync", True)
    worker.apply_pauses()
    assert [q.name for q in worker._ordered_queues] == names[1:2]
    queues.set_paused(names[1], True)
    worker.apply_pauses()
    assert [q.name for q in worker._ordered_queues] == [queues.IDLE_QUEUE]
    queues.set_paused("sync", False)
    worker.apply_pauses()
    assert [q.name for q in worker._ordered_queues] == ["sync"]
    assert worker.dequeue_timeout == 1


def test_a_worker_refuses_the_queue_of_a_version_it_did_not_load() -> None:
    other = AnalyzerConfig.from_mapping({"detect_renames": True})
    with pytest.raises(ValueError, match="refuses"):
        run_one_worker([queue_name(other.fingerprint())], burst=True)
    with pytest.raises(ValueError, match="refuses"):
        run_one_worker([queue_name(DEFAULT.fingerprint())], burst=True, configs=[other])
    # Refused before loading: this process still analyses with what it had (a refused
    # start once left ``other`` loaded, and every later in-process job was refused).
    assert loaded_fingerprints() == [DEFAULT.fingerprint()]


def test_a_versions_config_is_read_from_its_row_and_checked(settings: Any) -> None:
    assert version_config(DEFAULT.fingerprint()) is DEFAULT
    renames = AnalyzerConfig.from_mapping({"detect_renames": True})
    AnalyzerVersion.objects.create(
        fingerprint=renames.fingerprint(),
        code_version=CODE_VERSION,
        config={"detect_renames": True},
    )
    assert version_config(renames.fingerprint()) == renames
    with pytest.raises(ValueError, match="no analyzer version"):
        version_config("e" * 64)
    AnalyzerVersion.objects.create(fingerprint="f" * 64, code_version=CODE_VERSION, config={})
    with pytest.raises(ValueError, match="hashes to"):
        version_config("f" * 64)
    old_code = AnalyzerConfig().fingerprint(OTHER_CODE)
    AnalyzerVersion.objects.create(fingerprint=old_code, code_version=OTHER_CODE, config={})
    with pytest.raises(ValueError, match=re.escape(f"is code {OTHER_CODE}; this worker runs code")):
        version_config(old_code)


@pytest.mark.slow  # a pool of real Django worker processes
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_every_worker_of_the_worker_command_ends_with_its_pool(
    tmp_path: Path, settings: Any, how: str
) -> None:
    """``manage.py worker --workers 2`` starts its real workers. SIGTERM to the pool
    reaches every child (warm shutdown) and the pool exits 0; SIGKILLed (no clean-up of
    its own), its workers get SIGTERM from the kernel and shut down instead of running on
    as orphans."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--workers", "2"],
        env=worker_env(settings, tmp_path, PYTHONUNBUFFERED="1"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("started 3 workers"), line
        kids = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                .read_text().split()]  # fmt: skip
        assert len(kids) == 3
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0
        else:
            proc.kill()
            proc.wait()
        for pid in kids:
            wait_for(f"child {pid} to exit", lambda pid=pid: proc_state(pid) in {"gone", "Z"})
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left


def report_gc_freeze(path: str) -> None:
    """An RQ job: write how many objects the work horse's collector ignores."""
    import gc

    Path(path).write_text(str(gc.get_freeze_count()))


#: Run in a fresh process: a forking RQ worker in burst mode. In the test process it would
#: turn that process's database pool off for every later test (``run_one_worker`` calls
#: ``use_direct_connections``) and leave its threads running.
GC_FREEZE = """
import gc, sys
import django
django.setup()
from dashboard.infra import queues
from workers.pool import run_one_worker

queues.queue(queues.SYNC_QUEUE).enqueue(
    "tests.workers.test_pool.report_gc_freeze", sys.argv[1], job_id="gc-freeze"
)
run_one_worker([queues.SYNC_QUEUE], burst=True)
print(gc.get_freeze_count())
"""


def test_a_work_horse_never_collects_what_it_inherited_and_its_worker_still_does(
    tmp_path: Path, settings: Any
) -> None:
    out = tmp_path / "freeze-count"
    env = worker_env(settings, tmp_path)
    env["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    done = subprocess.run(
        [sys.executable, "-c", GC_FREEZE, str(out)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # the horse inherited the worker's objects frozen: a full collection in it walks
    # (and copies, page by page) none of them
    assert int(out.read_text()) > 10_000
    # the worker unfroze them right after the fork
    assert done.stdout.strip().splitlines()[-1] == "0"


#: Run in a fresh process (the test process's own threads, e.g. pooled request threads
#: of earlier tests, may hold connections a real worker process never has): a forking RQ
#: worker in burst mode, recording which database files are open at each fork.
FORK_FILES = """
import json, os, sys
import django
django.setup()
from django.conf import settings
from dashboard.infra import queues
from workers.pool import run_one_worker

db = os.path.realpath(str(settings.DATABASES["default"]["NAME"]))
forks = []

def record():
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target in {db, db + "-wal", db + "-shm"}:
            found.append(target)
    forks.append(found)

os.register_at_fork(before=record)
q = queues.queue(queues.SYNC_QUEUE)
q.enqueue("time.sleep", 1.5, job_id="busy-while-beating")
q.enqueue("time.sleep", 0.0, job_id="forked-after-the-beats")
run_one_worker([queues.SYNC_QUEUE], burst=True)
print(json.dumps(forks))
"""


def test_a_worker_forks_its_work_horses_with_no_sqlite_connection_open(
    tmp_path: Path, settings: Any
) -> None:
    """An SQLite connection open in any thread of the worker at the fork makes the
    horse's committed writes vanish (tests/workers/runtime/test_fork_safety.py shows the loss
    itself). The heartbeat thread beats while a horse runs, so the next fork comes after some of its
    rounds: broken, the database's files are open in the worker at that fork."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
        pytest.skip("the hazard is SQLite's: PostgreSQL connections hold no file locks")
    env = worker_env(settings, tmp_path, GITWARD_WORKER_DEAD_AFTER="3")  # a beat every 0.5 s
    env["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    done = subprocess.run(
        [sys.executable, "-c", FORK_FILES], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    forks = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(forks) == 2
    assert forks == [[], []]


def touch(path: str) -> None:
    """A job that leaves a trace of having run."""
    Path(path).write_text("ran")


#: Run in a fresh process: a real worker (not burst) on the sync queue, sent SIGTERM, as
#: the pool retires a worker, at one of two moments of its idle loop (``argv[1]``):
#: inside its pause read (a job having just arrived), or right after it dequeued a job.
STOP_REQUEST = """
import os, signal, sys, time
import django
django.setup()
from rq import Worker
from dashboard.infra import queues
from workers.pool import run_one_worker

where, ran = sys.argv[1], sys.argv[2]
q = queues.queue(queues.SYNC_QUEUE)

def installed():
    return callable(signal.getsignal(signal.SIGTERM))  # RQ's handler, in its loop

if where == "pause-read":
    real = queues.paused_queue_names
    def paused():
        if installed() and not q.job_ids:
            q.enqueue("tests.workers.test_pool.touch", ran, job_id="after-the-stop")
            os.kill(os.getpid(), signal.SIGTERM)
        return real()
    queues.paused_queue_names = paused
else:
    real_version = Worker.get_redis_server_version
    def version(self):  # called by RQ between the dequeue and the job's start
        os.kill(os.getpid(), signal.SIGTERM)
        return real_version(self)
    Worker.get_redis_server_version = version
    q.enqueue("tests.workers.test_pool.touch", ran, job_id="dequeued")
started = time.monotonic()
run_one_worker([queues.SYNC_QUEUE])
print(round(time.monotonic() - started, 1), q.job_ids)
"""


@pytest.mark.parametrize("where", ["pause-read", "after-dequeue"])
def test_a_stopped_idle_worker_takes_no_new_job_drops_none_and_stops_at_once(
    tmp_path: Path, settings: Any, where: str
) -> None:
    """A warm stop request that reaches an idle worker is recorded, never raised from the
    signal handler (``_shutdown`` in workers/pool.py). Raised inside the pause read, it
    was swallowed: the retired worker went on taking jobs until its grace ran out and
    stopped cold. Raised between a dequeue and the job's start, it dropped that job (a
    promote's catch-up, docs/rollouts.md, then never ran). The grace is long (60 s): a
    warm stop takes well under a second, and a 5 s grace was once outlived by the warm
    stop of a loaded CI machine (two suites and more on two cores); a stop that is
    swallowed still runs into it and stops cold, which the test sees."""
    env = worker_env(settings, tmp_path, GITWARD_WORKER_GRACE="60")
    env["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    ran = tmp_path / "ran"
    done = subprocess.run(
        [sys.executable, "-c", STOP_REQUEST, where, str(ran)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cold shut down" not in done.stderr  # a warm stop, not the grace's cold one
    left = done.stdout.strip().splitlines()[-1]
    if where == "pause-read":  # the job that came with the stop is left for another worker
        assert not ran.exists() and "after-the-stop" in left
    else:  # the job it had dequeued ran before it stopped
        assert ran.read_text() == "ran" and "dequeued" not in left


def test_a_worker_loads_every_context_module_before_it_forks() -> None:
    """The context packages load lazily; a worker loads them all up front, so that its
    work horses (forked per job) find them imported."""
    loaded = pool_module.load_contexts()
    on_disk = {
        f"{package}.{path.stem}"
        for package in pool_module.CONTEXTS
        for path in (ROOT / package.replace(".", "/")).glob("*.py")
        if path.stem != "__init__"
    }
    assert set(loaded) == on_disk and len(on_disk) > 40
    assert all(name in sys.modules for name in on_disk)
