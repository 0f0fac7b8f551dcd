"""workers.analysis.history against real git repositories, checked against independent git calls."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workers.analysis import history, numstat
from workers.analysis.analyzer import DEFAULT, AnalyzerConfig
from workers.analysis.chunks import MERGE_WEIGHT, ShaList
from workers.analysis.history import list_commits, stream_commits
from workers.analysis.languages import language_for
from workers.analysis.numstat import CommitRecord, HistoryError

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
RENAMES = AnalyzerConfig(detect_renames=True)

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k not in {"HOME"}}
BASE_ENV.update(
    GIT_CONFIG_NOSYSTEM="1",
    GIT_CONFIG_GLOBAL="/dev/null",
    GIT_TERMINAL_PROMPT="0",
    LC_ALL="C",
)


def git(
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    git_dir: Path | None = None,
) -> bytes:
    e = dict(BASE_ENV)
    if git_dir is not None:
        e["GIT_DIR"] = str(git_dir)
    if env:
        e.update(env)
    res = subprocess.run(
        ["git", "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        env=e,
        input=input,
        capture_output=True,
    )
    if res.returncode != 0:
        raise AssertionError(f"git {args} failed: {res.stderr.decode(errors='replace')}")
    return res.stdout


@dataclass
class Repo:
    """A work tree used to build history; ``bare()`` gives the repository to analyse."""

    root: Path
    tick: int = 1_600_000_000
    zones: list[str] = field(default_factory=lambda: ["+0530", "-0800", "+0000", "+1345"])

    @classmethod
    def create(cls, path: Path) -> Repo:
        path.mkdir(parents=True)
        git(path, "init", "-q", "-b", "main")
        git(path, "config", "core.autocrlf", "false")
        return cls(path)

    def write(self, name: str, data: str | bytes) -> None:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)

    def rm(self, name: str) -> None:
        (self.root / name).unlink()

    def git(self, *args: str, **kw: Any) -> bytes:
        return git(self.root, *args, **kw)

    def _env(self, author: tuple[str, str], committer: tuple[str, str] | None) -> dict[str, str]:
        self.tick += 3600
        az = self.zones[self.tick // 3600 % len(self.zones)]
        cz = self.zones[(self.tick // 3600 + 1) % len(self.zones)]
        committer = committer or author
        return {
            "GIT_AUTHOR_NAME": author[0],
            "GIT_AUTHOR_EMAIL": author[1],
            "GIT_AUTHOR_DATE": f"{self.tick} {az}",
            "GIT_COMMITTER_NAME": committer[0],
            "GIT_COMMITTER_EMAIL": committer[1],
            "GIT_COMMITTER_DATE": f"{self.tick + 60} {cz}",
        }

    def commit(
        self,
        msg: str = "change",
        *,
        author: tuple[str, str] = ("Ann", "ann@example.com"),
        committer: tuple[str, str] | None = None,
    ) -> str:
        self.git("add", "-A")
        self.git(
            "commit",
            "-q",
            "--allow-empty",
            "-F",
            "-",
            "--cleanup=verbatim",
            input=msg.encode(),
            env=self._env(author, committer),
        )
        return self.head()

    def merge(
        self, *branches: str, msg: str = "merge", author: tuple[str, str] = ("Ann", "a@x")
    ) -> str:
        self.git("merge", "-q", "--no-ff", "-m", msg, *branches, env=self._env(author, None))
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").decode().strip()

    def bare(self) -> Path:
        dest = self.root.parent / (self.root.name + ".git")
        if dest.exists():
            git(dest, "fetch", "-q", "--force", str(self.root), "+refs/heads/*:refs/heads/*")
            git(dest, "symbolic-ref", "HEAD", self.git("symbolic-ref", "HEAD").decode().strip())
        else:
            git(self.root.parent, "clone", "-q", "--bare", self.root.name, dest.name)
        return dest


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo.create(tmp_path / "work")


# --------------------------------------------------------------------------- reference


def _parse_ident(line: bytes) -> tuple[str, str, datetime]:
    """``Name <email> 1600000000 +0530`` -> (name, email, aware datetime)."""
    rest, _, tz = line.rpartition(b" ")
    rest, _, ts = rest.rpartition(b" ")
    name, _, email = rest.partition(b" <")
    sign = -1 if tz[:1] == b"-" else 1
    offset = timedelta(hours=int(tz[1:3]), minutes=int(tz[3:5])) * sign
    dt = datetime.fromtimestamp(int(ts), timezone(offset))
    return name.decode(errors="replace"), email[:-1].decode(errors="replace"), dt


def reference_files(
    bare: Path, sha: str, parents: list[str], *extra: str, pathspec: tuple[str, ...] = ()
) -> list[tuple[str, int, int, bool, str, str | None]]:
    """``git diff-tree`` of the first parent (or the empty tree): one process per commit."""
    base = parents[0] if parents else EMPTY_TREE
    out = git(
        bare,
        "diff-tree",
        "-r",
        "-z",
        "--numstat",
        *(extra or ("--no-renames",)),
        base,
        sha,
        *(("--", *pathspec) if pathspec else ()),
        git_dir=bare,
    )
    toks = out.split(b"\0")
    files = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if not tok:
            continue
        a, d, p = tok.split(b"\t", 2)
        old = None
        if not p:  # rename: old, new
            old, p = toks[i].decode(errors="replace"), toks[i + 1]
            i += 2
        path = p.decode(errors="replace")
        binary = a == b"-"
        files.append(
            (
                path,
                0 if binary else int(a),
                0 if binary else int(d),
                binary,
                language_for(path),
                old,
            )
        )
    return files


def reference_commit(
    bare: Path, sha: str, *diff_flags: str, pathspec: tuple[str, ...] = ()
) -> dict[str, Any]:
    raw = git(bare, "cat-file", "commit", sha, git_dir=bare)
    headers = raw.split(b"\n\n", 1)[0].split(b"\n")
    parents = [h[7:].decode() for h in headers if h.startswith(b"parent ")]
    author = next(h[7:] for h in headers if h.startswith(b"author "))
    committer = next(h[10:] for h in headers if h.startswith(b"committer "))
    an, ae, adt = _parse_ident(author)
    cn, ce, cdt = _parse_ident(committer)
    meta = git(bare, "show", "-s", "-z", "--format=%aN%x00%aE%x00%s", sha, git_dir=bare)
    can_name, can_email, subject = meta.split(b"\0")[:3]
    return {
        "sha": sha,
        "parents": tuple(parents),
        "author_name": an,
        "author_email": ae,
        "author_canonical_name": can_name.decode(errors="replace"),
        "author_canonical_email": can_email.decode(errors="replace"),
        "authored_at": adt,
        "committer_name": cn,
        "committer_email": ce,
        "committed_at": cdt,
        "subject": subject.decode(errors="replace"),
        "is_merge": len(parents) > 1,
        "files": reference_files(bare, sha, parents, *diff_flags, pathspec=pathspec),
    }


def as_dict(c: CommitRecord) -> dict[str, Any]:
    return {
        "sha": c.sha,
        "parents": c.parents,
        "author_name": c.author_name,
        "author_email": c.author_email,
        "author_canonical_name": c.author_canonical_name,
        "author_canonical_email": c.author_canonical_email,
        "authored_at": c.authored_at,
        "committer_name": c.committer_name,
        "committer_email": c.committer_email,
        "committed_at": c.committed_at,
        "subject": c.subject,
        "is_merge": c.is_merge,
        "files": [(f.path, f.added, f.deleted, f.binary, f.language, f.old_path) for f in c.files],
    }


def assert_matches_git(bare: Path, config: AnalyzerConfig = DEFAULT) -> list[CommitRecord]:
    """Every commit of ``bare`` streamed under ``config`` equals git's own diff-tree with
    the flags and pathspec the config stands for (spelled out here, not taken from
    workers.analysis.history)."""
    shas = git(bare, "rev-list", "--all", "--topo-order", "--reverse", git_dir=bare).split()
    shas_s = [s.decode() for s in shas]
    flags: tuple[str, ...] = ()
    if config.detect_renames:
        flags += ("-M",)
    else:
        flags += ("--no-renames",)
    if config.ignore_whitespace:
        flags += ("-w",)
    pathspec = tuple(f":(exclude,glob){p}" for p in config.exclude_paths)
    got = list(stream_commits(bare, shas_s, config=config))
    assert [c.sha for c in got] == shas_s
    for c in got:
        expected = reference_commit(bare, c.sha, *flags, pathspec=pathspec)
        actual = as_dict(c)
        for key in expected:
            assert actual[key] == expected[key], (c.sha, key)
        # offsets are part of the contract, not just the instant
        assert c.authored_at.utcoffset() == expected["authored_at"].utcoffset()
        assert c.committed_at.utcoffset() == expected["committed_at"].utcoffset()
        assert c.files_changed == len(c.files)
        assert c.insertions == sum(f[1] for f in expected["files"])
        assert c.deletions == sum(f[2] for f in expected["files"])
    return got


def git_diff_numstat(bare: Path, a: str, b: str) -> list[tuple[str, int, int]]:
    out = git(bare, "diff", "--numstat", "--no-renames", "-z", a, b, git_dir=bare)
    rows = []
    for tok in out.split(b"\0"):
        if tok:
            x, y, p = tok.split(b"\t", 2)
            rows.append((p.decode(), int(x) if x != b"-" else 0, int(y) if y != b"-" else 0))
    return rows


# --------------------------------------------------------------------------- tests


def test_linear_history_with_varied_timezones_matches_git(repo: Repo) -> None:
    repo.write("src/app.py", "print(1)\n")
    repo.write("README.md", "# hi\n")
    repo.commit("initial")
    repo.write("src/app.py", "print(2)\nprint(3)\n")
    repo.commit("edit app", author=("Bob", "bob@example.com"), committer=("CI", "ci@example"))
    repo.rm("README.md")
    repo.write("lib/x.go", "package x\n")
    repo.commit("remove readme")
    got = assert_matches_git(repo.bare())
    assert len(got) == 3
    offsets = {c.authored_at.utcoffset() for c in got} | {c.committed_at.utcoffset() for c in got}
    assert timedelta(hours=5, minutes=30) in offsets
    assert timedelta(hours=-8) in offsets
    assert got[0].parents == ()
    assert got[1].files[0].language == "Python"
    assert (got[1].insertions, got[1].deletions) == (2, 1)


def test_root_commit_is_diffed_against_empty_tree(repo: Repo) -> None:
    repo.write("a.txt", "1\n2\n3\n")
    repo.write("b.rs", "fn main() {}\n")
    root = repo.commit("root")
    (c,) = stream_commits(repo.bare(), [root])
    assert c.parents == () and not c.is_merge
    assert [(f.path, f.added, f.deleted) for f in c.files] == [("a.txt", 3, 0), ("b.rs", 1, 0)]
    assert c.files[1].language == "Rust"


def test_merges_report_first_parent_numstat_for_two_parent_and_octopus(repo: Repo) -> None:
    repo.write("base.txt", "base\n")
    repo.commit("base")
    for b in ("b1", "b2", "b3"):
        repo.git("checkout", "-q", "-b", b, "main")
        repo.write(f"{b}.txt", f"{b}\n" * 3)
        repo.write("base.txt" if b == "b1" else f"{b}-more.txt", "changed\nbase\n")
        repo.commit(f"on {b}")
    repo.git("checkout", "-q", "main")
    repo.write("main.txt", "main\n")
    repo.commit("main work")
    m2 = repo.merge("b1", msg="two-parent merge")
    octo = repo.merge("b2", "b3", msg="octopus merge")
    bare = repo.bare()
    got = {c.sha: c for c in assert_matches_git(bare)}
    for sha, nparents in ((m2, 2), (octo, 3)):
        c = got[sha]
        assert c.is_merge and len(c.parents) == nparents
        assert [(f.path, f.added, f.deleted) for f in c.files] == git_diff_numstat(
            bare, c.parents[0], sha
        )
        assert c.files  # merges are not silently empty
    assert {f.path for f in got[octo].files} == {"b2.txt", "b2-more.txt", "b3.txt", "b3-more.txt"}
    # The listed history knows its merges (two-parent and octopus), which weigh more
    # when chunks are cut (workers/analysis/chunks.py); the root commit weighs 1 too.
    listed = list_commits(bare, "main")
    assert listed == git(bare, "rev-list", "--reverse", "--topo-order", "main").decode().split()
    assert {sha for sha, w in listed.weights() if w > 1} == {m2, octo}
    assert {w for _, w in listed.weights()} == {1, 1 + MERGE_WEIGHT}
    assert listed.weight() == len(listed) + 2 * MERGE_WEIGHT


def test_binary_files_are_flagged_with_zero_line_counts(repo: Repo) -> None:
    repo.write("img.png", b"\x89PNG\r\n\x1a\n\x00\x00\x01")
    repo.write("t.txt", "x\n")
    repo.commit("add binary")
    repo.write("img.png", b"\x89PNG\r\n\x1a\n\x00\x00\x02\x03")
    sha = repo.commit("change binary")
    got = {c.sha: c for c in assert_matches_git(repo.bare())}
    (f,) = got[sha].files
    assert (f.path, f.binary, f.added, f.deleted) == ("img.png", True, 0, 0)
    assert got[sha].files_changed == 1 and got[sha].insertions == 0


def test_renames_are_delete_plus_add_unless_detection_enabled(repo: Repo) -> None:
    body = "".join(f"line {i}\n" for i in range(50))
    repo.write("old name.py", body)
    repo.commit("add")
    repo.rm("old name.py")
    repo.write("new\tname.py", body + "extra\n")
    sha = repo.commit("rename")
    bare = repo.bare()
    plain = {c.sha: c for c in assert_matches_git(bare)}
    assert sorted((f.path, f.added, f.deleted) for f in plain[sha].files) == [
        ("new\tname.py", 51, 0),
        ("old name.py", 0, 50),
    ]
    renamed = {c.sha: c for c in assert_matches_git(bare, RENAMES)}
    assert [(f.path, f.added, f.deleted, f.old_path) for f in renamed[sha].files] == [
        ("new\tname.py", 1, 0, "old name.py")
    ]
    assert all(f.old_path is None for c in plain.values() for f in c.files)


def test_empty_commit_has_no_files(repo: Repo) -> None:
    repo.write("a", "a\n")
    repo.commit("a")
    empty = repo.commit("nothing here")
    repo.write("b", "b\n")
    after = repo.commit("b")
    got = {c.sha: c for c in assert_matches_git(repo.bare())}
    assert got[empty].files == () and got[empty].files_changed == 0
    assert [f.path for f in got[after].files] == ["b"]  # no leakage across records


def test_non_ascii_names_and_messages_round_trip(repo: Repo) -> None:
    repo.write("ä.txt", "ü\n")
    sha = repo.commit(
        "Zoë Łukasz 日本 — ünïcødé subject 🚀", author=("Zoë Łukasz 日本", "zoë@exämple.org")
    )
    (c,) = assert_matches_git(repo.bare())
    assert c.sha == sha
    assert c.author_name == "Zoë Łukasz 日本"
    assert c.author_email == "zoë@exämple.org"
    assert c.subject == "Zoë Łukasz 日本 — ünïcødé subject 🚀"
    assert c.files[0].path == "ä.txt"


AWKWARD = [
    "with space.txt",
    "tab\there.md",
    "new\nline.py",
    'quote"s.js',
    "single'quote.sh",
    "back\\slash.c",
    "日本語/ファイル.rs",
    "\x1estarts-with-record-sep",
    "has\x1ffield-sep",
    "-leading-dash",
    "trailing space ",
]


def test_awkward_file_names_are_parsed_exactly(repo: Repo) -> None:
    for i, name in enumerate(AWKWARD):
        repo.write(name, f"{i}\n" * (i + 1))
    repo.commit("awkward")
    for name in AWKWARD:
        repo.write(name, "changed\n")
    repo.commit("modify all")
    for name in AWKWARD[:4]:
        (repo.root / name).rename(repo.root / (name + " moved"))
    repo.commit("rename some")
    bare = repo.bare()
    got = assert_matches_git(bare)
    assert {f.path for f in got[0].files} == set(AWKWARD)
    assert [f.added for f in sorted(got[0].files, key=lambda f: AWKWARD.index(f.path))] == list(
        range(1, len(AWKWARD) + 1)
    )
    renamed = assert_matches_git(bare, RENAMES)
    assert {f.path for f in renamed[2].files} == {n + " moved" for n in AWKWARD[:4]}


def test_mailmap_gives_canonical_identity_and_keeps_raw(repo: Repo) -> None:
    repo.write(".mailmap", "Ann Canonical <ann@canonical.org> <ann@old.example>\n")
    repo.commit("mailmap", author=("ann", "ann@old.example"))
    repo.write("x", "1\n")
    repo.commit("x", author=("Somebody", "other@example.com"))
    got = assert_matches_git(repo.bare())
    assert (got[0].author_name, got[0].author_email) == ("ann", "ann@old.example")
    assert (got[0].author_canonical_name, got[0].author_canonical_email) == (
        "Ann Canonical",
        "ann@canonical.org",
    )
    assert got[1].author_canonical_name == got[1].author_name == "Somebody"


def test_mode_change_symlink_and_submodule_entries_match_git(repo: Repo, tmp_path: Path) -> None:
    sub = Repo.create(tmp_path / "sub")
    sub.write("s.txt", "s\n")
    sub.commit("sub")
    repo.write("run.sh", "#!/bin/sh\necho hi\n")
    repo.commit("script")
    os.chmod(repo.root / "run.sh", 0o755)
    mode = repo.commit("chmod +x")
    os.symlink("run.sh", repo.root / "link")
    link = repo.commit("symlink")
    (repo.root / "link").unlink()
    repo.write("link", "now a file\n")
    repo.commit("typechange")
    repo.git("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub.root), "vendor")
    gl = repo.commit("submodule")
    got = {c.sha: c for c in assert_matches_git(repo.bare())}
    assert [(f.path, f.added, f.deleted) for f in got[mode].files] == [("run.sh", 0, 0)]
    assert [(f.path, f.added) for f in got[link].files] == [("link", 1)]
    assert {f.path for f in got[gl].files} == {".gitmodules", "vendor"}


def test_multiline_subject_is_joined_like_git_percent_s(repo: Repo) -> None:
    repo.write("a", "a\n")
    sha = repo.commit("first line\nsecond line\n  third\n\nbody paragraph\n")
    (c,) = assert_matches_git(repo.bare())
    assert c.sha == sha and c.subject == "first line second line   third"


def test_commits_are_yielded_in_given_order_and_duplicates_once(repo: Repo) -> None:
    shas = []
    for i in range(5):
        repo.write("f", f"{i}\n")
        shas.append(repo.commit(f"c{i}"))
    order = [shas[3], shas[0], shas[4], shas[0], shas[1]]
    got = [c.sha for c in stream_commits(repo.bare(), order)]
    assert got == [shas[3], shas[0], shas[4], shas[1]]
    assert list(stream_commits(repo.bare(), [])) == []


def test_exclude_paths_whitespace_and_subject_truncation(repo: Repo) -> None:
    repo.write("src/a.py", "x = 1\n")
    repo.write("vendor/lib.js", "v\n")
    repo.write("pkg.lock", "l\n")
    repo.commit("a" * 100)
    repo.write("src/a.py", "x  =  1\n")
    ws = repo.commit("whitespace only")
    bare = repo.bare()
    c = next(
        stream_commits(
            bare,
            [repo.git("rev-parse", "HEAD~1").decode().strip()],
            config=AnalyzerConfig(exclude_paths=("vendor/*", "*.lock")),
            max_subject=10,
        )
    )
    assert [f.path for f in c.files] == ["src/a.py"]
    assert c.subject == "a" * 10
    (plain,) = stream_commits(bare, [ws])
    (ignored,) = stream_commits(bare, [ws], config=AnalyzerConfig(ignore_whitespace=True))
    assert (plain.insertions, plain.deletions) == (1, 1)
    assert ignored.insertions == ignored.deletions == 0
    assert_matches_git(bare, AnalyzerConfig(ignore_whitespace=True))


def test_commits_touching_only_excluded_paths_are_yielded_with_no_files(repo: Repo) -> None:
    repo.write("vendor/a b/lib.js", "v\n")
    root = repo.commit("root of vendored files only")
    repo.git("checkout", "-q", "-b", "side")
    repo.write("vendor/side.js", "s\n")
    side = repo.commit("side: vendor only")
    repo.git("checkout", "-q", "main")
    repo.write("src/x.py", "x\n")
    repo.commit("main: code")
    merge = repo.merge("side")
    bare = repo.bare()
    config = AnalyzerConfig(exclude_paths=("vendor/**",))
    got = {c.sha: c for c in assert_matches_git(bare, config)}
    assert got[root].files == got[side].files == got[merge].files == ()
    assert [f.path for f in next(stream_commits(bare, [merge])).files] == ["vendor/side.js"]
    # what plain `git log -- <pathspec>` would do instead: drop those commits
    shown = git(bare, "log", "--format=%H", "main", "--", ":(exclude,glob)vendor/**", git_dir=bare)
    assert root not in shown.decode() and merge not in shown.decode()


def test_unknown_sha_raises_history_error_with_git_stderr(repo: Repo) -> None:
    repo.write("a", "a\n")
    good = repo.commit("a")
    with pytest.raises(HistoryError, match=r"(?i)bad|unknown|invalid|fatal"):
        list(stream_commits(repo.bare(), [good, "0" * 40]))
    with pytest.raises(HistoryError):
        list(stream_commits(repo.bare(), ["deadbeef" * 5]))


def test_option_like_revisions_are_rejected(repo: Repo) -> None:
    with pytest.raises(ValueError):
        stream_commits(repo.root, ["--output=/tmp/x"])
    with pytest.raises(ValueError):
        list_commits(repo.root, "--all")
    with pytest.raises(ValueError):
        stream_commits(repo.root, ["abc\ndef"])


def test_oversized_record_raises_instead_of_buffering(repo: Repo, monkeypatch: Any) -> None:
    for i in range(40):
        repo.write(f"file-{i:03d}.txt", "x\n")
    sha = repo.commit("many files")
    monkeypatch.setattr(history, "MAX_RECORD_BYTES", 200)
    with pytest.raises(HistoryError, match="too large"):
        list(stream_commits(repo.bare(), [sha]))


def _fast_import_repo(path: Path, n: int, files_per_commit: int = 1) -> Path:
    """A bare repository with ``n`` linear commits, built quickly with git fast-import."""
    git(path.parent, "init", "-q", "--bare", path.name)
    chunks = []
    for i in range(n):
        chunks.append(
            f"commit refs/heads/main\nmark :{i + 1}\n"
            f"author A <a@x> {1_600_000_000 + i} +0100\n"
            f"committer A <a@x> {1_600_000_000 + i} +0100\n"
            f"data 8\ncommit {i % 10}\n"
            + (f"from :{i}\n" if i else "")
            + "".join(
                f"M 644 inline d{j % 50}/f{(i * 7 + j) % 400}.py\ndata {len(str(i)) + 1}\n{i}\n"
                for j in range(files_per_commit)
            )
        )
    git(path, "fast-import", "--quiet", input="".join(chunks).encode(), git_dir=path)
    git(path, "symbolic-ref", "HEAD", "refs/heads/main", git_dir=path)
    return path


def test_closing_generator_early_kills_and_reaps_git(tmp_path: Path) -> None:
    bare = _fast_import_repo(tmp_path / "big.git", 1500, files_per_commit=3)
    shas = list_commits(bare, "main")
    assert len(shas) == 1500
    procs: list[subprocess.Popen[bytes]] = []

    def runner(args: list[str], *, cwd: str | Path, stdin: int | None) -> subprocess.Popen[bytes]:
        p = history.default_git_runner(args, cwd=cwd, stdin=stdin)
        procs.append(p)
        return p

    gen = stream_commits(bare, shas, git=runner)
    first = next(gen)
    assert first.sha == shas[0]
    (proc,) = procs
    assert proc.poll() is None  # still blocked writing into the full pipe
    gen.close()
    assert proc.returncode is not None and proc.returncode < 0  # killed, and reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)
    assert (
        not Path(f"/proc/{proc.pid}").exists()
        or b"git" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    )


def test_list_commits_is_oldest_first_and_honours_exclude(repo: Repo) -> None:
    repo.write("a", "1\n")
    c1 = repo.commit("1")
    repo.git("checkout", "-q", "-b", "side")
    repo.write("b", "1\n")
    s1 = repo.commit("s1")
    repo.git("checkout", "-q", "main")
    repo.write("a", "2\n")
    c2 = repo.commit("2")
    m = repo.merge("side")
    bare = repo.bare()
    all_shas = list_commits(bare, "main")
    expected = git(bare, "rev-list", "--reverse", "--topo-order", "main", git_dir=bare).split()
    assert all_shas == [s.decode() for s in expected]
    assert all_shas[0] == c1 and all_shas[-1] == m and set(all_shas) == {c1, s1, c2, m}
    assert list_commits(bare, "main", exclude=[c2]) == [s1, m]
    assert list_commits(bare, "main", exclude=["side", c2]) == [m]
    with pytest.raises(HistoryError):
        list_commits(bare, "no-such-branch")


# --------------------------------------------------------------------------- property test

_names = st.sampled_from(["a.py", "b.txt", "dir/c.md", "sp ace.js", "ü.go", "img.bin"])
_file_op = st.one_of(
    st.tuples(st.just("text"), _names, st.lists(st.sampled_from("xyz "), max_size=6)),
    st.tuples(st.just("binary"), _names, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), _names, st.none()),
)
_step = st.one_of(
    st.tuples(st.just("commit"), st.lists(_file_op, min_size=1, max_size=4)),
    st.tuples(st.just("switch"), st.none()),
    st.tuples(st.just("merge"), st.none()),
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(_step, min_size=1, max_size=10))
def test_random_histories_match_git(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, Any]]
) -> None:
    repo = Repo.create(tmp_path_factory.mktemp("prop") / "work")
    repo.write("m/seed.txt", "seed\n")
    repo.commit("seed")
    repo.git("branch", "side")
    branch = "main"
    for kind, arg in steps:
        if kind == "switch":
            branch = "side" if branch == "main" else "main"
            repo.git("checkout", "-q", branch)
        elif kind == "merge":
            repo.git("checkout", "-q", "main")
            branch = "main"
            repo.merge("side", msg="merge side")
        else:
            prefix = "m/" if branch == "main" else "s/"  # disjoint paths: merges never conflict
            for op, name, data in arg:
                path = prefix + name
                if op == "text":
                    repo.write(path, "".join(f"{ch}\n" for ch in data))
                elif op == "binary":
                    repo.write(path, b"\x00" + data)
                elif (repo.root / path).exists():
                    repo.rm(path)
            repo.commit(f"{branch} step\nbody")
    # always end with at least one real merge of the side branch
    repo.git("checkout", "-q", "side")
    repo.write("s/final.bin", b"\x00final")
    repo.commit("side final")
    repo.git("checkout", "-q", "main")
    repo.merge("side", msg="final merge")
    bare = repo.bare()
    got = assert_matches_git(bare)
    event(f"merges: {sum(c.is_merge for c in got)}")
    merges = set(git(bare, "rev-list", "--merges", "main").decode().split())
    assert {sha for sha, w in list_commits(bare, "main").weights() if w > 1} == merges
    event(f"binary files: {any(f.binary for c in got for f in c.files)}")
    assert_matches_git(bare, RENAMES)
    assert_matches_git(bare, AnalyzerConfig(exclude_paths=("s/**", "m/*.bin")))
    assert_matches_git(
        bare, AnalyzerConfig(detect_renames=True, ignore_whitespace=True, exclude_paths=("m/**",))
    )


def test_path_cache_overflow_and_block_boundaries_do_not_change_results(
    repo: Repo, monkeypatch: Any
) -> None:
    """The parser's per-stream path cache is bounded: cleared when full. With a limit
    of 1 (cleared on nearly every file) and 7-byte reads (every token split across
    blocks), the records equal git's exactly, renames included."""
    for i, name in enumerate(AWKWARD):
        repo.write(name, f"{i}\n" * (i + 1))
    repo.commit("awkward")
    for name in AWKWARD:
        repo.write(name, "changed\n")
    repo.commit("modify all")
    for name in AWKWARD[:4]:
        (repo.root / name).rename(repo.root / (name + " moved"))
    repo.commit("rename some")
    bare = repo.bare()
    expected = [as_dict(c) for c in assert_matches_git(bare, RENAMES)]
    monkeypatch.setattr(numstat, "_PATH_CACHE_LIMIT", 1)
    monkeypatch.setattr(history, "READ_BLOCK", 7)
    assert [as_dict(c) for c in assert_matches_git(bare, RENAMES)] == expected
    assert [as_dict(c) for c in assert_matches_git(bare)][2]["files"] != expected[2]["files"]


