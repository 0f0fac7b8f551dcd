"""Every module of dashboard/ and workers/ sits in exactly one layer of the import-linter
contract (pyproject.toml), so a new module cannot slip past `make lint` unchecked."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["importlinter"]["contracts"]


def _modules() -> set[str]:
    names = set()
    for package in ("dashboard", "workers"):
        for path in (ROOT / package).iterdir():
            if path.suffix == ".py" and path.stem != "__init__":
                names.add(f"{package}.{path.stem}")
            elif path.is_dir() and (path / "__init__.py").exists() and path.name != "migrations":
                names.add(f"{package}.{path.name}")
    return names


def test_it_places_every_module_in_one_layer() -> None:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    placed: list[str] = [m.strip() for layer in layers["layers"] for m in layer.split(":")]
    assert len(placed) == len(set(placed)), "a module is listed in two layers"
    missing = _modules() - set(placed)
    assert not missing, f"modules in no layer of the import-linter contract: {sorted(missing)}"


def test_it_forbids_django_in_every_core_module() -> None:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    core = {m.strip() for m in layers["layers"][-1].split(":")}
    (forbidden,) = [c for c in _contracts() if c["type"] == "forbidden"]
    assert core == set(forbidden["source_modules"])
    assert {"django", "dashboard"} <= set(forbidden["forbidden_modules"])


#: Modules whose focused tests live in a module named after the feature they serve.
TESTED_UNDER = {
    "dashboard.repositories.one_commit": "test_commitpage",
    "dashboard.web.commits": "test_commitpage",
    "dashboard.repositories.reanalysis": "test_commitpage",
    "dashboard.rollouts.drains": "test_rollouts",
    "dashboard.rollouts.buttons": "test_rolloutboard",
    "dashboard.rollouts.rollback_offers": "test_rolloutboard",
    "dashboard.rollouts.driver": "test_rollout_driver",
    "dashboard.rollouts.steps": "test_rollout_driver",
    "dashboard.server.request_threads": "test_asgi",  # the ASGI handler's request threads
    "workers.remotes.branches": "test_remotes",  # the URL grammar's parts, tested through it
    "workers.remotes.hosts": "test_remotes",
    "workers.remotes.redaction": "test_remotes",
    "workers.remotes.policy": "test_remotes",
    "workers.analysis.numstat": "test_history",  # the parser of the stream history.py reads
    "workers.git.fetch_errors": "test_git_security",  # refused fetches, fsck findings, limits
    "workers.git.mirror_limits": "test_git_security",
    "dashboard.management": "test_cli",  # the commands, run as a user runs them
    "dashboard.templatetags": "test_pages",  # the filters, through the pages using them
    "dashboard.web.humanize": "test_pages",  # |ago and relative(); the rows in test_tablerows
    "dashboard.web.ops": "test_pages",  # the operations pages, as operators read them
    "dashboard.web.runs": "test_pages",
    "dashboard.web.repositories": "test_views",
    "dashboard.web.rollouts": "test_rollout_views",
}


def test_every_module_has_a_test_module() -> None:
    """Tests mirror the code (docs/testing.md): a new module arrives with its own tests."""
    missing = []
    for module in sorted(_modules()):
        name = TESTED_UNDER.get(module, "test_" + module.rsplit(".", 1)[1])
        if not (ROOT / "tests" / f"{name}.py").exists():
            missing.append(module)
    assert not missing, f"modules without a test module: {missing}"
