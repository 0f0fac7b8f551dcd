"""workers.analysis.languages: path -> language mapping (the per-language figures built on it are
covered in tests/workers/analysis/test_analyzer.py)."""

from __future__ import annotations

import pytest

from workers.analysis.languages import language_for


@pytest.mark.parametrize(
    ("path", "lang"),
    [
        ("src/app.py", "Python"),
        ("lib.JS", "JavaScript"),
        ("a/b/c.tsx", "TypeScript"),
        ("include/x.h", "C"),
        ("x.m", "Objective-C"),
        ("script.pl", "Perl"),
        ("notes.md", "Markdown"),
        ("archive.tar.gz", ""),
        ("Dockerfile", "Dockerfile"),
        ("deploy/Dockerfile.prod", "Dockerfile"),
        ("svc/dockerfile.dev", "Dockerfile"),  # ...but the "dockerfile." prefix is
        ("Makefile", "Makefile"),
        ("sub/makefile", "Makefile"),
        ("CMakeLists.txt", "CMake"),
        ("other.txt", "Text"),
        ("go.mod", "Go Module"),
        (".gitignore", "Ignore List"),
        ("home/.bashrc", "Shell"),
        ("LICENSE", "Text"),
        ("license", ""),
    ],
)
def test_known_names_and_extensions(path: str, lang: str) -> None:
    assert language_for(path) == lang


@pytest.mark.parametrize(
    "path", ["", "dir/", ".env", "config/.envrc", "NOEXT", "x.unknownext", "a."]
)
def test_unknown_is_empty(path: str) -> None:
    assert language_for(path) == ""


def test_file_name_wins_over_directory_extension() -> None:
    assert language_for("pkg.py/README") == "Text"
    assert language_for("v1.2/tool") == ""
