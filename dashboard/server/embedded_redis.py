"""The embedded Redis nodes ``manage.py up`` starts when ``REDIS_URLS`` is unset.

Their URLs go into ``var/state.json`` so that other ``manage.py`` commands run beside a
running ``up`` find the same nodes with no settings; the nodes keep an append-only file
under ``var/redis/`` so queued work survives a restart.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from django.conf import settings

from workers.runtime import RedisNode

BASE_PORT = 6390


class AlreadyRunning(RuntimeError):
    pass


def read_state() -> dict[str, Any]:
    try:
        data = json.loads(Path(settings.STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(state: dict[str, Any]) -> None:
    path = Path(settings.STATE_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def clear_state() -> None:
    Path(settings.STATE_FILE).unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_nodes(count: int) -> list[RedisNode]:
    """Start ``count`` persistent nodes, reusing the ports of the previous run.

    Refuses to start when the state file names a live ``up`` process: two embedded
    systems sharing ``var/`` would fight over the same append-only files.
    """
    state = read_state()
    owner = state.get("pid")
    if isinstance(owner, int) and owner != os.getpid() and _pid_alive(owner):
        raise AlreadyRunning(f"gitward is already running here (pid {owner}); stop it first")
    previous = [int(p) for p in state.get("ports", []) if isinstance(p, int)]
    nodes: list[RedisNode] = []
    candidates = iter(previous + [BASE_PORT + i for i in range(64)])
    try:
        for i in range(count):
            port = next(p for p in candidates if _port_free(p))
            node = RedisNode(
                Path(settings.VAR_DIR) / "redis" / f"node{i}", port=port, persistent=True
            )
            nodes.append(node.start())
    except Exception:
        stop_nodes(nodes)
        raise
    return nodes


def stop_nodes(nodes: list[RedisNode]) -> None:
    for node in nodes:
        node.stop()


def use_redis(urls: list[str]) -> None:
    """Point this process (and children, through the environment) at ``urls``."""
    settings.REDIS_URLS = list(urls)
    settings.REDIS_URL = urls[0]
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [urls[0]]
    os.environ["REDIS_URLS"] = ",".join(urls)
    os.environ.setdefault("REDIS_URL", urls[0])
