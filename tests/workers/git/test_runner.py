"""workers.git.runner: the hardened git runner, called directly (hostile-repository
scenarios that go through the whole pipeline are in tests/workers/git/test_hardening.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from workers.analysis.history import default_git_runner
from workers.git.runner import (
    GitError,
    GitTimeout,
    ProcessGroups,
    Runner,
    first_error_line,
    hardened_env,
    subcommand,
)

#: A git "command" that runs a shell which runs a child: git -> sh -> sleep, one group.
HANG = ["-c", "alias.hang=!sleep 300; :", "hang"]


class Recording(Runner):
    """Remembers the pid (= process group id) of every git it starts."""

    pids: list[int]

    def __call__(self, args: list[str], **kw: object) -> subprocess.Popen[bytes]:
        proc = super().__call__(args, **kw)  # type: ignore[arg-type]
        self.pids = [*getattr(self, "pids", []), proc.pid]
        return proc


def _group_alive(pgid: int) -> bool:
    """True while any process of the group exists and is not a zombie."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_gone(pgid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.02)
    return False


def test_a_timed_out_git_leaves_no_process_of_its_group(tmp_path: Path) -> None:
    runner = Recording()
    with pytest.raises(GitTimeout, match=r"git hang timed out after 0\.5s"):
        runner.run(HANG, cwd=tmp_path, timeout=0.5)
    (pgid,) = runner.pids
    assert _wait_gone(pgid), "git or its child sleep outlived the timeout"


def test_the_group_is_its_own_and_children_are_in_it(tmp_path: Path) -> None:
    runner = Runner()
    proc = runner(HANG, cwd=tmp_path)
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        deadline = time.monotonic() + 30
        members: list[int] = []
        while time.monotonic() < deadline and len(members) < 2:
            members = [
                int(e.name)
                for e in Path("/proc").iterdir()
                if e.name.isdigit() and _pgid_of(e) == proc.pid
            ]
            time.sleep(0.02)
        assert len(members) >= 2  # git and the shell/sleep it started
        runner.groups.kill_all()
        assert proc.wait(30) == -signal.SIGKILL
        assert _wait_gone(proc.pid)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling")
def test_a_niced_caller_s_git_gets_a_niced_session(tmp_path: Path) -> None:
    """A job's git runs in a session of its own, which Linux schedules as a group of its
    own (autogroup) whatever the processes' niceness; the runner and the history stream
    give that group the niceness git inherited from the thread that started it, so a bulk
    chunk's GITWARD_BULK_NICE holds its git back too (docs/scheduling.md#niceness-reaches-git)."""
    repo = GitRepo.create(tmp_path / "r")
    repo.commit("one", {"a.txt": "a\n"})
    git_dir = repo.path / ".git"
    seen: dict[str, tuple[int, str, bool]] = {}

    def start_all(label: str, nice: int) -> None:
        os.nice(nice)  # this thread only (Linux keeps a niceness per thread)
        for how, start in (
            ("runner", lambda: Runner()(HANG, cwd=tmp_path)),
            ("history", lambda: default_git_runner(
                ["cat-file", "--batch"], cwd=git_dir, stdin=subprocess.PIPE)),
        ):  # fmt: skip
            proc = start()
            try:
                group = Path(f"/proc/{proc.pid}/autogroup").read_text()
                own = os.getsid(proc.pid) == proc.pid == os.getpgid(proc.pid)
                seen[f"{label} {how}"] = (os.getpriority(os.PRIO_PROCESS, proc.pid), group, own)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()

    for label, nice in (("niced", 5), ("as is", 0)):
        thread = threading.Thread(target=start_all, args=(label, nice))
        thread.start()
        thread.join(60)
    assert len(seen) == 4, seen
    for what, (nice, group, own) in seen.items():
        assert own, what  # killpg reaches git's children
        assert group.split()[-2:] == ["nice", str(nice)], (what, group)
    assert (
        seen["niced runner"][0]
        == seen["niced history"][0]
        == os.getpriority(os.PRIO_PROCESS, 0) + 5
    )


def _pgid_of(entry: Path) -> int:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (FileNotFoundError, ProcessLookupError):
        return -1


