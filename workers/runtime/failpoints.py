"""Named fault-injection points for the fault tests and the chaos script.

``GITWARD_FAILPOINTS="analyze.before_write=stop,sync.fetched=kill"`` makes the process
that reaches a named point act on itself, for real:

- ``stop``   SIGSTOP (a long GC pause / a stalled VM: the whole process freezes);
- ``kill``   SIGKILL (a crash: no clean-up, no exception handlers);
- ``sleep:S`` sleep S seconds;
- ``raise``  raise ``FailpointError`` (an ordinary exception in the job);
- ``alter``  nothing here: the caller asks ``altered(name)`` and alters its own data
  (``analyze.alter_row`` changes one stored file row, for the verifier's tests:
  docs/analytics.md#verification).
- ``perturb:N`` the point's caller changes its output for one key in N (chosen by the
  key's SHA-256, so the same keys every time): :func:`perturbs` answers. It stands for a
  code version that silently stores other numbers, e.g. ``analyze.perturb#<fingerprint>
  =perturb:200`` adds one insertion to 1 commit in 200 of that analyzer version
  (docs/rollouts.md#result-contract).

``name#tag=action`` arms a point for one tag only (jobs pass the repository name), so
one "poison" repository can crash its worker every time while the others run.

With ``GITWARD_FAILPOINTS_ONCE=<dir>`` each point fires once across all processes: the
first process to reach it creates ``<dir>/<name>`` (O_EXCL, so exactly one wins) and
later ones pass, e.g. so that the retry of a crashed job can succeed. ``action*N``
(e.g. ``raise*3``) fires N times instead of once (markers ``<name>.1`` … ``<name>.N``).

Unset (the default) every point is a dictionary lookup and nothing else. The variables
are read from the environment at call time so a test can set them for one worker;
``dashboard/settings.py`` validates them at start-up with ``parse_failpoints`` (this module
imports no Django), so a typo stops the process before any job runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time

__all__ = [
    "EXPECTED", "FailpointError", "altered", "failpoint", "parse_failpoints", "perturbs",
]  # fmt: skip

#: ``name`` or ``name#tag``: dotted point names; a tag is anything but ``,`` and ``=``.
_POINT = re.compile(r"[A-Za-z0-9_.-]+(?:#[^,=]+)?")
_ACTION = re.compile(
    r"(?:stop|kill|raise|alter|sleep:(?:\d+(?:\.\d*)?|\.\d+))(?:\*[1-9]\d*)?|perturb:[1-9]\d*"
)
EXPECTED = (
    "name[#tag][=stop|kill|raise|alter|sleep:SECONDS][*N] or name[#tag]=perturb:N, comma-separated"
)


class FailpointError(RuntimeError):
    """Raised by a ``raise`` failpoint."""


def parse_failpoints(raw: str) -> dict[str, str]:
    """``{point: action}`` from a ``GITWARD_FAILPOINTS`` value; a bare name means ``raise``.

    Raises ``ValueError`` naming the first malformed item (empty items are skipped).
    """
    out: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, action = item.partition("=")
        action = action or "raise"
        if not _POINT.fullmatch(name) or not _ACTION.fullmatch(action):
            raise ValueError(f"malformed item {item!r} (expected {EXPECTED})")
        out[name] = action
    return out


def _actions() -> dict[str, str]:
    return parse_failpoints(os.environ.get("GITWARD_FAILPOINTS", ""))


def _claim(once_dir: str, key: str, times: int) -> bool:
    """Take one of the point's ``times`` firings; False when all are used up."""
    base = os.path.join(once_dir, key.replace("/", "_"))
    for n in range(1, times + 1):
        marker = base if times == 1 else f"{base}.{n}"
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return True
    return False


def _armed(name: str, tag: str) -> str | None:
    """The action ``name`` (or ``name#tag``) fires now, or None (unarmed, or its
    firings under ``GITWARD_FAILPOINTS_ONCE`` used up)."""
    if "GITWARD_FAILPOINTS" not in os.environ:
        return None
    actions = _actions()
    key = f"{name}#{tag}" if tag and f"{name}#{tag}" in actions else name
    action = actions.get(key)
    if action is None or action.startswith("perturb:"):
        return None  # a perturbation is its caller's to make (``perturbs``)
    action, _, times = action.partition("*")
    once_dir = os.environ.get("GITWARD_FAILPOINTS_ONCE")
    if once_dir and not _claim(once_dir, key, int(times or 1)):
        return None
    return action


def altered(name: str, tag: str = "") -> bool:
    """True when ``name`` is armed with ``alter`` (and fires now): the caller alters its
    data. Any other action armed there acts as ``failpoint`` does."""
    action = _armed(name, tag)
    if action is None:
        return False
    if action == "alter":
        return True
    _act(name, action)
    return False


def failpoint(name: str, tag: str = "") -> None:
    """Act on ``name`` (or ``name#tag``) if it is armed in ``GITWARD_FAILPOINTS``."""
    action = _armed(name, tag)
    if action is not None and action != "alter":
        _act(name, action)


def _act(name: str, action: str) -> None:
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    elif action == "raise":
        raise FailpointError(f"failpoint {name}")
    else:
        raise ValueError(f"unknown failpoint action {action!r} for {name}")


def perturbs(name: str, tag: str, key: str) -> bool:
    """Whether ``name`` (or ``name#tag``) is armed with ``perturb:N`` and ``key`` is one
    of the one in N keys it perturbs: those whose SHA-256 is 0 modulo N (the same keys
    in every process and every run)."""
    if "GITWARD_FAILPOINTS" not in os.environ:
        return False
    actions = _actions()
    action = actions.get(f"{name}#{tag}") if tag else None
    action = action or actions.get(name)
    if action is None or not action.startswith("perturb:"):
        return False
    every = int(action.split(":", 1)[1])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % every == 0
