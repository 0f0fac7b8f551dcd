"""Running git: a fixed hardened environment, own process groups, timeouts.

Every git process gitward starts goes through ``spawn``: it runs in its own process
group (so a timeout or a lost lock kills git *and* its children: upload-pack, ssh,
remote helpers), with hooks, fsmonitor, submodule recursion, system/global config and
terminal prompts disabled, and only the allowlisted transports.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from workers.git import fsck_policy

#: Transports git may use (``GIT_ALLOW_PROTOCOL`` also covers submodules/redirects).
ALLOWED_PROTOCOLS = "file:git:http:https:ssh"

#: ``-c`` options put before every git subcommand.
HARDENED_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.quotepath", "off"),
    ("core.askPass", ""),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("protocol.file.allow", "always"),
    ("protocol.git.allow", "always"),
    ("protocol.http.allow", "always"),
    ("protocol.https.allow", "always"),
    ("protocol.ssh.allow", "always"),
    ("protocol.ext.allow", "never"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    # Every received object is checked (index-pack --strict); which findings are
    # accepted is workers/git/fsck_policy.py's table, appended below as fetch.fsck.<id>.
    ("transfer.fsckObjects", "true"),
    ("fetch.fsckObjects", "true"),
    ("http.followRedirects", "false"),
    ("http.lowSpeedLimit", "1000"),
    ("http.lowSpeedTime", "60"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("advice.detachedHead", "false"),
    ("safe.bareRepository", "all"),
    # Repo-local config must never name a command git would run (docs/security.md#g18):
    # no pager, no external diff/textconv (history also passes --no-ext-diff/--no-textconv),
    # no credential prompts, no symlinks in any work tree, no credentials in URLs
    # (docs/security.md#g9).
    ("core.pager", "cat"),
    ("core.symlinks", "false"),
    ("transfer.credentialsInUrl", "die"),
    ("http.sslVerify", "true"),
    ("http.emptyAuth", "false"),
    *fsck_policy.fetch_config(),
)


class GitError(RuntimeError):
    """A git command failed; ``str()`` is a readable one-line reason."""

    def __init__(self, message: str, *, returncode: int | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class GitTimeout(GitError):
    """A git command ran past its deadline and was killed with its process group."""


def follow_niceness(pid: int) -> None:
    """Give git's session the niceness git inherited from the thread that started it.

    Every git a job starts runs in a session of its own (``start_new_session``), so that
    ``killpg`` reaches git's children. With Linux's autogroup scheduling (on by default)
    every session is a scheduling group with a fair share of the CPU whatever its
    processes' niceness: a bulk chunk's ``git log`` in its session ran at full weight
    beside express work, and ``GITWARD_BULK_NICE`` held back only the parse
    (docs/scheduling.md, "Niceness reaches git"). Writing the niceness to
    ``/proc/<pid>/autogroup`` gives the group the weight the process has; raising a
    niceness needs no privilege. No autogroup (another kernel, or it is off): nothing
    to do, the process's own niceness already counts. Race: git runs at its group's
    default weight for the moment between its start and this write; a git that has
    already exited is a zombie until the caller waits for it, so its pid cannot have
    been reused by then (and the write fails harmlessly if its group is gone)."""
    try:
        nice = os.getpriority(os.PRIO_PROCESS, pid)
        if nice > 0:
            Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        pass


@functools.cache
def death_prefix() -> tuple[str, ...]:
    """``setpriv --pdeathsig KILL --`` when available: git is killed by the kernel if the
    process that started it dies (a SIGKILLed work horse must not leave a fetch running
    in its orphaned process group). An exec wrapper, not ``preexec_fn``: workers have
    threads. The signal follows the thread that spawned git, so jobs spawn from their
    own thread."""
    found = shutil.which("setpriv")
    return (found, "--pdeathsig", "KILL", "--") if found else ()


def hardened_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal, fixed environment: nothing from the caller leaks into git."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS,
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_SSH_COMMAND": (
            "ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new "
            "-o ConnectTimeout=20 -o ProxyCommand=none -o LocalCommand=none "
            "-o PermitLocalCommand=no"
        ),
    }
    if extra:
        env.update(extra)
    return env


def command(args: Sequence[str]) -> list[str]:
    """``git -c k=v ... <args>``."""
    cmd = ["git"]
    for key, value in HARDENED_CONFIG:
        cmd += ["-c", f"{key}={value}"]
    cmd += list(args)
    return cmd


class ProcessGroups:
    """The git process groups a job has running, so a lost lock can kill them all.

    ``kill_all`` may be called from the heartbeat thread while the job thread spawns:
    the set is guarded by a lock, and a process spawned after ``kill_all`` is killed on
    registration (``closed``), so no git process outlives an aborted job.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgids: set[int] = set()
        self.closed = False

    def add(self, pgid: int) -> None:
        with self._lock:
            if self.closed:
                _killpg(pgid)
                return
            self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def kill_all(self) -> None:
        with self._lock:
            self.closed = True
            pgids = list(self._pgids)
            self._pgids.clear()
        for pgid in pgids:
            _killpg(pgid)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def subcommand(args: Sequence[str]) -> str:
    """The git subcommand in ``args`` (skipping ``-c k=v``, ``--git-dir X``, ...)."""
    takes_value = {"-c", "--git-dir", "-C", "--work-tree", "--namespace", "--config-env"}
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in takes_value:
            skip = True
            continue
        if not arg.startswith("-"):
            return arg
    return args[0] if args else "git"