def test_a_git_spawned_after_kill_all_is_killed_on_registration(tmp_path: Path) -> None:
    groups = ProcessGroups()
    groups.kill_all()
    proc = Runner(groups=groups)(HANG, cwd=tmp_path)
    assert proc.wait(30) == -signal.SIGKILL
    proc.communicate()


def test_environment_is_fixed_and_nothing_of_the_caller_leaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITWARD_TEST_SECRET", "s3cret")
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    out = Runner(extra_env={"EXTRA_ONE": "1"}).run(
        ["-c", "alias.showenv=!env", "showenv"], cwd=tmp_path
    )
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert "GITWARD_TEST_SECRET" not in env
    assert env.get("GIT_DIR") != "/elsewhere"
    for key, value in {
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "EXTRA_ONE": "1",
    }.items():
        assert env[key] == value
    assert "BatchMode=yes" in env["GIT_SSH_COMMAND"]
    assert hardened_env()["LC_ALL"] == "C.UTF-8"


def test_hardened_config_beats_the_repositorys_own(tmp_path: Path) -> None:
    repo = GitRepo.create(tmp_path / "r")
    repo.commit("one", {"a.txt": "a\n"})
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "hook-ran"
    hook = hooks / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    repo.git("config", "core.hooksPath", str(hooks))
    repo.git("config", "protocol.ext.allow", "always")

    runner = Runner()
    assert runner.run(["config", "--get", "protocol.ext.allow"], cwd=repo.path) == "never\n"
    assert runner.run(["config", "--get", "core.hooksPath"], cwd=repo.path) == "/dev/null\n"
    runner.run(["checkout", "-q", "-b", "other"], cwd=repo.path)
    assert not marker.exists()
    # The control: plain git with the same repository config does run the hook.
    repo.git("checkout", "-q", "-b", "third")
    assert marker.exists()


def test_a_failing_git_raises_its_fatal_line(tmp_path: Path) -> None:
    with pytest.raises(GitError) as info:
        Runner().run(["rev-parse", "--verify", "nope"], cwd=tmp_path)
    assert info.value.returncode not in (0, None)
    assert str(info.value).startswith("fatal:")
    assert not isinstance(info.value, GitTimeout)


def test_output_cap(tmp_path: Path) -> None:
    repo = GitRepo.create(tmp_path / "r")
    repo.commit("one", {"big.txt": "x" * 5000})
    with pytest.raises(GitError, match="more than 100 bytes"):
        Runner().run(["show", "HEAD:big.txt"], cwd=repo.path, max_output=100)


def test_limits_must_be_positive_and_limited_only_tightens() -> None:
    with pytest.raises(ValueError):
        Runner(max_file_bytes=0)
    with pytest.raises(ValueError):
        Runner(max_memory_bytes=-1)
    base = Runner(max_file_bytes=1000)
    assert base.limited(5000).max_file_bytes == 1000
    assert base.limited(10).max_file_bytes == 10
    assert base.limited(None).max_file_bytes == 1000
    assert base.limited(10).groups is base.groups
    assert Runner().limited(7).max_file_bytes == 7


def test_file_size_limit_stops_a_writer(tmp_path: Path) -> None:
    repo = GitRepo.create(tmp_path / "r")
    repo.commit("one", {"big.bin": os.urandom(200_000)})
    with pytest.raises(GitError, match="exceeded the limit of 4096 bytes"):
        Runner(max_file_bytes=4096).run(["clone", "-q", str(repo.path), str(tmp_path / "c")])


def test_subcommand_and_first_error_line() -> None:
    assert subcommand(["-c", "a=b", "--git-dir", "/x", "fetch", "origin"]) == "fetch"
    assert subcommand(["-C", "dir", "--no-pager", "log"]) == "log"
    assert subcommand([]) == "git"
    assert first_error_line("warning: w\nerror: e\nfatal: f\n") == "fatal: f"
    assert first_error_line("hint: x\nerror: e\n") == "error: e"
    assert first_error_line("one\n\n  two  \n") == "two"
    assert first_error_line("") == ""
