"""workers.git.paths: a path that is not UTF-8 is git's own quoted form, byte for byte
(checked against git with every byte value), and the mapping from bytes to text is
one-to-one and always storable."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.support.gitrepo import GitRepo
from workers.git.paths import path_text, quote_c_style

_NAME_BYTES = st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b)


def test_the_quoted_form_is_what_git_prints_with_quote_path_on(tmp_path: Path) -> None:
    repo = GitRepo.create(tmp_path / "r")
    blob = repo.git("hash-object", "-w", "--stdin", input=b"x\n").strip().encode()
    names = [b"n" + bytes([b]) + b"x" for b in range(1, 256) if b != ord("/")]
    names += [b'"lead', b'"both"', b"caf\xc3\xa9", b"caf\xe9", b"a\\b", b"\xff\xfe"]
    stdin = b"".join(b"100644 " + blob + b"\t" + n + b"\0" for n in names)
    subprocess.run(["git", "update-index", "--add", "-z", "--index-info"], cwd=repo.path,
                   input=stdin, check=True)  # fmt: skip
    listed = subprocess.run(["git", "-c", "core.quotepath=on", "ls-files"], cwd=repo.path,
                            capture_output=True, check=True)  # fmt: skip
    shown = listed.stdout.decode("ascii").split("\n")
    printed = {}  # raw name -> what git printed, in git's (sorted) order
    for raw, line in zip(sorted(names), shown, strict=False):
        printed[raw] = line
    assert len(shown) - 1 == len(names)
    for raw, line in printed.items():
        if line.startswith('"'):
            assert quote_c_style(raw) == line, raw
    for raw in (b"caf\xe9", b"\xff\xfe", b'"both"'):
        assert path_text(raw) == printed[raw]
    assert path_text(b'"lead') == '"lead'  # not shaped like a quoted form: kept
    assert path_text(b"caf\xc3\xa9") == "café"  # UTF-8 is kept as it reads
    assert path_text(b"a\\b") == "a\\b"


@given(_NAME_BYTES, _NAME_BYTES)
def test_two_names_never_share_a_text(a: bytes, b: bytes) -> None:
    if a != b:
        assert path_text(a) != path_text(b)


@given(_NAME_BYTES)
def test_the_text_is_always_storable(raw: bytes) -> None:
    text = path_text(raw)
    text.encode("utf-8")  # no lone surrogate: PostgreSQL, SQLite and pages take it
    assert "\0" not in text
