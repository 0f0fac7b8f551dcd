"""What a process needs around the work: its process tree, fork safety, the Redis
servers it may start, Redis URLs, and failpoints for fault tests.
See docs/testing.md#failpoints."""

from __future__ import annotations

from workers.runtime.failpoints import altered, failpoint, parse_failpoints, perturbs
from workers.runtime.fork_safety import ForkGuard
from workers.runtime.process_tree import die_with_parent, kill_tree
from workers.runtime.redis_server import RedisNode
from workers.runtime.redis_urls import FORM, is_sentinel_url, parse_sentinel_url, safe_sentinel_url

__all__ = [
    "FORM",
    "ForkGuard",
    "RedisNode",
    "altered",
    "die_with_parent",
    "failpoint",
    "is_sentinel_url",
    "kill_tree",
    "parse_failpoints",
    "parse_sentinel_url",
    "perturbs",
    "safe_sentinel_url",
]
