"""Git hardening and resource limits, proved one row of the attack catalog
(docs/security.md) at a time: rows G3, G7, G8, G14-G21.

Repository-content attacks go through the real pipeline (``submit_repository`` of a
local path, then real RQ workers); network attacks use loopback servers and call the
mirror layer directly, because the URL policy refuses loopback URLs before git runs.
Every "must not run" check uses a sentinel file that must never appear.
"""

from __future__ import annotations

import errno
import http.server
import os
import re
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.models import Commit, FileChange, JobRun, Repository
from dashboard.repositories.lifecycle import current_fingerprint, submit_repository
from tests.conftest import run_workers
from tests.support.checked_threads import CheckedThread
from tests.support.gitrepo import GitRepo, reference_commits
from tests.support.stored_commits import assert_matches_reference
from workers.analysis import numstat
from workers.analysis.history import list_commits, stream_commits
from workers.analysis.numstat import CommitTooLarge, HistoryError
from workers.git.fetch_errors import RepositoryTooLarge, RepositoryUnavailable
from workers.git.mirror import HEAD_REF, pins_for, sync_mirror
from workers.git.runner import GitError, GitTimeout, ProcessGroups, Runner
from workers.git.workspace import mirror_path
from workers.remotes.branches import normalise_branch
from workers.remotes.parse import Remote
from workers.remotes.policy import InvalidRemote

pytestmark = pytest.mark.django_db(transaction=True)

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Ada",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}

HOOKS = (
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "post-index-change",
    "fsmonitor-watchman",
)


# --------------------------------------------------------------------------- helpers


