"""The worker pool: worker processes, each one RQ worker, supervised per analyzer version.

Which workers run (``desired_workers``, re-read from the versions table every few
seconds, so a rollout changes the pool without a restart): ``size`` workers of the
current version (its physical queue + sync + maintenance), ``GITWARD_INTERACTIVE_WORKERS``
more of it that take only small interactive jobs (the reserved interactive slot,
docs/scheduling.md#the-reserved-interactive-slot), one worker of every other
staffed version (warming, verified, ramping, draining: its physical queue only), and
one worker of the ``rollouts`` driver queue. Only versions of the pool's own code are
staffed; a pool of new code beside the current one (blue/green) puts its ``size``
workers on its own version being rolled out (docs/rollouts.md#code-rollouts-bluegreen).
Each version's worker loads exactly that version's ``AnalyzerConfig`` (``manage.py
worker --analyzer FP``); a drained version's workers are stopped (warm shutdown). A
worker whose version's gate is closed (draining) listens on nothing, so it takes no job
while its running one finishes.

Shutdown (``GITWARD_WORKER_GRACE``, default 60 s): SIGTERM/SIGINT to the pool sends
SIGTERM to every child. A child stops taking jobs at once (RQ's warm shutdown) and lets
its running job finish (the job's lock is heartbeat-extended meanwhile). A child still
busy ``grace`` seconds later hands the job back itself: it kills its work horse (RQ's
cold shutdown, a second SIGTERM it sends itself), re-queues the attempt without
spending its budget (``runs.hand_back_attempt``), releases the horse's locks and
exits. A child still alive ``STOP_MARGIN`` seconds after that (wedged, or SIGSTOPped) is
SIGKILLed with every process below it (``workers.runtime.process_tree.kill_tree``); a horse also
dies with its worker (``PR_SET_PDEATHSIG``), so no horse outlives its worker and goes
on writing. Its run is then retried as a crash once the worker's heartbeat is stale.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import pkgutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError

from dashboard import infra, locks, runs, versions
from dashboard.infra import close_thread_connections, use_direct_connections
from dashboard.models import AnalyzerVersion
from dashboard.rollouts import DRIVER_QUEUE
from workers.analysis import CODE_VERSION, DECLARED_EFFECT, DEFAULT, AnalyzerConfig, queue_name
from workers.jobs import MovedPathsJob, load_versions, loaded_fingerprints, serve_express
from workers.runtime import ForkGuard, die_with_parent, kill_tree

log = logging.getLogger(__name__)

#: Seconds the pool waits past the grace for a child to hand its job back and exit
#: before it kills the child's whole tree. The deployment files allow grace + this + 5.
STOP_MARGIN = 10.0


class PauseAware:
    """Worker mixin: listen only on queues that are not paused and whose analyzer
    version's gate is open (both re-read every second).

    The dequeue timeout is one second so a paused queue (or a closed gate) stops feeding
    this worker within that second; with every queue shut the worker listens on an
    always-empty queue, and so does a worker asked to stop (it takes no new job). The
    effective list is recorded on the worker's heartbeat row.
    """

    queues: list[Any]
    connection: Any
    name: str
    _ordered_queues: list[Any]
    _stop_requested: bool

    @property
    def dequeue_timeout(self) -> int:
        return 1

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        result = super().heartbeat(*args, **kwargs)  # type: ignore[misc]
        self.apply_pauses()
        return result

    def apply_pauses(self) -> None:
        if self._stop_requested:  # stopping (``_shutdown`` in workers.pool): no new job
            shut = {q.name for q in self.queues}
        else:
            try:
                shut = infra.paused_queue_names() | versions.closed_queue_names()
            except Exception:  # Redis or database trouble: keep the current list
                close_old_connections()
                return
        # a host queue (mirror affinity) is shut with its shared queue
        active = [q for q in self.queues if runs.base_queue(q.name) not in shut]
        chosen = active or [Queue(infra.IDLE_QUEUE, connection=self.connection)]
        before = [q.name for q in getattr(self, "_ordered_queues", [])]
        self._ordered_queues = chosen
        if [q.name for q in chosen] != before:
            try:
                locks.set_queues(getattr(self, "name", ""), [q.name for q in chosen])
            except Exception:  # shown on the next change
                close_old_connections()


#: The packages whose modules load on first use (their ``__init__`` maps names to modules).
CONTEXTS = (
    "dashboard.operations",
    "dashboard.rollouts",
    "dashboard.repositories",
    "dashboard.runs",
    "dashboard.versions",
    "dashboard.locks",
    "dashboard.accounts",
    "dashboard.observability",
    "dashboard.infra",
)


def load_contexts() -> list[str]:
    """Import every module of the context packages now, in the worker process, and return
    their names. They load on first use (docs/architecture.md#package-surfaces); a worker
    forks a work horse per job, and a module first used in a horse would be imported
    again in every job."""
    names = []
    for package in CONTEXTS:
        path = importlib.import_module(package).__path__
        for module in pkgutil.iter_modules(path, package + "."):
            importlib.import_module(module.name)
            names.append(module.name)
    return names


def run_one_worker(
    queue_names: Sequence[str],
    *,
    burst: bool = False,
    configs: Sequence[AnalyzerConfig] | None = None,
    express: bool = False,
) -> None:
    """Run one RQ worker in this process until stopped (Django must be set up).

    ``express``: the worker is a reserved interactive slot
    (docs/scheduling.md#the-reserved-interactive-slot): it takes only jobs marked
    express (small interactive work, ``infra.take_express``), from among the most urgent
    jobs of its queues wherever they stand behind a large backfill's, and never
    another job, so a long chunk never holds it.

    ``configs`` are the analyzer versions it loads (default: the deployed default).
    It refuses to listen on a physical analysis queue of a version it did not load
    (``ValueError``): a job there would be analysed with the wrong configuration.

    Besides RQ's loop, the worker keeps a heartbeat row in the database (so a dead
    worker is noticed even if Redis was flushed) and records a crashed attempt the
    moment one of its work horses is killed (SIGKILL, OOM).
    """

    class DjangoWorker(PauseAware, Worker):
        #: (job, queue) while a work horse runs it; the grace timer once stopping.
        running: tuple[Any, Any] | None = None
        grace_timer: threading.Timer | None = None
        parent_pid = 0
        last_horse = 0

        def fork_work_horse(self, *args: Any, **kwargs: Any) -> Any:
            # A forked child must never share its parent's database socket; the parent
            # only uses the database between jobs, so close it before each fork.
            connections.close_all()
            self.parent_pid = os.getpid()
            # The horse inherits every object of this process. Frozen, its garbage
            # collector never walks them: a full collection in the horse would otherwise
            # traverse (and, by writing their GC headers, copy page by page) the whole
            # inherited heap once per job. Only the parent unfreezes (right after the
            # fork), so nothing of its own is kept out of its collections for longer; the
            # horse never returns from ``super()`` (RQ ends it with ``os._exit``).
            # Race: the heartbeat thread runs between the freeze and the fork (the fork
            # itself waits for its round, ForkGuard) and after it. What it allocates
            # meanwhile is young and collected as usual; frozen objects are only skipped
            # by collections, never freed or moved, so nothing it holds changes.
            gc.freeze()
            try:
                return super().fork_work_horse(*args, **kwargs)
            finally:
                gc.unfreeze()
                self.last_horse = self.horse_pid  # RQ zeroes horse_pid once it is reaped

        def main_work_horse(self, job: Any, queue: Any) -> Any:
            """In the horse: a regular worker's horse running a job that is not express
            lowers its own CPU priority (``GITWARD_BULK_NICE``), so the reserved slot's
            small job gets the CPU first on a busy machine
            (docs/scheduling.md#the-reserved-interactive-slot). Lowering one's own
            priority needs no privilege; the horse exits after its job, so the worker
            keeps its own."""
            nice = int(settings.BULK_NICE)
            if not express and nice > 0:
                with contextlib.suppress(Exception):  # Redis trouble: run at full priority
                    if not infra.is_express(job.id):
                        os.nice(nice)
            return super().main_work_horse(job, queue)

        def setup_work_horse_signals(self) -> None:
            super().setup_work_horse_signals()
            die_with_parent(self.parent_pid)  # in the horse: no horse outlives its worker

        def execute_job(self, job: Any, queue: Any) -> Any:
            self.running = (job, queue)
            try:
                return super().execute_job(job, queue)
            finally:
                self.running = None

        def request_stop(self, signum: int, frame: Any) -> None:
            """Warm shutdown (RQ: no new job; the running one may finish), with a timer
            that turns it cold after the grace: the timer's SIGTERM reaches RQ's
            ``request_force_stop`` below, in the main thread like any signal."""
            if self.grace_timer is None:
                # RQ ignores a second signal within 1 s of the first (duplicate Ctrl-C).
                delay = max(float(settings.WORKER_GRACE), 1.5)
                self.grace_timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM))
                self.grace_timer.daemon = True
                self.grace_timer.start()
            super().request_stop(signum, frame)

        def _shutdown(self) -> None:
            """The warm shutdown request, in the signal handler (called by RQ's
            ``request_stop``): recorded, never raised. RQ raises ``StopRequested`` from
            the handler when no job runs, wherever the main thread is: inside the pause
            read's ``except Exception`` it was swallowed, and a retired worker went on
            taking jobs until its grace ran out; between a dequeue and the job's start it
            dropped the dequeued job (a promote's catch-up, docs/rollouts.md, then never
            ran). Now the next pause read shuts every queue (``PauseAware``) and the worker
            stops between two dequeue rounds (``dequeue_job_and_maintain_ttl``) or after
            its job (docs/operations.md#stopping-workers-the-grace-period)."""
            self._stop_requested = True

        def dequeue_job_and_maintain_ttl(
            self, timeout: int | None, max_idle_time: int | None = None
        ) -> Any:
            """RQ's dequeue, one round (``dequeue_timeout``) at a time, until a job comes
            or a stop is requested (``_shutdown``): None then ends RQ's ``work`` loop."""
            if express:
                return self.dequeue_express(burst=timeout is None)
            if timeout is None or max_idle_time is not None:  # burst: RQ's single pass
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            while not self._stop_requested:
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time=timeout)
                if result is not None:
                    return result
            return None

        def dequeue_express(self, *, burst: bool) -> Any:
            """The reserved slot's dequeue: the first express job of its (unpaused)
            queues in their order, taken out of its list by one script
            (``infra.take_express``: a regular worker's pop of the same id and this
            script run one after the other, so one of them gets it); looked for again
            as soon as an express job is enqueued (``infra.wait_for_express``) and at
            least every ``GITWARD_EXPRESS_POLL`` seconds (a job that turns express or is
            unpaused meanwhile). A burst worker looks once. The heartbeat (and with it
            the pause and gate read) runs once a second, as for a regular worker."""
            next_beat = 0.0
            while not self._stop_requested:
                if time.monotonic() >= next_beat:
                    self.set_state("idle")
                    self.heartbeat()
                    next_beat = time.monotonic() + 1.0
                for q in list(self._ordered_queues):
                    job_id = infra.take_express(q)
                    if job_id is None:
                        continue
                    try:
                        job = self.job_class.fetch(job_id, connection=self.connection)
                    except NoSuchJobError:  # dropped meanwhile (a cancel): nothing to run
                        continue
                    job.redis_server_version = self.get_redis_server_version()
                    self.heartbeat()
                    return job, q
                if burst:
                    return None
                try:  # woken by the next express enqueue, or look again after the poll
                    infra.wait_for_express(self.connection, float(settings.EXPRESS_POLL))
                except Exception:  # Redis trouble: the heartbeat above reports it
                    time.sleep(float(settings.EXPRESS_POLL))
            return None

        def request_force_stop(self, signum: int, frame: Any) -> None:
            """Cold shutdown: RQ kills the horse's process group and reaps it, then
            raises SystemExit; before that exit, the job is handed back."""
            running, horse = (self.running, self.horse_pid) if self.horse_pid else (None, 0)
            try:
                super().request_force_stop(signum, frame)
            except SystemExit:
                if running is not None:
                    self.hand_back(*running, horse=horse)
                raise

        def hand_back(self, job: Any, queue: Any, *, horse: int) -> None:
            """Re-queue the killed horse's attempts (the horse is reaped: it writes no
            more): the job's, and any other run it was running (a sync's inline chunk,
            ``runs.running_runs_of``); release its locks, and take its RQ job off the
            started registry."""
            reason = f"handed back: worker stopping, grace of {settings.WORKER_GRACE:g}s over"
            try:
                for run_id, number in self.runs_of(job, horse):
                    runs.hand_back_attempt(
                        run_id=run_id, number=number, worker=self.name, reason=reason
                    )
                release_locks_of(horse)
                self.handle_job_failure(job, queue=queue, exc_string=reason)
            except Exception:  # the reconciler retries it once our heartbeat is stale
                log.exception("could not hand back job %s", job.id)
            finally:
                connections.close_all()

        def handle_job_failure(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
            """RQ's failure handling; for a job stopped by a cancel (RQ's ``stop-job``
            command, sent by ``dashboard.runs.cancels``: RQ killed the horse's process
            group and does not call ``handle_work_horse_killed``), also end every run the
            horse was still running (a sync's inline chunk) and release its locks, as for
            a killed horse. The cancelled run itself is discarded already, so its
            ``crash_attempt`` matches nothing (a conditional UPDATE on running)."""
            stopped = self._stopped_job_id is not None and self._stopped_job_id == job.id
            horse = self.last_horse
            result = super().handle_job_failure(job, queue, *args, **kwargs)
            if stopped and horse:
                try:
                    why = "work horse stopped: its analysis was cancelled"
                    for run_id, number in self.runs_of(job, horse):
                        runs.crash_attempt(run_id=run_id, number=number, reason=why)
                    release_locks_of(horse)
                except Exception:  # the locks expire; the reconciler ends the runs
                    log.exception("could not clean up after stopped job %s", job.id)
                finally:
                    connections.close_all()
            return result

        def handle_work_horse_killed(
            self, job: Any, retpid: int, ret_val: int, rusage: Any
        ) -> None:
            super().handle_work_horse_killed(job, retpid, ret_val, rusage)
            signo = os.WTERMSIG(ret_val) if os.WIFSIGNALED(ret_val) else None
            reason = f"work horse killed by signal {signo}" if signo else (
                f"work horse exited with status {ret_val}")  # fmt: skip
            try:
                for run_id, number in self.runs_of(job, retpid):
                    runs.crash_attempt(run_id=run_id, number=number, reason=reason)
                release_locks_of(retpid)
            finally:
                connections.close_all()

        def runs_of(self, job: Any, horse: int) -> list[tuple[int, int]]:
            """The attempts a reaped horse may have left running: the one its RQ job
            names, and every run it claimed itself (``runs.running_runs_of``). The
            outcome of each is a conditional UPDATE on that attempt, so one that had
            ended already (the sync before its inline chunk) is left as it is."""
            named = [(int(job.args[0]), int(job.args[1]))] if runs.is_run_job(
                job.func_name, job.args) else []  # fmt: skip
            claimed = runs.running_runs_of(worker=self.name, pid=horse) if horse else []
            return named + [r for r in claimed if r not in named]

    wanted = list(configs or [DEFAULT])
    own = {queue_name(c.fingerprint()) for c in wanted}
    foreign = [n for n in queue_names if n.startswith("analysis@") and n not in own]
    if foreign:  # refused before anything is loaded: the process keeps what it had
        raise ValueError(
            f"this worker loaded {', '.join(sorted(own))} and refuses {', '.join(foreign)}"
        )
    # Mirror affinity (docs/scheduling.md#mirror-affinity): this host's queue of each
    # analysis queue first, then the shared one.
    shared_names = list(queue_names)
    queue_names = [n for shared in shared_names for n in [*runs.host_queues_of([shared]), shared]]
    # No pool in a worker: its work horses are forked (dashboard/infra/dbpool.py).
    use_direct_connections()
    load_versions(wanted)
    serve_express(express)
    connections.close_all()
    conn = infra.worker_connection()  # RQ raises its read timeout; not the shared one
    name = f"{socket.gethostname()}.{os.getpid()}"
    version = loaded_fingerprints()[0]
    stop = threading.Event()
    interval = max(0.5, float(settings.WORKER_DEAD_AFTER) / 6)

    # The work horse is forked while this thread may be inside SQLite or redis-py: the
    # guard makes every fork wait for the end of the current round (workers/runtime/fork_safety.py).
    guard = ForkGuard().install()

    def heartbeat() -> None:
        """Beat every ``interval``; promote due scheduled jobs every second.

        Race: the work horse is forked between two rounds (the guard), and every round
        ends with this thread's database connection closed. An SQLite connection open
        in any thread of the worker at the fork silently loses the horse's writes
        (sqlite.org/howtocorrupt.html §2.6): the horse inherits SQLite's record that
        this process holds the database's shared lock, so its own connection takes no
        real lock; a process that then closes what it sees as the last connection
        checkpoints and deletes the WAL file the horse goes on committing to. Seen in
        the chaos run: an attempt logged "stored 2 commits" and none of its writes
        survived. One connection per beat (every few seconds) is the price.
        """
        next_beat = 0.0
        while not stop.is_set():
            try:
                with guard:
                    try:
                        if time.monotonic() >= next_beat:
                            locks.beat(
                                name=name,
                                queues_=list(queue_names),
                                version=version,
                                code_version=CODE_VERSION,
                            )
                            next_beat = time.monotonic() + interval
                        infra.promote_due_jobs(list(queue_names))
                        runs.beat_host()
                        runs.move_overdue(shared_names)
                    finally:
                        connections.close_all()  # this thread's only: see the docstring
            except infra.QueueUnavailable as exc:  # promotion waits; the beat went on
                log.warning("worker heartbeat: %s", exc)
            except Exception:  # the next round retries; a long gap marks us dead
                log.exception("worker heartbeat failed")
            stop.wait(1.0)

    load_contexts()
    learn_own_code(f"worker {name}")
    locks.beat(name=name, queues_=list(queue_names), version=version, code_version=CODE_VERSION)
    with contextlib.suppress(Exception):  # the heartbeat retries every second
        runs.beat_host()
    beat_thread = threading.Thread(target=heartbeat, name="gitward-heartbeat", daemon=True)
    beat_thread.start()
    worker = DjangoWorker(
        [infra.queue(n) for n in queue_names], connection=conn, name=name, job_class=MovedPathsJob
    )
    worker.apply_pauses()
    try:
        if burst:
            infra.promote_due_jobs(list(queue_names))
        # No RQ scheduler process: it survives a SIGKILLed worker as an orphan. Due
        # jobs are promoted by the heartbeat thread above (and the reconciler).
        worker.work(burst=burst, with_scheduler=False, logging_level="WARNING")
    finally:
        if worker.grace_timer is not None:  # done in time: no cold shutdown during clean-up
            worker.grace_timer.cancel()
        stop.set()
        beat_thread.join(timeout=5)
        locks.stop_beat(name)
        connections.close_all()


def release_locks_of(pid: int) -> int:
    """Release the locks a reaped work horse held, so its retry need not wait out the
    lease. Safe: the holder is provably dead (we collected its exit status), and the
    release is a compare-and-delete on that holder's nonce (``leases.release_locks_of``)."""
    return locks.release_locks_of(host=socket.gethostname(), pid=pid)


def learn_own_code(actor: str) -> None:
    """Report this process's code version (docs/rollouts.md#code-rollouts-bluegreen).

    On a queue without a current version, the first fleet to start adopts the deployed
    default of its own code as the baseline (``ensure_baseline``): otherwise each fleet
    would take its own code's default for the served version, and a second code's
    workers would run the shared queues beside the first's. Otherwise a code gitward has
    no version of is learned as a ``registered`` version with the current configuration,
    ready to be rolled out. A failure (the deploy lock held by a rollout, a database
    error) is logged: the worker still serves what it can load, and the next start
    reports again."""
    try:
        if versions.current_version() is None:
            versions.ensure_baseline(actor=actor)
        versions.learn_code_version(CODE_VERSION, declared=DECLARED_EFFECT, actor=actor)
    except Exception:
        log.exception("could not report code version %s", CODE_VERSION)
    finally:
        close_old_connections()


def version_config(fingerprint: str) -> AnalyzerConfig:
    """The configuration of the version with this fingerprint (its row's config, checked
    to hash to the same fingerprint under this code), or the default's. A version of
    another code is refused, naming both codes: this worker cannot analyse under it
    (docs/rollouts.md#code-rollouts-bluegreen)."""
    if fingerprint == DEFAULT.fingerprint():
        return DEFAULT
    row = AnalyzerVersion.objects.filter(fingerprint=fingerprint).first()
    if row is None:
        raise ValueError(f"no analyzer version {fingerprint}")
    if row.code_version != CODE_VERSION:
        raise ValueError(
            f"version {fingerprint} is code {row.code_version}; this worker runs code "
            f"{CODE_VERSION} and cannot load it"
        )
    config = AnalyzerConfig.from_mapping(row.config)
    if config.fingerprint() != fingerprint:
        raise ValueError(
            f"version {fingerprint} hashes to {config.fingerprint()} under this code version"
        )
    return config


#: One child's ``manage.py worker`` arguments (after ``worker --workers 1``).
Spec = tuple[str, ...]


#: A pool whose code is not the current version's puts its ``size`` workers on the
#: version of its code that is furthest along (docs/rollouts.md#code-rollouts-bluegreen).
LEAD_ORDER = (
    AnalyzerVersion.State.RAMPING,
    AnalyzerVersion.State.VERIFIED,
    AnalyzerVersion.State.WARMING,
)


def desired_workers(size: int) -> list[Spec]:
    """The children the pool should run now (see the module docstring).

    Only versions of this pool's own code (``CODE_VERSION``) are staffed: a worker can
    load no other (its fingerprint would not match), so a version of another code is
    left to that code's pool (blue/green, docs/rollouts.md#code-rollouts-bluegreen).
    When the current version is of another code, this pool runs no shared (sync,
    maintenance) workers; its ``size`` workers serve the version of its code being
    rolled out, if any.
    """
    S = AnalyzerVersion.State
    rows = list(
        AnalyzerVersion.objects.filter(queue=versions.QUEUE, state__in=versions.STAFFED)
        .order_by("pk")
        .values_list("fingerprint", "state", "code_version")
    )
    current = next(((fp, code) for fp, st, code in rows if st == S.CURRENT), None)
    mine = [(fp, st) for fp, st, code in rows if code == CODE_VERSION]
    specs: list[Spec] = []
    if current is None or current[1] == CODE_VERSION:
        served = current[0] if current is not None else DEFAULT.fingerprint()
        specs += [("--analyzer", served, "--shared")] * size
        # the reserved interactive slot (docs/scheduling.md#the-reserved-interactive-slot)
        express = int(settings.INTERACTIVE_WORKERS) if size else 0
        specs += [("--analyzer", served, "--shared", "--express")] * express
        specs += [("--analyzer", fp) for fp, _ in mine if fp != served]
    else:
        lead = next((fp for state in LEAD_ORDER for fp, st in mine if st == state), None)
        specs += [("--analyzer", lead)] * size if lead is not None else []
        specs += [("--analyzer", fp) for fp, _ in mine if fp != lead]
    specs.append(("--queues", DRIVER_QUEUE))
    return specs


class Pool:
    """Supervises child processes running ``manage.py worker --workers 1 …``.

    ``versioned`` (the default) runs ``desired_workers(size)``, re-read every ``poll``
    seconds by ``check``; otherwise ``size`` plain workers of the served version.
    ``grace`` (default ``GITWARD_WORKER_GRACE``) is also passed to the children, which
    hand their job back once it is over.
    """

    def __init__(
        self,
        size: int,
        *,
        manage_py: Path,
        env: dict[str, str] | None = None,
        grace: float | None = None,
        versioned: bool = True,
        poll: float = 2.0,
    ) -> None:
        self.size = size
        self.manage_py = manage_py
        self.env = env
        #: The children's own grace (they read ``GITWARD_WORKER_GRACE`` too); the pool
        #: kills a child ``STOP_MARGIN`` seconds after it.
        self.grace = float(settings.WORKER_GRACE if grace is None else grace)
        self.versioned = versioned
        self.poll = poll
        self.children: list[tuple[Spec, subprocess.Popen[bytes]]] = []
        #: Children asked to stop (their version drained, or the pool shrank), with the
        #: moment after which they are killed.
        self.retiring: list[tuple[subprocess.Popen[bytes], float]] = []
        self.stopping = False
        self._next_plan = 0.0

    def desired(self) -> list[Spec]:
        if not self.versioned:
            return [()] * self.size
        try:
            close_old_connections()
            return desired_workers(self.size)
        except Exception:  # database trouble: keep what runs
            log.exception("could not read the analyzer versions; keeping the pool as is")
            return [spec for spec, _ in self.children]
        finally:
            # Called every ``poll`` seconds from a supervising thread (``up``'s runs in
            # a web process, whose pool must get the connection back between checks).
            close_thread_connections()

    def _spawn(self, spec: Spec) -> subprocess.Popen[bytes]:
        env = dict(os.environ if self.env is None else self.env)
        env["GITWARD_WORKER_GRACE"] = f"{self.grace:g}"
        # A pool that dies (SIGKILL, a crash) takes its workers along: each gets SIGTERM,
        # a warm shutdown under its own grace (it hands a job back past it), instead of
        # running on as an orphan nobody supervises. The kernel's signal follows the
        # thread that forked, so only a pool on the main thread ties its children.
        tie = threading.current_thread() is threading.main_thread()
        return subprocess.Popen(
            [sys.executable, str(self.manage_py), "worker", "--workers", "1", *spec],
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=partial(die_with_parent, os.getpid(), signal.SIGTERM) if tie else None,
        )

    def start(self) -> None:
        if self.versioned:
            learn_own_code(f"pool {socket.gethostname()}.{os.getpid()}")
        self.children = [(spec, self._spawn(spec)) for spec in self.desired()]
        self._next_plan = time.monotonic() + self.poll

    def specs(self) -> list[Spec]:
        """What runs now (live children only)."""
        return [spec for spec, child in self.children if child.poll() is None]

    def check(self) -> None:
        """Restart children that died, and (every ``poll`` s) match the desired set:
        spawn missing workers, stop (SIGTERM: warm shutdown) those no longer wanted."""
        if self.stopping:
            return
        for i, (spec, child) in enumerate(self.children):
            if child.poll() is not None:
                log.warning("worker pid %s exited with %s; restarting", child.pid, child.returncode)
                self.children[i] = (spec, self._spawn(spec))
        now = time.monotonic()
        self.retiring = [(c, t) for c, t in self.retiring if not _reaped(c, kill=now > t)]
        if now < self._next_plan:
            return
        self._next_plan = now + self.poll
        want = list(self.desired())
        keep: list[tuple[Spec, subprocess.Popen[bytes]]] = []
        for spec, child in self.children:
            if spec in want:
                want.remove(spec)
                keep.append((spec, child))
            else:
                log.info("stopping worker pid %s (%s): no longer needed", child.pid, spec)
                child.send_signal(signal.SIGTERM)
                self.retiring.append((child, now + self.grace + STOP_MARGIN))
        keep += [(spec, self._spawn(spec)) for spec in want]
        self.children = keep

    def stop(self) -> None:
        self.stopping = True
        # Retiring children have their SIGTERM already: a second one would turn their
        # warm shutdown cold (docs/operations.md#stopping-workers-the-grace-period).
        for _, child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        everyone = [child for _, child in self.children] + [c for c, _ in self.retiring]
        deadline = time.monotonic() + self.grace + STOP_MARGIN
        for child in everyone:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                log.warning("worker pid %s still running past its grace; killing it", child.pid)
                kill_tree(child.pid)
                child.wait(timeout=10)


def _reaped(child: subprocess.Popen[bytes], *, kill: bool) -> bool:
    """Whether a retiring child has exited (killed first if its grace ran out)."""
    if child.poll() is not None:
        return True
    if kill:
        kill_tree(child.pid)
        child.wait(timeout=10)
        return True
    return False
