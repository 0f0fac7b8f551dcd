"""dashboard.analytics.rows: the scope's rows are git log's (merges left out), and the
directory of a path at each depth is the same in SQL as in Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.analytics.rows import MAX_DEPTH, Scope, directory_ctes, directory_of, fetch
from dashboard.analytics.window import parse_window
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)

PATHS = ["README.md", "a/b.py", "a/b/c.py", "a/b/c/d/e/f/g/h.py", "x//y.py", "dir.with.dots/f"]


@pytest.mark.parametrize("depth", range(1, MAX_DEPTH + 1))
def test_the_sql_directory_equals_the_python_one(depth: int) -> None:
    values = " UNION ALL ".join("SELECT %s AS path" for _ in PATHS)
    dirs, name = directory_ctes("src", depth, ("path",))
    got = dict(fetch(f"WITH src AS ({values}), {dirs} SELECT path, dir FROM {name}", PATHS))
    assert got == {p: directory_of(p, depth) for p in PATHS}
    assert directory_of("a/b/c.py", 1) == "a" and directory_of("top.py", 3) == "."


def test_depth_is_bounded() -> None:
    with pytest.raises(ValueError, match="depth"):
        directory_ctes("src", 0, ("path",))
    with pytest.raises(ValueError, match="depth"):
        directory_ctes("src", MAX_DEPTH + 1, ("path",))


def test_the_scope_holds_git_logs_rows_and_no_merge(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    scope = Scope.of(repo, parse_window())
    head, params = scope.rows_cte()
    got = sorted(fetch(f"WITH {head} SELECT path, added, deleted, author FROM scoped", params))
    want = sorted(
        (path, added, deleted, c.author)
        for c in git_log(origin)
        for path, (added, deleted) in c.files.items()
    )
    assert got == want
    assert ("side/x.py", 1, 0, "bob@example.com") in got  # once: the merge's diff is not counted


def test_no_public_name_is_shadowed_by_a_module_of_the_package() -> None:
    """Importing ``dashboard.analytics.coupling`` sets the package's ``coupling`` attribute
    to that module, so a public function of the same name would be unreachable through the
    package once its module loaded (``file_coupling`` is named so for this)."""
    import importlib
    import inspect

    from dashboard import analytics

    for module in set(analytics._SURFACE.values()):
        importlib.import_module(module)
    for name in analytics.__all__:
        assert not inspect.ismodule(getattr(analytics, name)), name
