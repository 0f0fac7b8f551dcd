"""``manage.py up`` end to end, as a user runs it: a subprocess with embedded Redis
nodes, a worker pool and the web server on a free port; other ``manage.py`` commands run
beside it with no settings; stopping and starting again loses nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from tests.support.processes import ended, start_up, up_env
from workers.runtime.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _manage(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def test_up_serves_analyses_stops_and_resumes(tmp_path: Path) -> None:
    origin = GitRepo.create(tmp_path / "origin")
    for i in range(25):
        origin.commit(f"commit {i}", {f"d/f{i % 4}.py": f"x = {i}\n" * (i % 5 + 1)})
    port = free_port()
    env = up_env(tmp_path, GITWARD_CHUNK_SIZE="4")
    state_file = tmp_path / "var" / "state.json"

    # 1. Up with no workers: the submission waits in the (persistent) embedded Redis.
    with ended(start_up(env, port, workers=0)) as proc:  # ended if anything below fails
        state = json.loads(state_file.read_text())
        assert len(state["redis_urls"]) == 3
        sub = _manage(env, "submit", str(origin.path), "--json")  # beside `up`, no settings
        assert sub.returncode == 0, sub.stderr
        repo_id = json.loads(sub.stdout)["id"]
        out = _stop(proc)
    assert "gitward stopped" in out
    assert not state_file.exists()
    for url in state["redis_urls"]:  # the nodes it started are gone
        port_n = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(OSError):
            import socket

            socket.create_connection(("127.0.0.1", port_n), timeout=1).close()

    # 2. Up again with workers: the queued repository is analysed; nothing was lost.
    proc = start_up(env, port, workers=2)
    try:
        waited = _manage(env, "submit", str(origin.path), "--wait", "--timeout", "120", "--json")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        token = _manage(env, "api_token", "admin").stdout.strip()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/repos/{repo_id}",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as res:
            body = json.loads(res.read())
        assert body["status"] == "ready", body
        assert body["commits_analyzed"] == body["commits_total"] == 25
        assert body["head"] == origin.head()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5) as res:
            assert b"Log in" in res.read()
    finally:
        with ended(proc):  # a stop that fails or times out still ends the tree
            _stop(proc)


def test_live_sockets_are_not_compressed(tmp_path: Path) -> None:
    """Browsers offer permessage-deflate; the web server declines it, so a frame the
    feed serialised once for every socket is not compressed again per socket
    (``up.WEBSOCKET_OPTIONS``)."""
    import http.cookiejar
    import urllib.parse

    from websockets.sync.client import connect

    port = free_port()
    proc = start_up(up_env(tmp_path), port, workers=0)
    base = f"http://127.0.0.1:{port}"
    try:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        opener.open(f"{base}/login/", timeout=30).read()
        csrf = next(c.value for c in jar if c.name == "csrftoken")
        form = {"username": "admin", "password": "admin-pass-123", "csrfmiddlewaretoken": csrf}
        opener.open(
            urllib.request.Request(
                f"{base}/login/",
                data=urllib.parse.urlencode(form).encode(),
                headers={"Referer": f"{base}/login/"},
            ),
            timeout=30,
        ).read()
        cookie = "; ".join(f"{c.name}={c.value}" for c in jar)
        with connect(
            f"ws://127.0.0.1:{port}/ws/ops/",
            additional_headers={"Cookie": cookie},
            origin=base,  # type: ignore[arg-type]
            compression="deflate",  # offered, as a browser does
        ) as ws:
            assert ws.request is not None and "permessage-deflate" in str(
                ws.request.headers.get("Sec-WebSocket-Extensions")
            )
            assert ws.response is not None
            assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
            assert json.loads(ws.recv(timeout=30))["type"] == "snapshot"
    finally:
        with ended(proc):  # a stop that fails or times out still ends the tree
            _stop(proc)
