"""The deploy lock across real processes: concurrent starts, duplicate drivers, a driver
SIGKILLed (takeover; its stale token is rejected) or stopped with SIGTERM (lock released),
and the ``manage.py rollout`` commands over the same database and Redis masters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.locks import leases
from dashboard.models import AnalyzerVersion, AuditEntry, Rollout, RolloutEvent
from dashboard.rollouts import drains, start, steps
from dashboard.rollouts.deploy_lock import takeover_rollout
from dashboard.rollouts.driver import RolloutDriver
from dashboard.versions import state_machine
from dashboard.versions.state_machine import RolloutBusy, RolloutConflict, ensure_baseline
from tests.support.processes import ROOT, worker_env
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    PASSING,
    RENAMES,
    _release_drivers,
    completed_and_running,
    wait_for,
)
from workers.locks import keys

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = AnalyzerVersion.State
KEY = keys.deploy("analysis")

STARTER = """
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
import django
django.setup()
from dashboard.rollouts.start import start_rollout
from dashboard.versions.state_machine import RolloutBusy
actor, gate = sys.argv[1], sys.argv[2]
open(gate + "." + actor, "w").close()  # ready: Django is set up
while not os.path.exists(gate):
    time.sleep(0.001)
try:
    ro = start_rollout(config={"detect_renames": True}, actor=actor, enqueue_driver=False)
except RolloutBusy as exc:
    print("BUSY", exc)
else:
    print("WON", ro.pk)
