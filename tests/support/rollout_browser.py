"""What the browser tests of the Rollouts page need on top of a running ``manage.py up``
(which staffs each version, warms with the real warmer and serves the ``rollouts``
queue): a paced warm set (so the page can be seen mid-warming), a worker beat of the new
fingerprint and a dead letter of the ramping version, played through the domain
functions in the same environment (the same database and embedded Redis nodes):

``python -m tests.support.rollout_browser ROLLOUT_ID GO_FILE``

1. If no RQ worker serves the ``rollouts`` queue, drive the rollout here: a real
   ``RolloutDriver`` takes the deploy lock and runs until the rollout ends.
2. Once the version's warming has begun, play its workers with the real analyzer path
   (``tests.support.rollouts.analyse_as``): half the warm set at once, the rest once the
   test creates ``GO_FILE`` (so the page can be seen mid-warming), then report a worker
   of the new fingerprint.
3. Once the version is ramping, dead-letter one analysis run of its fingerprint through
   the real attempt path (``runs.begin_attempt`` / ``fail_attempt``): the dead-letter page
   then offers "roll back to V".
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from django.db import IntegrityError, connection, transaction  # noqa: E402
from rq import Worker  # noqa: E402

from dashboard.infra import queues  # noqa: E402
from dashboard.models import AnalyzerVersion, JobRun, Repository, Rollout  # noqa: E402
from dashboard.rollouts import start  # noqa: E402
from dashboard.rollouts.driver import RolloutDriver  # noqa: E402
from dashboard.runs.attempts import begin_attempt, ensure_run, fail_attempt  # noqa: E402
from dashboard.versions import state_machine  # noqa: E402
from tests.support.checked_threads import CheckedThread  # noqa: E402
from tests.support.rollouts import analyse_as, report_worker  # noqa: E402

S = AnalyzerVersion.State
DEADLINE = 180.0


def wait_until(condition: Callable[[], object], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            raise SystemExit(f"rolloutplay: timed out waiting for {what}")
        time.sleep(0.1)


def version_state(ro_id: int) -> str:
    return str(Rollout.objects.values_list("version__state", flat=True).get(pk=ro_id))


def play(ro_id: int, go: Path) -> None:
    try:
        # Warming has begun, or is already over: not "is warming now". This process
        # starts while the driver already runs, and the real warmer may warm the whole
        # 5-commit set and pass the gate within a second or two; a loaded machine takes
        # longer than that to start Python and Django, and a wait for the state
        # "warming" then never ended (no dead letter, so the test's "roll back to V"
        # offer never came: seen under load, both tests failing at that step).
        wait_until(lambda: version_state(ro_id) != S.REGISTERED, "warming to begin")
        wait_until(lambda: Rollout.objects.get(pk=ro_id).warm_set.get("items"), "a warm set")
        ro = Rollout.objects.select_related("version").get(pk=ro_id)
        version = ro.version
        for repo_id, shas in ro.warm_set["items"]:
            oldest_first = list(reversed(shas))
            half = max(1, len(oldest_first) // 2)
            repo = Repository.objects.get(pk=repo_id)
            try:
                analyse_as(version, repo, oldest_first[:half])
                wait_until(go.exists, str(go))
                if oldest_first[half:]:
                    analyse_as(version, repo, oldest_first[half:])
            except IntegrityError:  # a real warmer wrote these chunks already
                pass
        report_worker(version)
        wait_until(lambda: version_state(ro_id) == S.RAMPING, "ramping")
        repo_id = ro.warm_set["items"][0][0]
        # Created, claimed and dead-lettered in one transaction: no other process ever
        # sees the run queued. Committed queued with no RQ job, it looks to the
        # reconciler (every second here) like a job Redis lost, and it enqueued one on
        # the version's queue: then the version's worker could claim the run first
        # (three attempts on a chunk it has not; the dead letter came late), or this
        # claim won and the job stayed queued; once the rollback closed the version no
        # worker took it, and the drain, which counts that queue, never ended.
        with transaction.atomic():
            run = ensure_run(
                kind=JobRun.Kind.ANALYZE,
                job_id=f"rolloutplay-{version.fingerprint[:12]}",
                queue=state_machine.physical_queue(ro.queue, version.fingerprint),
                repository_id=repo_id,
                fingerprint=version.fingerprint,
            )
            attempt = begin_attempt(run_id=run.pk, number=1, worker="rolloutplay")
            if attempt is not None:
                fail_attempt(attempt, KeyError("renamed path lost its history"), permanent=True)
    finally:
        connection.close()


def main(ro_id: int, go: Path) -> int:
    served = any(
        start.DRIVER_QUEUE in w.queue_names()
        for w in Worker.all(connection=queues.worker_connection())
    )
    player = CheckedThread(target=play, args=(ro_id, go), name="rolloutplay", daemon=True)
    player.start()
    if not served:
        driver = RolloutDriver(ro_id, poll=0.3)
        driver.acquire(actor="rolloutplay", reason="browser test driver")
        print(f"rolloutplay: driving rollout #{ro_id}", flush=True)
        print(f"rolloutplay: rollout ended {driver.run()}", flush=True)
    player.join(DEADLINE)  # raises what the player raised: a non-zero exit for the test
    if player.is_alive():
        raise SystemExit(f"rolloutplay: the player was still playing after {DEADLINE:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), Path(sys.argv[2])))