def git(git_dir: Path, *args: str, input: bytes | None = None) -> str:
    out = subprocess.run(
        ["git", "--git-dir", str(git_dir), *args],
        env=GIT_ENV,
        input=input,
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


def bare_repo(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", "--bare", str(path)], env=GIT_ENV, check=True)
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    return path


def fast_import(path: Path, stream: bytes) -> Path:
    bare_repo(path)
    git(path, "fast-import", "--quiet", input=stream)
    return path


def commit_tree(git_dir: Path, tree: str, message: str = "m", parent: str | None = None) -> str:
    args = ["commit-tree", tree, "-m", message]
    if parent:
        args += ["-p", parent]
    sha = git(git_dir, *args)
    git(git_dir, "update-ref", "refs/heads/main", sha)
    return sha


def marker_script(bin_dir: Path, markers: Path, name: str, filename: str | None = None) -> Path:
    """An executable ``bin_dir/<filename or name>`` that, if anything ever runs it,
    leaves ``markers/<name>``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    markers.mkdir(parents=True, exist_ok=True)
    script = bin_dir / (filename or name)
    script.write_text(f"#!/bin/sh\ntouch '{markers / name}'\nexit 0\n")
    script.chmod(0o755)
    return script


def assert_matches(repo: Repository, ref: dict[str, dict[str, Any]]) -> None:
    """Stored results equal what git itself reported (computed before the repository
    was made hostile, so the reference run cannot trip the sentinels)."""
    assert_matches_reference(repo, ref)


def analyse(url: Path, branch: str | None = None) -> Repository:
    repo, _ = submit_repository(url=str(url), branch=branch)
    run_workers()
    repo.refresh_from_db()
    return repo


def group_members(pgids: set[int]) -> list[tuple[int, str, str]]:
    """(pid, state, comm) of every live process whose process group is in ``pgids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in pgids:
            found.append((int(entry), state, comm))
    return found


class RecordingGroups(ProcessGroups):
    """ProcessGroups that remembers every process group it ever saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    def add(self, pgid: int) -> None:
        self.seen.add(pgid)
        super().add(pgid)


class CountingRunner(Runner):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        self.calls.append(list(args))
        return super().__call__(args, **kw)


class Server:
    """A loopback HTTP server in a thread that records every request it receives."""

    def __init__(self, respond: Callable[[http.server.BaseHTTPRequestHandler], None]) -> None:
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                outer.requests.append((self.path, self.headers.get("Host", "")))
                respond(self)

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(respond: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Server:
        s = Server(respond)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def static_files(root: Path) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """Serve files under ``root`` (git's dumb HTTP protocol needs nothing more)."""

    def respond(h: http.server.BaseHTTPRequestHandler) -> None:
        rel = h.path.split("?", 1)[0].lstrip("/")
        target = (root / rel).resolve()
        if root.resolve() not in target.parents or not target.is_file():
            h.send_error(404)
            return
        data = target.read_bytes()
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return respond


def sync(tmp_path: Path, url: str, runner: Runner | None = None, **kw: Any) -> str:
    return sync_mirror(
        workspace=tmp_path / "ws",
        repo_id=1,
        git_url=url,
        branch=kw.pop("branch", ""),
        runner=runner or Runner(),
        timeout=kw.pop("timeout", 30),
        **kw,
    )


# --------------------------------------------------------------------------- G18 / hooks


def test_hostile_repo_config_and_hooks_never_run_and_results_stay_correct(
    tmp_path: Path,
) -> None:
    """G18 (and hooks): the submitted repository's ``.git/config`` names
    commands for core.fsmonitor, core.sshCommand, core.pager, diff.external, filters,
    textconv, uploadpack.packObjectsHook, credential.helper, core.hooksPath, and every
    hook writes a sentinel; analysing it through the real pipeline runs none of them."""
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("first", {"a.txt": "one\n", "b.py": "print(1)\n"})
    origin.commit("second", {"a.txt": "one\ntwo\n", ".gitattributes": "* filter=evil diff=evil\n"})
    ref = reference_commits(origin.path)  # before the repository turns hostile

    markers, bin_dir = tmp_path / "markers", tmp_path / "bin"
    config = {
        "core.fsmonitor": "fsmonitor",
        "core.sshCommand": "sshcommand",
        "core.pager": "pager",
        "core.editor": "editor",
        "core.askPass": "askpass",
        "core.alternateRefsCommand": "alternaterefs",
        "core.gitProxy": "gitproxy",
        "diff.external": "diffexternal",
        "diff.evil.textconv": "textconv",
        "diff.evil.command": "diffcommand",
        "filter.evil.clean": "clean",
        "filter.evil.smudge": "smudge",
        "filter.evil.process": "process",
        "uploadpack.packObjectsHook": "packobjectshook",
        "credential.helper": "credential",
        "sequence.editor": "seqeditor",
        "pager.log": "pagerlog",
    }
    for key, name in config.items():
        script = marker_script(bin_dir, markers, name)
        value = f"!{script}" if key == "credential.helper" else str(script)
        origin.git("config", key, value)
    hooks_path = tmp_path / "hookspath"
    for hook in HOOKS:
        marker_script(origin.path / ".git" / "hooks", markers, f"hook-{hook}", hook)
        marker_script(hooks_path, markers, f"hookspath-{hook}", hook)
    origin.git("config", "core.hooksPath", str(hooks_path))

    repo = analyse(origin.path)
    assert repo.status == Repository.Status.READY, repo.error
    assert_matches(repo, ref)
    assert sorted(os.listdir(markers)) == []


def test_hostile_config_written_into_the_mirror_is_not_honoured(
    tmp_path: Path, settings: Any
) -> None:
    """G18: even a mirror directory whose config/hooks were tampered with (the worker's
    own workspace) runs nothing on the next fetch and analysis: every git process gets
    the ``-c`` overrides (hooksPath=/dev/null, fsmonitor=false, ...) and a fixed env."""
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("first", {"a.txt": "one\n"})
    repo = analyse(origin.path)
    assert repo.status == Repository.Status.READY, repo.error
    mirror = mirror_path(Path(settings.WORKSPACE), repo.pk)
    markers, bin_dir = tmp_path / "markers", tmp_path / "bin"
    for key in (
        "core.fsmonitor",
        "core.pager",
        "diff.external",
        "core.sshCommand",
        "core.alternateRefsCommand",
    ):
        git(mirror, "config", key, str(marker_script(bin_dir, markers, key)))
    git(mirror, "config", "credential.helper", f"!{marker_script(bin_dir, markers, 'cred')}")
    hooks_path = tmp_path / "hookspath"
    for hook in HOOKS:
        marker_script(mirror / "hooks", markers, f"hook-{hook}", hook)
        marker_script(hooks_path, markers, f"hookspath-{hook}", hook)
    git(mirror, "config", "core.hooksPath", str(hooks_path))

    origin.commit("second", {"a.txt": "one\ntwo\n", "c.txt": "x\n"})
    repo = analyse(origin.path)
    assert repo.status == Repository.Status.READY, repo.error
    assert_matches(repo, reference_commits(origin.path))
    assert sorted(os.listdir(markers)) == []


# --------------------------------------------------------------------------- G17


def test_submodules_are_never_fetched_or_recursed(
    tmp_path: Path, servers: Any, settings: Any
) -> None:
    """G17: ``.gitmodules`` pointing at a local decoy repository, at ``file://`` and
    ``ext::`` URLs and at a loopback HTTP decoy, with gitlinks to the decoy's commit:
    the decoy is never read (its commit never reaches the mirror, the HTTP decoy gets
    zero requests, the ext:: sentinel never appears); the gitlinks are ordinary changes."""
    decoy = GitRepo.create(tmp_path / "decoy")
    decoy_sha = decoy.commit("secret", {"secret.txt": "top secret\n"})
    http_decoy = servers(lambda h: h.send_error(404))
    marker = tmp_path / "ext-marker"
    origin = GitRepo.create(tmp_path / "origin")
    origin.write(
        ".gitmodules",
        f'[submodule "local"]\n\tpath = local\n\turl = {decoy.path}\n'
        f'[submodule "fileurl"]\n\tpath = fileurl\n\turl = file://{decoy.path}\n'
        f'[submodule "ext"]\n\tpath = ext\n\turl = "ext::sh -c touch% {marker}"\n'
        f'[submodule "http"]\n\tpath = http\n\turl = http://127.0.0.1:{http_decoy.port}/d.git\n'
        '[submodule "up"]\n\tpath = up\n\turl = ../../../../decoy\n',
    )
    origin.git("add", ".gitmodules")
    for name in ("local", "fileurl", "ext", "http", "up"):
        origin.git("update-index", "--add", "--cacheinfo", f"160000,{decoy_sha},{name}")
    origin.commit("submodules")
    ref = reference_commits(origin.path)

    repo = analyse(origin.path)
    assert repo.status == Repository.Status.READY, repo.error
    assert_matches(repo, ref)
    mirror = mirror_path(
        Path(repo.pk and __import__("django.conf").conf.settings.WORKSPACE), repo.pk
    )
    assert not (mirror / "modules").exists()
    with pytest.raises(subprocess.CalledProcessError):
        git(mirror, "cat-file", "-e", decoy_sha)
    assert not marker.exists()
    assert http_decoy.requests == []
    assert FileChange.objects.filter(repository=repo, path="local").count() == 1


# --------------------------------------------------------------------------- G16


def test_symlinks_in_content_are_recorded_as_changes_and_never_followed(
    tmp_path: Path, settings: Any
) -> None:
    """G16: links to /etc/passwd, ``../../outside``, a FIFO and a sentinel path are
    stored as file changes (their target text is the blob); analysis reads the object
    database only, so no link is created in the workspace and the FIFO is never opened
    (a reader would block forever; a watchdog probes for one)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sentinel = tmp_path / "outside-sentinel"
    sentinel.write_text("host secret\n")
    before = sentinel.stat()
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("plain", {"README.md": "hi\n"})
    for name, target in (
        ("passwd", "/etc/passwd"),
        ("up", "../../outside"),
        ("fifo-link", str(fifo)),
        ("sentinel-link", str(sentinel)),
        ("dir-link", "/etc"),
    ):
        os.symlink(target, origin.path / name)
        origin.git("add", "--", name)
    origin.commit("links")
    ref = reference_commits(origin.path)

    opened: list[str] = []
    stop = threading.Event()

    def watchdog() -> None:
        while not stop.is_set():
            try:  # succeeds only while some process has the FIFO open for reading
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO
            else:
                opened.append("fifo")
                os.close(fd)  # EOF for the reader: unblock it
            time.sleep(0.02)

    t = CheckedThread(target=watchdog, name="FIFO watchdog", daemon=True)
    t.start()
    try:
        repo = analyse(origin.path)
    finally:
        stop.set()
        t.join()
    assert repo.status == Repository.Status.READY, repo.error
    assert_matches(repo, ref)
    assert opened == []
    link = FileChange.objects.get(repository=repo, path="passwd")
    assert (link.added, link.deleted, link.binary) == (1, 0, False)  # the target text
    workspace = Path(settings.WORKSPACE)
    assert not [p for p in workspace.rglob("*") if p.is_symlink()]
    assert not (workspace / "outside").exists()
    assert sentinel.read_text() == "host secret\n"
    assert sentinel.stat().st_mtime_ns == before.st_mtime_ns
    assert stat.S_ISFIFO(fifo.stat().st_mode)


# --------------------------------------------------------------------------- G8


def test_http_redirects_are_not_followed(tmp_path: Path, servers: Any) -> None:
    """G8: the remote answers smart-HTTP discovery with 301/302 to a loopback "metadata"
    decoy. The decoy gets zero requests and the sync fails with a readable reason
    (control: plain git with redirects on does reach the decoy)."""
    decoy = servers(lambda h: h.send_error(404))
    for code in (301, 302):

        def redirect(h: http.server.BaseHTTPRequestHandler, code: int = code) -> None:
            h.send_response(code)
            h.send_header("Location", f"http://127.0.0.1:{decoy.port}{h.path}")
            h.send_header("Content-Length", "0")
            h.end_headers()

        remote = servers(redirect)
        url = f"http://127.0.0.1:{remote.port}/repo.git"
        with pytest.raises(RepositoryUnavailable) as info:
            sync(tmp_path / str(code), url)
        assert str(info.value) == (
            "the repository host answered with a redirect, which is not followed"
        )
        assert remote.requests and decoy.requests == []
    control = subprocess.run(
        ["git", "-c", "http.followRedirects=true", "ls-remote", url],
        env=GIT_ENV,
        capture_output=True,
        timeout=30,
    )
    assert control.returncode != 0 and decoy.requests  # the decoy is reachable


# --------------------------------------------------------------------------- G14 / G15


@pytest.fixture
def hanging_server() -> Iterator[int]:
    """Accepts TCP connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = CheckedThread(target=accept, name="hanging server", daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_hanging_remote_is_killed_at_the_timeout_with_its_whole_process_group(
    tmp_path: Path, hanging_server: int
) -> None:
    """G14 + G15: a remote that accepts and never answers. At ``timeout`` git's process
    group (git, git-remote-http) is SIGKILLed, GitTimeout says what happened, and no
    process of that group survives."""
    groups = RecordingGroups()
    peak: list[list[tuple[int, str, str]]] = []
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            members = group_members(set(groups.seen))
            if len(members) > len(peak[-1] if peak else []):
                peak.append(members)
            time.sleep(0.05)

    t = CheckedThread(target=monitor, name="process-group monitor", daemon=True)
    t.start()
    started = time.monotonic()
    try:
        with pytest.raises(GitTimeout) as info:
            sync(
                tmp_path,
                f"http://127.0.0.1:{hanging_server}/r.git",
                Runner(groups=groups),
                timeout=2,
            )
    finally:
        stop.set()
        t.join()
    elapsed = time.monotonic() - started
    assert str(info.value) == "git fetch timed out after 2s and was stopped"
    assert elapsed < 10
    comms = {comm for _, _, comm in peak[-1]}
    assert "git" in comms and any("remote-http" in c for c in comms), peak
    deadline = time.monotonic() + 5
    while (alive := [m for m in group_members(groups.seen) if m[1] != "Z"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert alive == []
    assert not list((tmp_path / "ws" / "tmp").iterdir())  # half-made clone removed


def test_stalled_transfer_aborts_on_low_speed_and_401_never_prompts(
    tmp_path: Path, hanging_server: int, servers: Any
) -> None:
    """G14: with the low-speed limit (env overrides the ``-c`` default of 60 s) git
    aborts a silent remote by itself; a 401 fails at once instead of prompting
    (GIT_TERMINAL_PROMPT=0, no askpass, no credential helper)."""
    runner = Runner(extra_env={"GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "1"})
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        sync(tmp_path / "slow", f"http://127.0.0.1:{hanging_server}/r.git", runner, timeout=30)
    assert not isinstance(info.value, GitTimeout)
    assert "too slow" in str(info.value).lower() or "timed out" in str(info.value).lower()
    assert time.monotonic() - started < 15

    def unauthorized(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(401)
        h.send_header("WWW-Authenticate", 'Basic realm="x"')
        h.send_header("Content-Length", "0")
        h.end_headers()

    auth = servers(unauthorized)
    started = time.monotonic()
    with pytest.raises(RepositoryUnavailable) as info2:
        sync(tmp_path / "auth", f"http://127.0.0.1:{auth.port}/r.git", timeout=30)
    assert str(info2.value) == "repository requires authentication or is not readable"
    assert time.monotonic() - started < 10


# --------------------------------------------------------------------------- G7 pinning


def test_http_connects_to_the_pinned_address_even_if_the_name_does_not_resolve(
    tmp_path: Path, servers: Any
) -> None:
    """G7: ``pinned={"host:port": [addr]}`` becomes ``-c http.curloptResolve``; git then
    connects to the validated address (a DNS rebinding cannot redirect it). The name
    ``pinned.test`` resolves nowhere, yet the loopback server gets the fetch."""
    origin = GitRepo.create(tmp_path / "origin")
    origin.commit("first", {"a.txt": "1\n"})
    head = origin.commit("second", {"a.txt": "1\n2\n"})
    served = tmp_path / "srv"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(origin.path), str(served / "r.git")],
        env=GIT_ENV,
        check=True,
    )
    git(served / "r.git", "update-server-info")
    server = servers(static_files(served))
    url = f"http://pinned.test:{server.port}/r.git"

    with pytest.raises(RepositoryUnavailable) as info:
        sync(tmp_path / "nopin", url)
    assert str(info.value) == "host name could not be resolved"
    assert server.requests == []

    got = sync(tmp_path / "pin", url, pinned={f"pinned.test:{server.port}": ["127.0.0.1"]})
    assert got == head
    assert server.requests and all(
        host == f"pinned.test:{server.port}" for _, host in server.requests
    )
    with pytest.raises(ValueError):
        sync(tmp_path / "bad", url, pinned={"pinned.test": ["127.0.0.1"]})
    with pytest.raises(ValueError):
        sync(tmp_path / "bad", url, pinned={f"pinned.test:{server.port}": ["not-an-ip"]})


def test_pins_for_turns_validated_addresses_into_curlopt_resolve(git_repo: GitRepo) -> None:
    """G7: ``pins_for(remote)`` maps the policy's validated addresses to
    ``http.curloptResolve=host:port:addr,[v6]`` placed before the fetch; no pin for
    ssh/git remotes (curl only does http) or for IP literals."""
    remote = Remote(
        url="https://git.example.com/o/r",
        scheme="https",
        host="git.example.com",
        port=None,
        pinned_addresses=("93.184.216.34", "2606:2800:220:1::1"),
    )
    pins = pins_for(remote)
    assert pins == {"git.example.com:443": ["93.184.216.34", "2606:2800:220:1::1"]}
    assert pins_for(Remote("ssh://h/r", "ssh", "h", None, ("93.184.216.34",))) == {}
    assert pins_for(Remote("http://1.2.3.4/r", "http", "1.2.3.4", 8080, ("1.2.3.4",))) == {}
    runner = CountingRunner()
    sync(git_repo.path.parent, str(git_repo.path), runner, pinned=pins)
    (fetch,) = [c for c in runner.calls if "fetch" in c]
    assert fetch[:2] == [
        "-c",
        "http.curloptResolve=git.example.com:443:93.184.216.34,[2606:2800:220:1::1]",
    ]


# --------------------------------------------------------------------------- G3


def test_option_like_branch_never_reaches_git(tmp_path: Path, git_repo: GitRepo) -> None:
    """G3: a branch such as ``--upload-pack=touch /tmp/x`` is refused by
    ``normalise_branch`` (so it cannot be submitted), and ``sync_mirror`` itself refuses
    a branch or URL starting with '-' before starting any git process."""
    marker = tmp_path / "pwn"
    evil = f"--upload-pack=touch {marker}"
    with pytest.raises(InvalidRemote):
        normalise_branch(evil)
    with pytest.raises(InvalidRemote):
        submit_repository(url=str(git_repo.path), branch=evil)
    assert Repository.objects.count() == 0
    for branch in (evil, "-u", "-", "main/../x", "a..b", "HEAD@{-1}", "x\ny", "-c"):
        runner = CountingRunner()
        with pytest.raises(RepositoryUnavailable, match="invalid branch name"):
            sync(tmp_path, str(git_repo.path), runner, branch=branch)
        assert runner.calls == []
    runner = CountingRunner()
    with pytest.raises(RepositoryUnavailable, match="invalid repository URL"):
        sync(tmp_path, evil, runner)
    assert runner.calls == []
    assert not marker.exists()
    # A valid branch is used inside the refspec, after --end-of-options.
    runner = CountingRunner()
    sync(tmp_path, str(git_repo.path), runner, branch="main")
    (fetch,) = [c for c in runner.calls if "fetch" in c]
    assert fetch[fetch.index("--end-of-options") + 2] == f"+refs/heads/main:{HEAD_REF}"


# --------------------------------------------------------------------------- fsck / G21


def git_finding(origin: Path, msg_id: str) -> str:
    """``"<msg-id>: <git's text> in object <sha12>"`` as ``git fsck --strict`` reports
    the finding for ``origin`` (index-pack prints the same text at fetch)."""
    proc = subprocess.run(
        ["git", "--git-dir", str(origin), "fsck", "--strict", "--no-dangling"],
        env=GIT_ENV,
        capture_output=True,
        text=True,
    )
    m = re.search(rf"^(?:error|warning) in \w+ ([0-9a-f]+): {msg_id}: (.*)$", proc.stderr, re.M)
    assert m, proc.stderr
    return f"{msg_id}: {m.group(2).strip()} in object {m.group(1)[:12]}"


def assert_refused_naming(repo: Repository, origin: Path, msg_id: str) -> None:
    """Failed, not retried, nothing stored, and the error names git's exact finding."""
    assert repo.status == Repository.Status.FAILED
    assert repo.error.startswith("repository contains malformed objects, refused by git fsck (")
    assert git_finding(origin, msg_id) in repo.error
    assert JobRun.objects.get(repository=repo, kind="sync").attempts == 1
    assert Commit.objects.count() == 0


@pytest.mark.parametrize(
    ("entry", "detail"),
    [
        (".git", "hasDotgit"),
        ("..", "hasDotdot"),
        (".GIT", "hasDotgit"),
        (".", "hasDot"),
        ("git~1", "hasDotgit"),  # NTFS short name of .git
        (".git. ", "hasDotgit"),  # NTFS drops trailing dots and spaces
        (".g\u200cit", "hasDotgit"),  # HFS+ ignores zero-width characters
    ],
)
def test_malformed_objects_are_refused_at_fetch(tmp_path: Path, entry: str, detail: str) -> None:
    """transfer.fsckObjects: a tree with a ``.git``/``..`` entry (or an alias a
    case-insensitive, NTFS or HFS+ checkout would write as ``.git``) is refused at
    fetch although git only warns about it; the repository fails (not retried) with
    git's exact finding."""
    origin = bare_repo(tmp_path / "origin.git")
    blob = git(origin, "hash-object", "-w", "--stdin", input=b"x\n")
    tree = git(
        origin,
        "hash-object",
        "-t",
        "tree",
        "--literally",
        "-w",
        "--stdin",
        input=f"100644 {entry}\0".encode() + bytes.fromhex(blob),
    )
    commit_tree(origin, tree)
    repo = analyse(origin)
    assert_refused_naming(repo, origin, detail)


MALICIOUS_GITMODULES = {
    "gitmodulesName": '[submodule "../../modules/evil"]\n\tpath = a\n\turl = https://e.x/a\n',
    "gitmodulesUrl": '[submodule "a"]\n\tpath = a\n\turl = -upload-pack=touch$IFS/tmp/x\n',
    "gitmodulesPath": '[submodule "a"]\n\tpath = -evil\n\turl = https://e.x/a\n',
    "gitmodulesUpdate": '[submodule "a"]\n\tpath = a\n\turl = https://e.x/a\n\tupdate = !touch x\n',
}


@pytest.mark.parametrize("msg_id", sorted(MALICIOUS_GITMODULES))
def test_a_malicious_gitmodules_is_refused_naming_the_finding(tmp_path: Path, msg_id: str) -> None:
    """Submodule tricks (CVE-2018-11235, CVE-2018-17456, CVE-2019-19604) stay refused
    even though gitward never recurses into submodules."""
    origin = bare_repo(tmp_path / "origin.git")
    modules = git(
        origin, "hash-object", "-w", "--stdin", input=MALICIOUS_GITMODULES[msg_id].encode()
    )
    tree = git(
        origin,
        "mktree",
        input=f"100644 blob {modules}\t.gitmodules\n160000 commit {'1' * 40}\ta\n".encode(),
    )
    commit_tree(origin, tree)
    assert_refused_naming(analyse(origin), origin, msg_id)


@pytest.mark.parametrize(
    ("mode", "msg_id"), [("120000", "gitmodulesSymlink"), ("40000", "gitmodulesBlob")]
)
def test_a_gitmodules_that_is_not_a_file_is_refused(tmp_path: Path, mode: str, msg_id: str) -> None:
    origin = bare_repo(tmp_path / "origin.git")
    target = git(origin, "hash-object", "-w", "--stdin", input=b"../../.git/config")
    if mode == "40000":
        target = git(origin, "mktree", input=f"100644 blob {target}\tx\n".encode())
    kind = "tree" if mode == "40000" else "blob"
    tree = git(origin, "mktree", input=f"{mode} {kind} {target}\t.gitmodules\n".encode())
    commit_tree(origin, tree)
    assert_refused_naming(analyse(origin), origin, msg_id)


def test_an_oversized_gitattributes_line_is_refused(tmp_path: Path) -> None:
    """CVE-2022-23521: git checks .gitattributes lines at fetch (2.39.1 and later)."""
    origin = bare_repo(tmp_path / "origin.git")
    attrs = git(origin, "hash-object", "-w", "--stdin", input=b"*" * 5000 + b" text\n")
    tree = git(origin, "mktree", input=f"100644 blob {attrs}\t.gitattributes\n".encode())
    commit_tree(origin, tree)
    assert_refused_naming(analyse(origin), origin, "gitattributesLineLength")


@pytest.mark.parametrize(
    ("entries", "msg_id"),
    [
        ([("100644", "a"), ("100644", "a")], "duplicateEntries"),
        ([("100644", "b"), ("100644", "a")], "treeNotSorted"),
        ([("100644", "a/b")], "fullPathname"),
        ([("160000", "sub", "0" * 40)], "nullSha1"),
    ],
)
def test_corrupt_trees_are_refused_naming_the_finding(
    tmp_path: Path, entries: list[tuple[str, ...]], msg_id: str
) -> None:
    """Trees whose paths are ambiguous (duplicates, unsorted, names with ``/``) or that
    name the null object: refused (git only warns about some of them).  An entry with
    an empty name is not here: the origin's own pack-objects cannot send it."""
    origin = bare_repo(tmp_path / "origin.git")
    blob = git(origin, "hash-object", "-w", "--stdin", input=b"x\n")
    raw = b"".join(
        f"{e[0]} {e[1]}".encode() + b"\0" + bytes.fromhex(e[2] if len(e) > 2 else blob)
        for e in entries
    )
    tree = git(origin, "hash-object", "-t", "tree", "--literally", "-w", "--stdin", input=raw)
    commit_tree(origin, tree)
    assert_refused_naming(analyse(origin), origin, msg_id)


@pytest.mark.parametrize(
    ("author", "message", "detail"),
    [
        ("Ada <ada@example.com>", b"nul \0 inside\n", "nulInCommit"),
        ('"><svg onload=alert(1)> <x@example.com>', b"m\n", "badName"),
    ],
)
def test_poison_commit_metadata_is_refused_at_fetch(
    tmp_path: Path, author: str, message: bytes, detail: str
) -> None:
    """G21: a NUL in a commit message or an author ``"><svg …>`` (git: badName) made
    with ``hash-object -t commit --literally`` is refused by transfer.fsckObjects, so it
    never reaches the database (PostgreSQL refuses NUL) or a template."""
    origin = bare_repo(tmp_path / "origin.git")
    blob = git(origin, "hash-object", "-w", "--stdin", input=b"x\n")
    tree = git(origin, "mktree", input=f"100644 blob {blob}\ta.txt\n".encode())
    raw = (
        f"tree {tree}\nauthor {author} 1700000000 +0000\n"
        f"committer Ada <ada@example.com> 1700000000 +0000\n\n"
    ).encode() + message
    sha = git(origin, "hash-object", "-t", "commit", "--literally", "-w", "--stdin", input=raw)
    git(origin, "update-ref", "refs/heads/main", sha)
    repo = analyse(origin)
    assert repo.status == Repository.Status.FAILED
    assert repo.error.startswith("repository contains malformed objects, refused by git fsck")
    assert detail in repo.error
    assert Commit.objects.count() == 0


def test_a_5mb_commit_message_is_stored_with_a_truncated_subject(tmp_path: Path) -> None:
    """G21: a 5 MB one-line message (plus bidi/HTML poison) is parsed and stored without
    a crash; the stored subject is cut to the parser's bound (65,536 characters)."""
    subject = "\u202e<script>alert(1)</script>" + "A" * 5_000_000
    message = (subject + "\n\nbody\n").encode()
    stream = (
        b"commit refs/heads/main\n"
        b"author Ada <ada@example.com> 1700000000 +0000\n"
        b"committer Ada <ada@example.com> 1700000000 +0000\n"
        + f"data {len(message)}\n".encode()
        + message
        + b"M 644 inline a.txt\ndata 2\nx\n"
    )
    origin = fast_import(tmp_path / "origin.git", stream)
    repo = analyse(origin)
    assert repo.status == Repository.Status.READY, repo.error
    (commit,) = Commit.objects.filter(repository=repo, fingerprint=current_fingerprint())
    assert len(commit.subject) == 65536
    assert commit.subject == subject[:65536]
    assert commit.files_changed == 1


# --------------------------------------------------------------------------- G19 / G20


def test_a_commit_with_20000_files_is_streamed_and_stored(tmp_path: Path) -> None:
    """G20 (memory-bounded streaming): one commit adding 20,000 files is parsed as a
    single record and stored in full."""
    n = 20_000
    files = b"".join(b"M 644 inline d%d/f%d.txt\ndata 2\nx\n" % (i % 100, i) for i in range(n))
    stream = (
        b"commit refs/heads/main\n"
        b"author Ada <ada@example.com> 1700000000 +0000\n"
        b"committer Ada <ada@example.com> 1700000000 +0000\n"
        b"data 4\nbig\n" + files
    )
    origin = fast_import(tmp_path / "origin.git", stream)
    repo = analyse(origin)
    assert repo.status == Repository.Status.READY, repo.error
    (commit,) = Commit.objects.filter(repository=repo, fingerprint=current_fingerprint())
    assert commit.files_changed == n and commit.insertions == n
    assert FileChange.objects.filter(commit=commit).count() == n


def git_bomb(path: Path, levels: int) -> tuple[Path, str]:
    """10 identical trees per level (kate.io git bomb): 10**(levels+1) paths in a tiny
    repository; returns (bare repo, commit)."""
    bare_repo(path)
    blob = git(path, "hash-object", "-w", "--stdin", input=b"boom\n")
    tree = git(
        path, "mktree", input="".join(f"100644 blob {blob}\tf{i}\n" for i in range(10)).encode()
    )
    for _ in range(levels):
        tree = git(
            path, "mktree", input="".join(f"040000 tree {tree}\td{i}\n" for i in range(10)).encode()
        )
    return path, commit_tree(path, tree, "bomb")


def test_a_git_bomb_ends_quickly_with_commit_too_large(tmp_path: Path) -> None:
    """G19: a 10^5-path git bomb (a few KB on disk) is fetched (it is small), but the
    analysis of its commit stops at the files-per-commit bound (``max_files``, default
    ``history.MAX_FILES``) or the record-bytes bound with CommitTooLarge, within seconds
    and with git's process group killed, instead of walking every path."""
    origin, sha = git_bomb(tmp_path / "bomb.git", levels=4)
    groups = RecordingGroups()
    head = sync(tmp_path, str(origin), Runner(groups=groups))
    assert head == sha
    mirror = mirror_path(tmp_path / "ws", 1)
    assert list_commits(mirror, HEAD_REF) == [sha]
    started = time.monotonic()
    with pytest.raises(CommitTooLarge, match="changes more than 1000 files"):
        list(
            stream_commits(mirror, [sha], git=Runner(git_dir=mirror, groups=groups), max_files=1000)
        )
    assert time.monotonic() - started < 10
    # The default bound (used by the pipeline) is far below a real bomb's 10**9 paths.
    assert numstat.MAX_FILES <= 10**6
    assert [m for m in group_members(groups.seen) if m[1] != "Z"] == []
    with pytest.raises(CommitTooLarge, match="more than 4096 bytes"):
        list(stream_commits(mirror, [sha], max_record_bytes=4096))


def test_git_memory_is_bounded_by_the_runner_limit_on_a_git_bomb(tmp_path: Path) -> None:
    """G19: git builds a commit's whole diff queue before printing it, so the parser's
    bounds alone do not cap git's own memory on a bomb (10^6 paths: ~400 MB, 30 s).
    ``Runner(max_memory_bytes=…)`` (RLIMIT_AS) makes git stop within seconds with an
    out-of-memory error instead; the same limit leaves normal analysis working."""
    origin, sha = git_bomb(tmp_path / "bomb.git", levels=5)
    limit = 128 * 1024 * 1024
    started = time.monotonic()
    with pytest.raises(HistoryError, match="out of memory"):
        list(stream_commits(origin, [sha], git=Runner(git_dir=origin, max_memory_bytes=limit)))
    assert time.monotonic() - started < 15
    with pytest.raises(GitError, match=f"exceeded the memory limit of {limit} bytes"):
        Runner(git_dir=origin, max_memory_bytes=limit).run(["log", "--numstat", "main"])
    small, _ = git_bomb(tmp_path / "small.git", levels=1)
    (record,) = stream_commits(
        small, list_commits(small, "main"), git=Runner(git_dir=small, max_memory_bytes=limit)
    )
    assert record.files_changed == 100


def test_a_repository_over_the_size_limit_is_refused_and_not_kept(tmp_path: Path) -> None:
    """G20: ``max_repo_bytes`` bounds the mirror on disk (``count-objects -v``) and, as
    RLIMIT_FSIZE, any file git writes while fetching; over it: RepositoryTooLarge, and
    neither a mirror nor a temporary clone is left behind."""
    # Many small incompressible objects: unpacked as loose objects, each below the
    # file-size limit, together above the repository limit.
    files = b"".join(
        b"M 644 inline f%d.bin\ndata 8192\n" % i + os.urandom(8192) + b"\n" for i in range(40)
    )
    stream = (
        b"commit refs/heads/main\nauthor A <a@x> 1700000000 +0000\n"
        b"committer A <a@x> 1700000000 +0000\ndata 2\nm\n" + files
    )
    loose = fast_import(tmp_path / "loose.git", stream)
    with pytest.raises(
        RepositoryTooLarge, match=r"repository is larger than the limit of 200\.0 KiB"
    ):
        sync(tmp_path, str(loose), max_repo_bytes=200 * 1024)
    # One big incompressible blob: the pack itself exceeds RLIMIT_FSIZE during fetch.
    big = fast_import(
        tmp_path / "big.git",
        b"commit refs/heads/main\nauthor A <a@x> 1700000000 +0000\n"
        b"committer A <a@x> 1700000000 +0000\ndata 2\nm\n"
        b"M 644 inline big.bin\ndata 2000000\n" + os.urandom(2_000_000) + b"\n",
    )
    with pytest.raises(
        RepositoryTooLarge, match=r"larger than the limit of 1\.0 MiB \(fetch stopped\)"
    ):
        sync(tmp_path, str(big), max_repo_bytes=1024 * 1024)
    assert not mirror_path(tmp_path / "ws", 1).exists()
    assert list((tmp_path / "ws" / "tmp").iterdir()) == []
    # An existing mirror that grows past the limit is removed.
    ok = fast_import(
        tmp_path / "ok.git",
        b"commit refs/heads/main\nauthor A <a@x> 1700000000 +0000\n"
        b"committer A <a@x> 1700000000 +0000\ndata 2\nm\nM 644 inline a\ndata 2\nx\n",
    )
    sync(tmp_path, str(ok))
    assert mirror_path(tmp_path / "ws", 1).exists()
    with pytest.raises(RepositoryTooLarge):
        sync(tmp_path, str(loose), max_repo_bytes=200 * 1024)
    assert not mirror_path(tmp_path / "ws", 1).exists()


def test_a_huge_compressible_blob_is_refused_by_the_object_limit(tmp_path: Path) -> None:
    """G20: 32 MB of zeros packs to a few KB, so only a per-object bound catches it;
    ``max_object_bytes`` refuses it with a clear error and keeps no mirror."""
    zeros = bytes(32 * 1024 * 1024)
    origin = fast_import(
        tmp_path / "zeros.git",
        b"commit refs/heads/main\nauthor A <a@x> 1700000000 +0000\n"
        b"committer A <a@x> 1700000000 +0000\ndata 2\nm\n"
        + f"M 644 inline zeros.bin\ndata {len(zeros)}\n".encode()
        + zeros
        + b"\n",
    )
    assert int(git(origin, "count-objects", "-v").split("size-pack: ")[1].split()[0]) < 1024
    with pytest.raises(RepositoryTooLarge, match=r"contains a blob of 32\.0 MiB .* 1\.0 MiB"):
        sync(tmp_path, str(origin), max_object_bytes=1024 * 1024)
    assert not mirror_path(tmp_path / "ws", 1).exists()
    # The same repository passes with the default bounds (256 MiB per object).
    assert sync(tmp_path, str(origin)) == git(origin, "rev-parse", "main")


class RecordingRunner(Runner):
    """A runner that records every git command it starts (its subcommand and options)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.commands: list[list[str]] = []

    def __call__(self, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        self.commands.append(list(args))
        return super().__call__(args, **kw)

    def scanned_everything(self) -> bool:
        return any("--batch-all-objects" in cmd for cmd in self.commands)


def _commit_file(origin: Path, name: str, content: bytes, when: int) -> str:
    """One more commit on ``origin``'s main branch adding ``name``; returns its sha."""
    parent = git(origin, "rev-parse", "refs/heads/main")
    git(
        origin,
        "fast-import",
        "--quiet",
        input=(
            f"commit refs/heads/main\ncommitter A <a@x> {when} +0000\ndata 2\nm\n"
            f"from {parent}\nM 644 inline {name}\ndata {len(content)}\n"
        ).encode()
        + content
        + b"\n",
    )
    return git(origin, "rev-parse", "refs/heads/main")


def test_an_incremental_sync_scans_only_new_objects_and_still_refuses_a_huge_one(
    tmp_path: Path,
) -> None:
    """After the first sync, the per-object check of a fetch looks only at
    objects reachable from the new head and not from the last checked one (no
    ``--batch-all-objects`` scan of the whole mirror), and still refuses a pushed object
    over the limit (G20), keeping no mirror."""
    origin = fast_import(
        tmp_path / "origin.git",
        b"commit refs/heads/main\ncommitter A <a@x> 1700000000 +0000\ndata 2\nm\n"
        b"M 644 inline a\ndata 2\nx\n",
    )
    limit = 1024 * 1024
    first = RecordingRunner()
    sync(tmp_path, str(origin), runner=first, max_object_bytes=limit)
    assert first.scanned_everything()  # a fresh mirror: nothing was checked before
    small = _commit_file(origin, "b", b"y\n", 1700000001)
    second = RecordingRunner()
    assert sync(tmp_path, str(origin), runner=second, max_object_bytes=limit) == small
    assert not second.scanned_everything()
    assert any("rev-list" in cmd and "--objects" in cmd for cmd in second.commands)
    _commit_file(origin, "zeros.bin", bytes(2 * limit), 1700000002)
    third = RecordingRunner()
    with pytest.raises(RepositoryTooLarge, match=r"contains a blob of 2\.0 MiB .* 1\.0 MiB"):
        sync(tmp_path, str(origin), runner=third, max_object_bytes=limit)
    assert not third.scanned_everything(), [c[2:4] for c in third.commands]
    assert not mirror_path(tmp_path / "ws", 1).exists()


def test_objects_a_dead_sync_fetched_unchecked_are_checked_by_the_next_sync(
    tmp_path: Path,
) -> None:
    """A sync that dies between its fetch and its size check leaves the huge object in
    the mirror, reachable from the moved head ref; the next fetch then transfers nothing
    for it. The next check still starts from the last *checked* head, so it is refused."""
    origin = fast_import(
        tmp_path / "origin.git",
        b"commit refs/heads/main\ncommitter A <a@x> 1700000000 +0000\ndata 2\nm\n"
        b"M 644 inline a\ndata 2\nx\n",
    )
    limit = 1024 * 1024
    sync(tmp_path, str(origin), max_object_bytes=limit)
    _commit_file(origin, "zeros.bin", bytes(2 * limit), 1700000001)
    mirror = mirror_path(tmp_path / "ws", 1)
    # the dead sync: its fetch completed (ref moved), its check never ran
    git(mirror, "fetch", "--quiet", str(origin), f"+refs/heads/main:{HEAD_REF}")
    _commit_file(origin, "b", b"y\n", 1700000002)
    runner = RecordingRunner()
    with pytest.raises(RepositoryTooLarge, match=r"contains a blob of 2\.0 MiB"):
        sync(tmp_path, str(origin), runner=runner, max_object_bytes=limit)
    assert not runner.scanned_everything()


def test_a_lowered_object_limit_or_an_unusable_marker_scans_the_whole_mirror(
    tmp_path: Path,
) -> None:
    """The marker records the limit it was checked under: after the limit is lowered it
    proves nothing, and the whole mirror is scanned again (refusing what is now too
    large). A marker naming a commit the mirror lacks falls back to the full scan."""
    origin = fast_import(
        tmp_path / "origin.git",
        b"commit refs/heads/main\ncommitter A <a@x> 1700000000 +0000\ndata 2\nm\n"
        b"M 644 inline zeros.bin\ndata 2097152\n" + bytes(2097152) + b"\n",
    )
    head = sync(tmp_path, str(origin))  # default limit: 256 MiB per object
    mirror = mirror_path(tmp_path / "ws", 1)
    (mirror / "gitward-checked").write_text(f"{'0' * 40} {2 * 1024 * 1024}\n")
    runner = RecordingRunner()
    assert sync(tmp_path, str(origin), runner=runner, max_object_bytes=2 * 1024 * 1024) == head
    assert runner.scanned_everything()  # the marker's commit is missing: full scan
    assert (mirror / "gitward-checked").read_text().split()[0] == head
    again = RecordingRunner()
    with pytest.raises(RepositoryTooLarge, match=r"contains a blob of 2\.0 MiB"):
        sync(tmp_path, str(origin), runner=again, max_object_bytes=1024 * 1024)
    assert again.scanned_everything()
