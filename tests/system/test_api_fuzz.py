"""Schemathesis against a live server (docs/testing.md#fuzzing): the real ASGI application
under uvicorn on loopback, over this test's database and Redis masters, with a superuser's
bearer token; requests generated from ``GET /api/openapi.json`` for every operation, both
valid ones (positive) and ones that break the schema (negative). Zero server errors (5xx),
zero tracebacks in the server's log; the number of requests is reported.

``GITWARD_FUZZ_EXAMPLES`` sets the examples per operation and mode (default 10: a few
hundred requests, well within the suite's budget); ``make soak`` raises it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from dashboard.analytics.reports import KINDS
from dashboard.models import ApiToken
from tests.support.analytics_history import analysed, build
from tests.support.processes import ROOT, end_tree, worker_env
from tests.support.sysproc import wait_http
from workers.runtime.redis_server import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = int(os.environ.get("GITWARD_FUZZ_EXAMPLES", "10"))


@pytest.fixture
def api_server(settings: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """uvicorn serving ``dashboard.asgi:application`` on a free loopback port; its output
    (Django's error log included) goes to a file the test reads afterwards."""
    port = free_port()
    log = tmp_path / "server.log"
    env = worker_env(
        settings,
        tmp_path,
        GITWARD_RESOLVE_HOSTS="0",  # no DNS: the generated host names stay names
        GITWARD_RATE_API_PER_MINUTE="0",  # every request reaches its view (no 429 wall)
        GITWARD_RATE_SUBMIT_PER_MINUTE="0",
    )
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "dashboard.asgi:application",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/healthz", proc, timeout=90)
            yield {"base": base, "log": log}
        finally:
            end_tree(proc)


def test_schemathesis_finds_no_server_error(
    api_server: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The analytics operations are sent to a repository analysed from the planted
    history of tests/support/analytics_history.py (an id Schemathesis picks is a 404 before
    any parameter is read). So is the export of its rows."""
    root = User.objects.create_superuser("fuzz", password="pw-fuzz-123456")
    analysed_id = analysed(build(tmp_path / "planted")).pk
    headers = {"Authorization": f"Bearer {ApiToken.issue(root)[1]}"}
    base = api_server["base"]
    loaded = requests.get(f"{base}/api/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(loaded)
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    session = requests.Session()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=False,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                if case.path.split("/")[3:5] in [["{repo_id}", k] for k in (*KINDS, "export")]:
                    case.path_parameters = {**(case.path_parameters or {}),
                                            "repo_id": analysed_id}  # fmt: skip
                response = case.call(base_url=base, session=session, headers=headers, timeout=60)
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    server_errors.append(
                        f"{case.method} {case.formatted_path} {case.query or ''} "
                        f"{str(case.body)[:200]!r} -> {response.status_code} {response.text[:200]}"
                    )

            try:
                one()
            except Unsatisfiable:  # negative mode, and nothing in the operation to break
                assert mode is GenerationMode.NEGATIVE, operation.label

    total = sum(statuses.values())
    with capsys.disabled():
        print(
            f"\nschemathesis: {total} requests over {len(operations)} operations "
            f"({EXAMPLES} examples per operation and mode); "
            f"statuses {dict(sorted(statuses.items()))}"
        )
    assert not server_errors, "\n".join(server_errors[:20])
    assert total >= len(operations) * 2  # it really ran
    logged = api_server["log"].read_text()
    assert "Traceback" not in logged and "Internal Server Error" not in logged, logged[-4000:]


def _raw(base: str, request: bytes) -> bytes:
    """One raw HTTP/1.1 exchange with the server: its status line and headers."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request)
        return conn.recv(4096)


def test_hostile_requests_to_the_real_server_get_clean_answers(
    api_server: dict[str, Any],
) -> None:
    """What the test client cannot show: the real server's framing. A chunked body (no
    Content-Length) over the limit is a 413; a multipart body without a boundary a 400;
    a websocket handshake to a path no route names is refused with 403 (Channels'
    router raised: uvicorn answered 500 and logged the traceback)."""
    root = User.objects.create_superuser("raw", password="pw-raw-123456")
    auth = f"Bearer {ApiToken.issue(root)[1]}"
    base = api_server["base"]

    def chunks() -> Iterator[bytes]:
        yield b'{"url": "'
        for _ in range(3):
            yield b"x" * 1_000_000
        yield b'"}'

    big = requests.post(
        f"{base}/api/repos", data=chunks(), timeout=60,
        headers={"Authorization": auth, "Content-Type": "application/json"},
    )  # fmt: skip
    assert "Content-Length" not in big.request.headers  # chunked
    assert big.status_code == 413 and "larger than" in big.json()["error"]
    multipart = requests.post(
        f"{base}/api/repos", data=b"--x\r\n", timeout=30,
        headers={"Authorization": auth, "Content-Type": "multipart/form-data"},
    )  # fmt: skip
    assert multipart.status_code == 400 and "multipart" in multipart.json()["error"]
    for path in ("/ws/nowhere/", "/ws/repos/99999999999999999999/"):
        answer = _raw(
            base,
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode(),
        )
        assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    logged = api_server["log"].read_text()
    assert "Traceback" not in logged and "Internal Server Error" not in logged, logged[-4000:]
