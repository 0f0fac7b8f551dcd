"""Load another script of ``bench/`` as a module, once per process.

The scripts are run as files (``python bench/NAME.py``), not as a package, and several
share a name with one of gitward's own packages (``bench/live.py`` and ``live/``), so a
plain ``import live`` would find the wrong one. ``sibling("live")`` loads
``bench/live.py`` under the module name ``_gitward_bench_live`` and returns the module
already loaded on a second call (a script loading ``analytics`` and ``analysis``, which
``analytics`` loads too, runs each once)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent


def sibling(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (loaded on the first call, then the same one)."""
    key = f"_gitward_bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