class Runner:
    """Starts git processes for one job; compatible with ``workers.analysis.history``'s runner.

    ``max_file_bytes`` sets ``RLIMIT_FSIZE`` for git and its children (index-pack,
    remote helpers): a file git writes past the limit kills the writer with SIGXFSZ,
    so a hostile remote cannot fill the disk with one huge pack (docs/security.md#g20).
    The limit is set by ``/bin/sh -c 'ulimit -f'`` before ``exec git`` (no ``preexec_fn``: the
    worker has threads), so the process (group) id is still git's.

    ``max_memory_bytes`` sets ``RLIMIT_AS`` the same way (``ulimit -v``). git builds a
    commit's whole diff queue before printing it (~400 bytes per path), so a git bomb's
    root commit would otherwise take memory proportional to its 10^9 paths
    (docs/security.md#g19); over the limit git stops with "out of memory".  Not set by
    default: fetches of very large repositories legitimately need several GiB.
    """

    def __init__(
        self,
        *,
        git_dir: Path | None = None,
        groups: ProcessGroups | None = None,
        extra_env: dict[str, str] | None = None,
        max_file_bytes: int | None = None,
        max_memory_bytes: int | None = None,
    ) -> None:
        self.git_dir = git_dir
        self.groups = groups or ProcessGroups()
        self.extra_env = dict(extra_env or {})
        if max_file_bytes is not None and max_file_bytes <= 0:
            raise ValueError("max_file_bytes must be positive")
        self.max_file_bytes = max_file_bytes
        if max_memory_bytes is not None and max_memory_bytes <= 0:
            raise ValueError("max_memory_bytes must be positive")
        self.max_memory_bytes = max_memory_bytes

    def limited(self, max_file_bytes: int | None) -> Runner:
        """A runner sharing this one's process groups, with a (tighter) file-size limit."""
        limit = self.max_file_bytes
        if max_file_bytes is not None:
            limit = max_file_bytes if limit is None else min(limit, max_file_bytes)
        clone = copy.copy(self)  # keeps a subclass's behaviour (tests wrap the runner)
        clone.max_file_bytes = limit
        return clone

    def __call__(
        self,
        args: list[str],
        *,
        cwd: str | Path | None = None,
        stdin: int | None = None,
    ) -> subprocess.Popen[bytes]:
        env = hardened_env(self.extra_env)
        if self.git_dir is not None:
            env["GIT_DIR"] = str(self.git_dir)
        cmd = command(args)
        limits = []
        if self.max_file_bytes is not None:
            # dash/POSIX ``ulimit -f`` counts 512-byte blocks, ``ulimit -v`` KiB.
            limits.append(f"ulimit -f {max(1, self.max_file_bytes // 512)}")
        if self.max_memory_bytes is not None:
            limits.append(f"ulimit -v {max(1, self.max_memory_bytes // 1024)}")
        if limits:
            cmd = ["/bin/sh", "-c", f"{' && '.join(limits)} && exec {shlex.join(cmd)}"]
        proc = subprocess.Popen(
            [*death_prefix(), *cmd],
            cwd=str(cwd) if cwd is not None else None,
            env=env,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: killpg reaches git's children
        )
        follow_niceness(proc.pid)
        self.groups.add(proc.pid)
        return proc

    def run(
        self,
        args: list[str],
        *,
        cwd: str | Path | None = None,
        timeout: float = 600.0,
        max_output: int = 16 * 1024 * 1024,
    ) -> str:
        """Run to completion; return stdout (text). Raise GitError/GitTimeout."""
        proc = self(args, cwd=cwd)
        name = subcommand(args)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.communicate()
            raise GitTimeout(
                f"git {name} timed out after {timeout:g}s and was stopped", returncode=None
            ) from None
        finally:
            self.groups.discard(proc.pid)
            # A finished git may have left children (e.g. ssh) in its group.
            _killpg(proc.pid)
        if len(out) > max_output:
            raise GitError(f"git {name} produced more than {max_output} bytes of output")
        stderr = err.decode("utf-8", "replace")[-2000:]
        if proc.returncode == -signal.SIGXFSZ or "died of signal 25" in stderr:
            raise GitError(
                f"git {name} stopped: a file it wrote exceeded the limit of "
                f"{self.max_file_bytes} bytes",
                returncode=proc.returncode,
                stderr=stderr,
            )
        if (
            proc.returncode != 0
            and self.max_memory_bytes
            and (
                "out of memory" in stderr.lower()
                or proc.returncode in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS)
            )
        ):
            raise GitError(
                f"git {name} stopped: it exceeded the memory limit of "
                f"{self.max_memory_bytes} bytes",
                returncode=proc.returncode,
                stderr=stderr,
            )
        if proc.returncode != 0:
            raise GitError(
                first_error_line(stderr) or f"git {name} exited with {proc.returncode}",
                returncode=proc.returncode,
                stderr=stderr,
            )
        return out.decode("utf-8", "replace")


def first_error_line(stderr: str) -> str:
    """The most telling line of git's stderr (``fatal:``/``error:``), without prefix noise."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for prefix in ("fatal:", "error:"):
        for line in lines:
            if line.startswith(prefix):
                return line
    return lines[-1] if lines else ""
