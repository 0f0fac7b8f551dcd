"""workers.runtime.failpoints: parsing and triggering of named fault points (the crash tests in
tests/system/test_crashes.py and tests/system/test_chaos.py use them against real workers)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from workers.runtime.failpoints import FailpointError, failpoint, parse_failpoints


def test_parse_accepts_every_action_form() -> None:
    raw = "a.b=stop, c=kill,d=sleep:0.5,e,f#repo one=raise*3,,g=sleep:.25"
    assert parse_failpoints(raw) == {
        "a.b": "stop",
        "c": "kill",
        "d": "sleep:0.5",
        "e": "raise",
        "f#repo one": "raise*3",
        "g": "sleep:.25",
    }
    assert parse_failpoints("") == {}


@pytest.mark.parametrize(
    "raw", ["a=explode", "a=sleep:", "a=sleep:x", "a=raise*0", "bad name=kill", "=kill", "a#=kill"]
)
def test_parse_refuses_malformed_items(raw: str) -> None:
    with pytest.raises(ValueError, match="malformed item"):
        parse_failpoints(raw)


def test_unset_or_unarmed_points_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITWARD_FAILPOINTS", raising=False)
    failpoint("x.y")
    monkeypatch.setenv("GITWARD_FAILPOINTS", "other=raise")
    failpoint("x.y")


def test_raise_and_tagged_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITWARD_FAILPOINTS", "p=raise,q#poison=raise")
    with pytest.raises(FailpointError, match="failpoint p"):
        failpoint("p")
    with pytest.raises(FailpointError):
        failpoint("p", "any-tag")  # untagged arming covers every tag
    failpoint("q", "healthy")
    failpoint("q")
    with pytest.raises(FailpointError):
        failpoint("q", "poison")


def test_once_dir_fires_exactly_n_times(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GITWARD_FAILPOINTS", "once=raise,thrice=raise*3")
    monkeypatch.setenv("GITWARD_FAILPOINTS_ONCE", str(tmp_path))
    with pytest.raises(FailpointError):
        failpoint("once")
    failpoint("once")
    assert (tmp_path / "once").exists()
    for _ in range(3):
        with pytest.raises(FailpointError):
            failpoint("thrice")
    failpoint("thrice")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "once",
        "thrice.1",
        "thrice.2",
        "thrice.3",
    ]


def _reach(name: str) -> None:
    failpoint(name)
    os._exit(0)


def _child(action: str) -> multiprocessing.Process:
    os.environ["GITWARD_FAILPOINTS"] = f"fp={action}"
    try:
        proc = multiprocessing.get_context("fork").Process(target=_reach, args=("fp",))
        proc.start()
    finally:
        del os.environ["GITWARD_FAILPOINTS"]
    return proc


def test_kill_sigkills_the_process_itself() -> None:
    proc = _child("kill")
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def test_stop_freezes_the_process_until_continued() -> None:
    proc = _child("stop")
    assert proc.pid is not None
    deadline = time.monotonic() + 30
    state = ""
    while time.monotonic() < deadline:
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            break
        time.sleep(0.01)
    assert state == "T"
    os.kill(proc.pid, signal.SIGCONT)
    proc.join(30)
    assert proc.exitcode == 0


def test_sleep_pauses_then_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # the clock: the only thing faked
    monkeypatch.setenv("GITWARD_FAILPOINTS", "s=sleep:2.5")
    failpoint("s")
    assert slept == [2.5]


def test_perturb_picks_one_key_in_n_and_only_for_its_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.runtime.failpoints import altered, perturbs

    keys = [f"{i:040x}" for i in range(4000)]
    assert not any(perturbs("analyze.perturb", "fp1", k) for k in keys)  # unset
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.perturb#fp1=perturb:200")
    assert parse_failpoints("analyze.perturb#fp1=perturb:200") == {
        "analyze.perturb#fp1": "perturb:200"
    }
    chosen = [k for k in keys if perturbs("analyze.perturb", "fp1", k)]
    assert 5 <= len(chosen) <= 40  # about 1 in 200 of 4000
    assert chosen == [k for k in keys if perturbs("analyze.perturb", "fp1", k)]  # the same keys
    assert not any(perturbs("analyze.perturb", "fp2", k) for k in keys)  # another version
    failpoint("analyze.perturb", "fp1")  # a perturb point does nothing to the process
    assert altered("analyze.perturb", "fp1") is False  # nor does it alter anything
    with pytest.raises(ValueError, match="malformed"):
        parse_failpoints("analyze.perturb=perturb:0")


def test_alter_is_the_callers_to_act_on_once_per_claim(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from workers.runtime.failpoints import altered

    assert altered("analyze.alter_row") is False  # unset
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.alter_row#poison=alter,other=raise")
    assert altered("analyze.alter_row", "healthy") is False  # armed for another tag
    assert altered("analyze.alter_row", "poison") is True
    failpoint("analyze.alter_row", "poison")  # ``failpoint`` leaves an ``alter`` alone
    with pytest.raises(FailpointError):
        altered("other")  # any other action acts as failpoint does
    monkeypatch.setenv("GITWARD_FAILPOINTS_ONCE", str(tmp_path))
    assert [altered("analyze.alter_row", "poison") for _ in range(3)] == [True, False, False]
