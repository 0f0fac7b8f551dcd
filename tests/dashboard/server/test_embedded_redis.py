"""dashboard.server.embedded_redis: the persistent Redis nodes ``up`` starts itself, started for
real here (``manage.py up`` end to end is covered in tests/system/test_up.py)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from dashboard.server.embedded_redis import (
    AlreadyRunning,
    clear_state,
    read_state,
    start_nodes,
    stop_nodes,
    write_state,
)


@pytest.fixture
def var(tmp_path: Path, settings) -> Path:  # type: ignore[no-untyped-def]
    settings.VAR_DIR = tmp_path / "var"
    settings.STATE_FILE = tmp_path / "var" / "state.json"
    return tmp_path / "var"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_state_round_trips_and_bad_files_read_as_empty(var: Path) -> None:
    assert read_state() == {}
    write_state({"pid": 1, "ports": [1, 2]})
    assert read_state() == {"pid": 1, "ports": [1, 2]}
    assert not (var / "state.tmp").exists()  # written aside, then renamed over
    (var / "state.json").write_text("{not json")
    assert read_state() == {}
    (var / "state.json").write_text("[1, 2]")
    assert read_state() == {}
    clear_state()
    clear_state()  # twice is fine
    assert not (var / "state.json").exists()


def test_nodes_are_persistent_and_reuse_the_previous_ports(var: Path) -> None:
    port = _free_port()
    write_state({"pid": os.getpid(), "ports": [port]})  # our own pid: not "another up"
    nodes = start_nodes(2)
    try:
        assert nodes[0].port == port
        assert nodes[1].port != port
        for i, node in enumerate(nodes):
            client = node.client()
            assert client.ping()
            assert client.config_get("appendonly")["appendonly"] == "yes"
            assert (
                Path(client.config_get("dir")["dir"]).resolve()
                == (var / "redis" / f"node{i}").resolve()
            )
    finally:
        stop_nodes(nodes)
    assert not any(n.alive() for n in nodes)


def test_a_live_up_owning_the_state_is_refused(var: Path) -> None:
    write_state({"pid": os.getppid(), "ports": []})
    with pytest.raises(AlreadyRunning, match=f"pid {os.getppid()}"):
        start_nodes(1)
    assert not (var / "redis").exists()  # nothing was started


def test_a_dead_owner_does_not_block(var: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    write_state({"pid": proc.pid, "ports": []})
    nodes = start_nodes(1)
    try:
        assert nodes[0].client().ping()
    finally:
        stop_nodes(nodes)
