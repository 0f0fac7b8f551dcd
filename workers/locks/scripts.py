"""What the masters store and run: the JSON lock value and the compare-and-set Lua scripts.

The value is JSON with the nonce first (``{"nonce":"…",…}``) so every script can match the
holder by prefix without parsing JSON in Lua: only the client that wrote a value can extend,
release or retag it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# KEYS = resources; ARGV = value, ttl_ms, nonce prefix.
# All keys or none on this master: refuse (returning -index of the first foreign key) if any
# key holds someone else's value. A key already holding *our* nonce is overwritten: that only
# happens when redis-py re-sent the script after a dropped connection, and re-setting PX then
# makes the server-side lease longer than the one the client computed from its earlier start
# time, never shorter, so the client's validity stays a lower bound.
ACQUIRE = """
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #ARGV[3]) ~= ARGV[3] then return -i end
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# KEYS = resources; ARGV = nonce prefix, ttl_ms. Extends only if every key is still ours;
# a missing key is NOT re-created (it means the lease lapsed on this master, and re-creating
# it would hide a loss from the heartbeat).
EXTEND = """
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if (not v) or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return -i end
end
for i, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
"""

# KEYS = resources; ARGV = nonce prefix. Deletes the keys that are still ours; returns count.
RELEASE = """
local n = 0
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"""

# KEYS = resources; ARGV = nonce prefix, then one new value per key. Rewrites our own values
# (to record the fencing token) keeping their TTL; returns how many keys were rewritten.
RETAG = """
local n = 0
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
    redis.call('SET', key, ARGV[i + 1], 'KEEPTTL')
    n = n + 1
  end
end
return n
"""

SCRIPTS = {"acquire": ACQUIRE, "extend": EXTEND, "release": RELEASE, "retag": RETAG}


def nonce_prefix(nonce: str) -> str:
    """The CAS prefix every script matches: the start of a value written by ``nonce``."""
    return '{"nonce":"' + nonce + '",'


def encode(nonce: str, holder: Mapping[str, Any]) -> tuple[str, str]:
    """Return ``(value, prefix)``: the JSON value with ``nonce`` first, and its CAS prefix."""
    prefix = nonce_prefix(nonce)
    body = json.dumps(
        {k: v for k, v in holder.items() if k != "nonce"},
        separators=(",", ":"),
        sort_keys=True,
        default=str,
    )
    return prefix + body[1:], prefix


def decode(raw: bytes) -> tuple[str | None, dict[str, Any]]:
    """Return ``(nonce, holder)`` of a stored value; foreign values give ``(None, {"raw": …})``."""
    text = raw.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return None, {"raw": text}
    if not isinstance(data, dict):
        return None, {"raw": text}
    nonce = data.pop("nonce", None)
    return (str(nonce) if nonce is not None else None), data


def glob_escape(text: str) -> str:
    """``text`` as a literal SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
