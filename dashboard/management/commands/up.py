"""``manage.py up``: the whole system in one process tree.

Embedded Redis nodes (when ``REDIS_URLS`` is unset), migrations, the first admin user,
the reconciler (with the rollouts' drain checks), the worker pool — one set of workers
per staffed analyzer version plus the ``rollouts`` driver worker, following the versions
table without a restart (``workers.pool``) — and the ASGI server on ``HOST:PORT``. Ctrl-C/SIGTERM
stops the server, lets workers finish or hand back their job, then stops the nodes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import uvicorn
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from dashboard.accounts import ensure_admin
from dashboard.infra import close_thread_connections
from dashboard.operations import reconcile, record_samples
from dashboard.server import embedded_redis
from dashboard.server.web_processes import BalancedMultiprocess, bind_sockets
from dashboard.web.humanize import count
from workers.pool import Pool
from workers.runtime import RedisNode

#: The web processes' websocket options (uvicorn's defaults otherwise).
WEBSOCKET_OPTIONS: dict[str, Any] = {
    # No permessage-deflate. Uvicorn offers it and browsers accept it, and then every
    # frame is compressed once per socket, each socket holding zlib contexts of its
    # own: the text a feed serialised once for all its sockets (``dashboard.live.fanout``)
    # was compressed again for each of them (BENCHMARKS.md, "Live view": the web
    # process's CPU per frame). The live view's frames are small, ~10 a second a socket.
    "ws_per_message_deflate": False,
    # A ping every 20 s as uvicorn does, but a minute for the pong, not 20 s: a client
    # answers from its own event loop, behind every frame still queued for it, and on
    # a CPU-starved host (the load test: 2 cores for 4 web processes, 4 workers, 3 Redis
    # servers and the load generator) a late pong dropped live sockets, each an error.
    # A peer that is really gone is dropped within 80 s; until then its backlog is
    # bounded (``fanout.MAX_PENDING``).
    "ws_ping_interval": 20.0,
    "ws_ping_timeout": 60.0,
}


class Command(BaseCommand):
    help = "Start gitward: web server, worker pool and (by default) embedded Redis nodes."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=None)
        parser.add_argument("--port", type=int, default=None)
        parser.add_argument("--workers", type=int, default=None)
        parser.add_argument(
            "--web-workers",
            type=int,
            default=None,
            help="web server processes sharing the port (uvicorn workers; default "
            "$GITWARD_WEB_WORKERS: 2 per core, at least 2)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host = options["host"] or settings.HOST
        port = options["port"] if options["port"] is not None else settings.PORT
        workers = options["workers"] if options["workers"] is not None else settings.WORKERS
        if options["web_workers"] is None:
            options["web_workers"] = settings.WEB_WORKERS
        if options["web_workers"] < 1:
            raise CommandError("--web-workers must be at least 1")
        settings.PORT = port  # the websocket Origin check accepts pages served from here
        nodes: list[RedisNode] = []
        if not os.environ.get("REDIS_URLS"):
            try:
                nodes = embedded_redis.start_nodes(settings.EMBEDDED_REDIS_NODES)
            except (embedded_redis.AlreadyRunning, RuntimeError) as exc:
                raise CommandError(str(exc)) from None
            urls = [n.url for n in nodes]
            embedded_redis.use_redis(urls)
            embedded_redis.write_state(
                {
                    "pid": os.getpid(),
                    "redis_urls": urls,
                    "ports": [n.port for n in nodes],
                    "web": f"http://{host}:{port}/",
                }
            )
            self.stdout.write(f"embedded Redis nodes: {', '.join(urls)}")
        pool: Pool | None = None
        stop_reconciler = threading.Event()
        try:
            call_command("migrate", interactive=False, verbosity=0)
            password = ensure_admin()
            if password:
                self.stdout.write(
                    self.style.WARNING(
                        f"created user admin with password: {password}  (shown once)"
                    )
                )
            reconcile()
            threading.Thread(
                target=_reconcile_periodically, args=(stop_reconciler,), daemon=True
            ).start()
            if workers > 0:
                pool = Pool(
                    workers, manage_py=Path(settings.BASE_DIR) / "manage.py", env=dict(os.environ)
                )
                pool.start()
            threading.Thread(
                target=_supervise, args=(pool, nodes, stop_reconciler), daemon=True
            ).start()
            self.stdout.write(
                f"gitward is up on http://{host}:{port}/ with {count(workers, 'worker')}"
            )
            config = uvicorn.Config(
                # A factory: each web process sets up its serving (dashboard.asgi).
                "dashboard.asgi:serving",
                factory=True,
                host=host,
                port=port,
                lifespan="off",
                log_level="warning",
                ws_max_size=1 << 20,
                **WEBSOCKET_OPTIONS,
                # Idle keep-alive connections are closed after this. Uvicorn's 5 s
                # default races clients that reuse a connection after a pause of about
                # that long: the request is already on its way when the server's close
                # arrives, and the client sees "Remote end closed connection without
                # response" or "Connection reset by peer" (the load test's browsers
                # pause 2 s, more on a starved host). Longer than the usual load
                # balancer idle timeout (60 s), so the balancer closes first.
                timeout_keep_alive=75,
            )
            # Uvicorn traps SIGINT/SIGTERM while serving and re-raises them once it has
            # stopped; our own handlers make that re-raise a no-op so the clean-up below
            # (workers, Redis nodes) always runs.
            signal.signal(signal.SIGTERM, _note_signal)
            signal.signal(signal.SIGINT, _note_signal)
            # This thread now serves (or supervises the web processes) and queries no
            # more: its connection from the set-up above goes back (a pool slot, else
            # an idle server backend for the server's lifetime).
            close_thread_connections()
            if options["web_workers"] > 1:
                # Spawned processes read the settings afresh from the environment: the
                # port (for the Origin check) and the Redis URLs (set by use_redis) too.
                # The supervisor traps SIGINT/SIGTERM itself and returns once they stop.
                os.environ["PORT"] = str(port)
                config.workers = options["web_workers"]
                # The supervisor restarts a process that misses a 5 s health ping,
                # dropping its connections; on a CPU-starved host that is a busy one.
                config.timeout_worker_healthcheck = 60
                # A listening socket per process, so the kernel spreads the connections
                # evenly (dashboard/server/web_processes.py), not whichever process woke first.
                sockets = bind_sockets(host, port, options["web_workers"])
                BalancedMultiprocess(config, sockets=sockets).run()
            else:
                uvicorn.Server(config).run()
        finally:
            stop_reconciler.set()
            if pool is not None:
                self.stdout.write("stopping workers (finishing current jobs)…")
                pool.stop()
            if nodes:
                embedded_redis.stop_nodes(nodes)
                embedded_redis.clear_state()
            self.stdout.write("gitward stopped")


def _note_signal(signum: int, frame: Any) -> None:
    """Stop requested: uvicorn has already begun its graceful shutdown."""


def _reconcile_periodically(stop: threading.Event) -> None:
    while not stop.wait(settings.RECONCILE_INTERVAL):
        try:
            close_old_connections()
            reconcile()
            record_samples()
        except Exception:  # the next round retries; the error is logged
            logging.getLogger(__name__).exception("reconciler round failed")
        finally:
            # Hand this thread's connection back between rounds: with the pool of a web
            # process (dashboard/infra/dbpool.py) an idle thread would hold one of its slots
            # for the whole interval; without it, an idle server backend.
            close_thread_connections()


def _supervise(pool: Pool | None, nodes: list[RedisNode], stop: threading.Event) -> None:
    """Restart dead worker children and dead embedded Redis nodes (same port, same
    append-only file; the reconciler re-enqueues whatever a node lost)."""
    log = logging.getLogger(__name__)
    while not stop.wait(2):
        if pool is not None:
            pool.check()
        for node in nodes:
            if not node.alive() and not stop.is_set():
                log.warning("embedded Redis node on port %s died; restarting", node.port)
                try:
                    node.start()
                except RuntimeError:
                    log.exception("could not restart Redis node on port %s", node.port)
