"""tests/support/checked_threads.py: a CheckedThread's failure fails the test that joins it (a plain
Thread's only reaches ``threading.excepthook``: pytest warns and the test passes), and a
failure nobody joined is still reported."""

from __future__ import annotations

import threading

import pytest

from tests.support.checked_threads import CheckedThread, unreported


def _fail() -> None:
    raise AssertionError("checked inside the thread")


def test_join_raises_what_the_target_raised_in_the_joining_thread() -> None:
    thread = CheckedThread(target=_fail, name="asserting")
    thread.start()
    with pytest.raises(AssertionError, match="checked inside the thread") as info:
        thread.join()
    assert "raised in thread 'asserting'" in "".join(info.value.__notes__)
    assert info.value.__traceback__ is not None
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "_fail" in frames  # the thread's own traceback, not only the re-raise
    thread.join()  # raised once
    assert unreported() == []


def test_a_plain_thread_would_have_let_the_test_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same target in a ``threading.Thread`` joins normally; its
    assertion only reaches ``threading.excepthook`` (which pytest turns into a warning)."""
    hooked: list[type[BaseException] | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args.exc_type))
    thread = threading.Thread(target=_fail)
    thread.start()
    thread.join()  # no exception here
    assert hooked == [AssertionError]


def test_check_raises_without_waiting_and_join_with_a_timeout_leaves_a_live_thread() -> None:
    release = threading.Event()
    thread = CheckedThread(target=lambda: release.wait(30) and _fail())
    thread.start()
    thread.check()  # nothing raised yet
    thread.join(0.01)  # still running: returns, like Thread.join
    assert thread.is_alive()
    release.set()
    with pytest.raises(AssertionError):
        thread.join(30)
    assert not thread.is_alive()


def test_system_exit_in_the_target_is_raised_too() -> None:
    """A plain thread drops ``SystemExit`` silently (not even a warning)."""

    def leave() -> None:
        raise SystemExit("timed out waiting for warming")

    thread = CheckedThread(target=leave)
    thread.start()
    with pytest.raises(SystemExit, match="timed out"):
        thread.join()


def test_a_failed_thread_that_was_never_joined_is_reported() -> None:
    """What the autouse fixture of tests/conftest.py fails a test with."""
    thread = CheckedThread(target=_fail, name="forgotten")
    thread.start()
    threading.Thread.join(thread)  # waits without raising: as if never joined
    [(name, error)] = unreported()
    assert name == "forgotten" and isinstance(error, AssertionError)
    assert unreported() == []  # reported once
    thread.join()  # and no longer raised by the thread itself


def test_a_clean_thread_joins_quietly() -> None:
    out: list[int] = []
    thread = CheckedThread(target=lambda: out.append(1))
    thread.start()
    thread.join()
    thread.check()
    assert out == [1] and unreported() == []