"""


def manage(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "rollout", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_driver(env: dict[str, str], pk: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "rollout", "drive", str(pk), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def env(settings, tmp_path: Path) -> dict[str, str]:
    return worker_env(settings, tmp_path, GITWARD_LOCK_TTL="3")


def test_two_processes_starting_one_queue_at_once_exactly_one_wins(env, tmp_path: Path) -> None:
    ensure_baseline(actor="setup")
    gate = tmp_path / "go"
    procs = {
        actor: subprocess.Popen(
            [sys.executable, "-c", STARTER, actor, str(gate)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for actor in ("proc-a", "proc-b")
    }
    # Open the gate once both are past Django's start-up, so the two starts really race.
    wait_for(lambda: all((tmp_path / f"go.{a}").exists() for a in procs), 60, "both ready")
    gate.write_text("go")
    outs = {a: p.communicate(timeout=60) for a, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), outs
    won = [a for a, (out, _) in outs.items() if out.startswith("WON")]
    lost = [a for a, (out, _) in outs.items() if out.startswith("BUSY")]
    assert len(won) == 1 and len(lost) == 1, outs
    ro = Rollout.objects.get()
    assert ro.started_by == won[0]
    message = outs[lost[0]][0]
    assert f"rollout #{ro.pk}" in message and f"started by {won[0]}" in message
    assert "since" in message


def test_two_drivers_of_one_rollout_one_holds_the_lock_the_other_names_it(env) -> None:
    ensure_baseline(actor="setup")
    ro = start.start_rollout(config=RENAMES, actor="alice", enqueue_driver=False)
    drivers = [spawn_driver(env, ro.pk) for _ in range(2)]
    try:
        wait_for(lambda: any(d.poll() is not None for d in drivers), 60, "one driver to give up")
        loser = next(d for d in drivers if d.returncode is not None)
        winner = next(d for d in drivers if d is not loser)
        assert loser.returncode != 0
        err = loser.stderr.read() if loser.stderr else ""
        ro.refresh_from_db()
        assert ro.state == Rollout.State.ACTIVE and str(winner.pid) in ro.lock_holder
        # Either it lost the Redlock race (the message names the holder) or it came
        # second and found the rollout already driven.
        assert f":{winner.pid}" in err or "already ran" in err, err
        assert winner.poll() is None
        info = leases.redlock().inspect(KEY)
        assert info is not None and info["holder"]["token"] == ro.lock_token
    finally:
        for d in drivers:
            if d.poll() is None:
                d.send_signal(signal.SIGTERM)
                d.wait(30)


def test_a_sigkilled_holder_is_taken_over_and_its_stale_token_is_rejected(env) -> None:
    ensure_baseline(actor="setup")
    ro = start.start_rollout(config=RENAMES, actor="alice", enqueue_driver=False)
    proc = spawn_driver(env, ro.pk)
    try:
        wait_for(lambda: Rollout.objects.get(pk=ro.pk).state == "active", 60, "the driver")
        # The driver starts warming by itself (registered → warming, with its token).
        wait_for(lambda: AnalyzerVersion.objects.get(pk=ro.version_id).state == S.WARMING, 30)
        ro.refresh_from_db()
        stale = int(ro.lock_token or 0)
        assert str(proc.pid) in ro.lock_holder
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # Its lease (TTL 3 s, extended every second) is still in Redis for a while: a plain
    # takeover is refused, naming the dead holder.
    with pytest.raises(RolloutBusy, match=rf"still held by .*:{proc.pid}"):
        takeover_rollout(rollout=ro, actor="bob", reason="holder died", ttl=5.0)
    wait_for(lambda: leases.redlock().inspect(KEY) is None, 20, "the dead lease to run out")
    new = takeover_rollout(rollout=ro, actor="bob", reason="holder died", ttl=5.0)
    DRIVERS.append(new)
    fresh = int(new.token or 0)
    assert fresh > stale
    # The dead holder's token can no longer change anything.
    with pytest.raises(RolloutConflict):
        steps.record_verdict(rollout=ro, verdict=PASSING, token=stale, actor="zombie")
    with pytest.raises(RolloutConflict):
        steps.rollback(rollout=ro, token=stale, actor="zombie")
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.WARMING
    # The new holder carries on.
    steps.record_verdict(rollout=ro, verdict=PASSING, token=fresh, actor="bob")
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.VERIFIED
    take = RolloutEvent.objects.get(rollout=ro, action="takeover")
    assert take.detail["previous"]["token"] == stale and take.actor == "bob"
    assert AuditEntry.objects.filter(action="rollout.takeover", actor="bob").exists()


def test_sigterm_releases_the_lock_and_the_rollout_waits_for_a_takeover(env) -> None:
    ensure_baseline(actor="setup")
    ro = start.start_rollout(config=RENAMES, actor="alice", enqueue_driver=False)
    proc = spawn_driver(env, ro.pk)
    wait_for(lambda: Rollout.objects.get(pk=ro.pk).state == "active", 60, "the driver")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert leases.redlock().inspect(KEY) is None
    assert RolloutEvent.objects.filter(rollout=ro, action="lock.released").exists()
    assert Rollout.objects.get(pk=ro.pk).state == "active"
    new = takeover_rollout(rollout=ro, actor="bob", reason="resume", ttl=5.0)  # no waiting
    DRIVERS.append(new)
    assert new.token is not None


def test_the_cli_drives_a_rollout_and_rolls_it_back(env, tmp_path: Path) -> None:
    ensure_baseline(actor="setup")
    bad = manage(env, "start", "--set", "detect_renames=maybe", "--driver", "none")
    assert bad.returncode != 0 and "expected true or false" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    knob = manage(env, "start", "--set", "detect_renames=true", "--option", "pause=1")
    assert knob.returncode != 0 and "unknown rollout option 'pause'" in knob.stderr
    out = manage(
        env,
        "start",
        "--set",
        "detect_renames=true",
        "--steps",
        "20,100",
        "--driver",
        "none",
        "--actor",
        "carol",
        "--option",
        "step_pause=5",
        "--warm-commits",
        "7",
    )
    assert out.returncode == 0, out.stderr
    pk = int(out.stdout.split()[1])
    again = manage(env, "start", "--set", "ignore_whitespace=true", "--driver", "none")
    assert again.returncode != 0 and f"rollout #{pk}" in again.stderr
    ro = Rollout.objects.get(pk=pk)
    assert (ro.steps, ro.started_by, ro.state) == ([20, 100], "carol", "pending")
    assert ro.options["step_pause"] == 5.0 and ro.warm_set == {"commits_per_repository": 7}
    # Drive it in this test process (as an RQ driver job would) and let the CLI act on it.
    d = RolloutDriver(pk, ttl=5.0)
    d.acquire(actor="carol")
    DRIVERS.append(d)
    token = int(d.token or 0)
    steps.begin_warming(rollout=pk, token=token, actor="carol")
    steps.record_verdict(rollout=pk, verdict=PASSING, token=token, actor="carol")
    status = json.loads(manage(env, "status", "--json").stdout)
    assert status["rollout"]["id"] == pk and status["rollout"]["lock_token"] == token
    assert {v["state"] for v in status["versions"]} == {"current", "verified"}
    assert d.name in status["deploy_lock"]
    # promote is a request to the holder: tick the driver while the CLI waits.
    promote = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "rollout", "promote", str(pk), "--actor", "erin"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: Rollout.objects.get(pk=pk).pending_action is not None, 60, "the request")
    d.tick()
    out, err = promote.communicate(timeout=60)
    assert promote.returncode == 0, err
    assert "ramping 20%" in out
    d.release()
    # The driver is gone (lock released): rollback takes the lock itself.
    back = manage(env, "rollback", str(pk), "--reason", "numbers look wrong", "--timeout", "0")
    assert back.returncode == 0, back.stderr
    ro.refresh_from_db()
    assert ro.state == "rolling_back"
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.DRAINING
    assert AnalyzerVersion.objects.get(pk=ro.previous_id).state == S.CURRENT
    drains.reconcile_drains()
    md = manage(env, "checklist", str(pk)).stdout
    assert md.startswith(f"# Rollout #{pk}: analysis@{ro.version.fp12}")
    assert f"- [x] Deploy lock `locks:queue:analysis:deploy` taken (token {token}" in md
    assert "- [x] Warming verdict: passed: test verdict" in md
    assert "- [x] Ramp 0% → 20%" in md and "- [ ] Promoted to current" in md
    assert "numbers look wrong" in md and "| erin |" in md
    assert "rolled_back" in md
    missing = manage(env, "checklist", "999")
    assert missing.returncode != 0 and "no rollout #999" in missing.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "arguments are required: action"),
        (("start",), "one of the arguments --config --set --version is required"),
        (("start", "--config", "c.json", "--set", "detect_renames=true"), "not allowed with"),
        (("promote", "seven"), "invalid int value: 'seven'"),
        (("explode",), "invalid choice: 'explode'"),
        (("start", "--set", "detect_renames=true", "--steps", "10,x"), "--steps must be"),
    ],
)
def test_bad_cli_input_is_one_line_and_a_non_zero_exit(env, args, fragment: str) -> None:
    out = manage(env, *args)
    assert out.returncode != 0 and fragment in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr and Rollout.objects.count() == 0


def test_start_wait_blocks_until_the_end_and_a_rollback_exits_non_zero(env) -> None:
    """``rollout start --wait`` returns only when the rollout ends; ended otherwise than
    completed (here: rolled back by its holder) it says so in one line and exits 1."""
    ensure_baseline(actor="setup")
    waiter = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "rollout", "start", "--set",
         "detect_renames=true", "--driver", "none", "--wait", "--actor", "ci"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: Rollout.objects.exists(), 60, "the rollout row")
        ro = Rollout.objects.get()
        d = RolloutDriver(ro.pk, ttl=5.0)
        d.acquire(actor="ops")
        DRIVERS.append(d)
        token = int(d.token or 0)
        steps.begin_warming(rollout=ro.pk, token=token, actor="ops")
        steps.rollback(rollout=ro.pk, token=token, actor="ops", reason="not today")
        assert waiter.poll() is None  # rolling back is not the end: still waiting
        drains.check_drain(rollout=ro.pk, token=token, actor="ops")
        assert drains.check_drain(rollout=ro.pk, token=token, actor="ops")
        d.release()
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 1, (out, err)
    assert out.splitlines()[0] == f"rollout {ro.pk} pending"
    assert f"rollout {ro.pk} rolled_back" in out
    assert len(err.strip().splitlines()) == 1 and "rolled_back" in err


def test_a_drained_version_is_retired_from_the_cli_and_never_rolled_out_again(env) -> None:
    base = ensure_baseline(actor="setup")
    v = state_machine.register_version(config=RENAMES, actor="setup")
    AnalyzerVersion.objects.filter(pk=v.pk).update(state=S.DRAINED, verified_at=base.created_at)
    for args, fragment in [
        (("retire", "zz"), "4 to 64 hexadecimal digits"),
        (("retire", "abcdef12abcdef12"), "no version abcdef12abcdef12"),
        (("retire", base.fingerprint[:12]), "current → retired is not allowed"),
    ]:
        out = manage(env, *args)
        assert out.returncode != 0 and fragment in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert AnalyzerVersion.objects.get(pk=base.pk).state == S.CURRENT
    done = manage(env, "retire", v.fingerprint[:12], "--reason", "superseded for good")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"analysis@{v.fingerprint[:12]} retired"
    assert AnalyzerVersion.objects.get(pk=v.pk).state == S.RETIRED
    event = RolloutEvent.objects.get(version=v, to_state=S.RETIRED)
    assert (event.from_state, event.reason) == (S.DRAINED, "superseded for good")
    assert AuditEntry.objects.filter(
        action="rollout.transition", outcome__contains="retired"
    ).exists()
    again = manage(env, "start", "--set", "detect_renames=true", "--driver", "none")
    assert again.returncode != 0 and "cannot be rolled out from state retired" in again.stderr


def test_the_cli_refuses_to_abort_a_finished_rollout_in_one_line_and_leaves_the_lock(
    env,
) -> None:
    """``manage.py rollout abort ID`` of a completed rollout while another runs: one
    line, a non-zero exit, no traceback — and the running rollout's lease (same nonce,
    same token) and driver untouched, even with ``--force``."""
    a, b, driver = completed_and_running()
    before = leases.redlock().inspect(KEY)
    for args in (("abort", str(a.pk)), ("abort", str(a.pk), "--force"),
                 ("takeover", str(a.pk)), ("rollback", str(a.pk), "--force")):  # fmt: skip
        out = manage(env, *args)
        assert out.returncode != 0, (args, out.stdout)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, (
            args,
            out.stderr,
        )
        assert f"rollout #{a.pk}" in out.stderr or f"rollout #{b.pk}" in out.stderr
    after = leases.redlock().inspect(KEY)
    assert after is not None and before is not None and after["nonce"] == before["nonce"]
    assert driver.tick() and not driver.lost.is_set()
    assert Rollout.objects.get(pk=a.pk).state == "completed"
    assert Rollout.objects.get(pk=b.pk).state == "active"
    assert not AuditEntry.objects.filter(action="rollout.lock.break").exists()


def test_a_lease_still_in_redis_is_broken_only_with_force_and_the_break_is_audited(
    settings, tmp_path: Path
) -> None:
    """A SIGKILLed driver's lease stays in Redis for one TTL (30 s here): meanwhile the
    lease is not broken unless an action is forced — and the forced break is an audit
    row naming the lease it broke."""
    env = worker_env(settings, tmp_path, GITWARD_LOCK_TTL="30")
    ensure_baseline(actor="setup")
    ro = start.start_rollout(config=RENAMES, actor="alice", enqueue_driver=False)
    proc = spawn_driver(env, ro.pk)
    try:
        wait_for(lambda: AnalyzerVersion.objects.get(pk=ro.version_id).state == S.WARMING, 60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    ro.refresh_from_db()
    dead = leases.redlock().inspect(KEY)
    assert dead is not None and dead["holder"]["token"] == ro.lock_token
    # Unforced, a lease under the rollout's own token looks like a live driver: the
    # abort is a request to it, which nobody takes — said in one line, non-zero exit.
    asked = manage(env, "abort", str(ro.pk), "--reason", "host lost", "--timeout", "1")
    assert asked.returncode != 0 and "no driver took the request" in asked.stderr, asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1 and "Traceback" not in asked.stderr
    # A takeover is refused outright, naming the lease.
    taken = manage(env, "takeover", str(ro.pk))
    assert taken.returncode != 0 and "still held by" in taken.stderr, taken.stderr
    assert Rollout.objects.get(pk=ro.pk).state == "active"
    assert not AuditEntry.objects.filter(action="rollout.lock.break").exists()
    forced = manage(env, "abort", str(ro.pk), "--force", "--reason", "host lost", "--timeout", "0")
    assert forced.returncode == 0, forced.stderr
    ro.refresh_from_db()
    assert ro.state == "rolling_back"
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state == S.DRAINING
    entry = AuditEntry.objects.get(action="rollout.lock.break")
    assert entry.detail["rollout"] == ro.pk and entry.detail["own"] is True
    assert entry.detail["holder"]["token"] == dead["holder"]["token"]
    assert entry.outcome.startswith("forced: broke the lease of ")
    assert entry.detail["reason"] == "host lost"