def test_list_commits_keeps_a_long_history_compact_across_read_blocks(tmp_path: Path) -> None:
    bare = _fast_import_repo(tmp_path / "long.git", 2000)  # 82 KB of output: two reads
    shas = list_commits(bare, "main")
    expected = git(bare, "rev-list", "--reverse", "--topo-order", "main", git_dir=bare).split()
    assert isinstance(shas, ShaList) and shas.nbytes == 20 * 2000
    assert list(shas) == [s.decode() for s in expected]


def test_list_commits_refuses_output_that_is_not_one_commit_and_its_parents_a_line(
    tmp_path: Path,
) -> None:
    bare = _fast_import_repo(tmp_path / "p.git", 3)

    def with_timestamps(
        args: list[str], *, cwd: str | Path, stdin: int | None
    ) -> subprocess.Popen[bytes]:
        return history.default_git_runner([*args, "--timestamp"], cwd=cwd, stdin=stdin)

    with pytest.raises(HistoryError, match="rev-list output"):
        list_commits(bare, "main", git=with_timestamps)


def test_co_authored_by_trailers_are_read_as_git_parses_them(repo: Repo) -> None:
    """docs/analytics.md#co-authors: the values of every ``Co-authored-by:`` trailer, in
    message order, continuation lines unfolded; ``co-authored-by`` in the body (not a
    trailer) and other trailers are not; with renames on, the paths still follow."""
    repo.write("a.py", "".join(f"line {i}\n" for i in range(40)))
    plain = repo.commit(
        "plain\n\nCo-authored-by: Not A <trailer@x> because a body follows\n\nend\n"
    )
    repo.rm("a.py")
    repo.write("b.py", "".join(f"line {i}\n" for i in range(40)) + "more\n")
    paired = repo.commit(
        "pair\n\nbody\n\nSigned-off-by: Ann <ann@example.com>\n"
        "Co-authored-by: Cy <cy@example.com>\nco-authored-by: Dee\n  Long <dee@example.com>\n"
    )
    bare = repo.bare()
    for config in (DEFAULT, RENAMES):
        got = {c.sha: c for c in stream_commits(bare, [plain, paired], config=config)}
        for sha in (plain, paired):
            expected = (
                git(
                    bare,
                    "log",
                    "-1",
                    "--format=%(trailers:key=Co-authored-by,valueonly,unfold,separator=%x1f)",
                    sha,
                )
                .decode()
                .strip()
            )
            assert got[sha].co_authors == tuple(v for v in expected.split("\x1f") if v)
        assert got[plain].co_authors == ()
        assert got[paired].co_authors == ("Cy <cy@example.com>", "Dee Long <dee@example.com>")
    renamed = {c.sha: c for c in stream_commits(bare, [paired], config=RENAMES)}[paired]
    assert [(f.path, f.old_path) for f in renamed.files] == [("b.py", "a.py")]


def test_renamed_commits_are_the_commits_git_log_reports_a_rename_in(tmp_path: Path) -> None:
    """Asked of git itself: ``git log -M --diff-filter=R`` over the same history."""
    from tests.support.gitrepo import GitRepo

    repo = GitRepo.create(tmp_path / "r")
    body = "".join(f"line {i}\n" for i in range(30))
    repo.commit("start", {"a.py": body, "R100": "a path named like a status\n"})
    repo.commit("rename", {"a.py": None, "b.py": body})
    repo.commit("edit", {"b.py": body + "x\n"})
    repo.commit("rename a status-like path", {"R100": None, "M": "a path named like a status\n"})
    repo.commit("copy, no rename", {"c.py": body + "x\n"})
    repo.commit("replace", {"b.py": None, "d.py": "something else entirely\n"})
    shas = repo.shas()
    expected = set(repo.git("log", "-M", "--diff-filter=R", "--format=%H").split())
    assert len(expected) == 2
    assert history.renamed_commits(repo.path / ".git", shas) == expected
    assert history.renamed_commits(repo.path / ".git", shas[:1]) == expected & {shas[0]}
    assert history.renamed_commits(repo.path / ".git", []) == set()
    with pytest.raises(HistoryError):
        history.renamed_commits(repo.path / ".git", ["0" * 40])
