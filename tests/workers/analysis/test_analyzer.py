"""workers.analysis.analyzer: typed, validated configs, their fingerprints, and the numbers each
version streams, checked against git's own ``-M`` / ``-w`` / pathspec-excluded output."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.workers.analysis.test_history import Repo, git
from workers.analysis.analyzer import (
    CODE_VERSION,
    DEFAULT,
    AnalyzerConfig,
    InvalidConfig,
    VersionNotLoaded,
    config_for,
)
from workers.analysis.history import stream_commits
from workers.analysis.numstat import CommitRecord

ROOT = Path(__file__).resolve().parents[3]

#: The default fingerprint under the code version "1" of the releases before the code
#: version was derived (and before the configuration reached git): results stored under it
#: must stay valid, so the formula must never change by accident.
LEGACY_DEFAULT_FINGERPRINT = "01faaf06ff1b8dc2"
_DEFAULT_TEXT = '{"detect_renames":false,"exclude_paths":[],"ignore_whitespace":false}'
#: The default fingerprint of this code, written out by hand from the derived code version.
DEFAULT_FINGERPRINT = hashlib.sha256(
    f'{{"code":"{CODE_VERSION}","config":{_DEFAULT_TEXT}}}'.encode()
).hexdigest()[:16]

# --------------------------------------------------------------------------- config


def test_the_default_config_keeps_its_fingerprint() -> None:
    assert DEFAULT == AnalyzerConfig() == AnalyzerConfig.from_mapping({})
    assert DEFAULT.fingerprint() == DEFAULT_FINGERPRINT
    assert DEFAULT.fingerprint(code_version="1") == LEGACY_DEFAULT_FINGERPRINT
    assert DEFAULT.canonical_json() == _DEFAULT_TEXT


@pytest.mark.parametrize(
    "change",
    [
        {"detect_renames": True},
        {"ignore_whitespace": True},
        {"exclude_paths": ["vendor/**"]},
        {"exclude_paths": ["*.min.js"]},
    ],
)
def test_each_key_changes_the_fingerprint(change: dict[str, Any]) -> None:
    other = AnalyzerConfig.from_mapping(change)
    assert other.fingerprint() != DEFAULT.fingerprint()
    assert other.fingerprint() != other.fingerprint(code_version=CODE_VERSION + "x")


def test_every_combination_has_its_own_fingerprint() -> None:
    configs = [
        AnalyzerConfig(detect_renames=r, ignore_whitespace=w, exclude_paths=e)
        for r in (False, True)
        for w in (False, True)
        for e in ((), ("vendor/**",), ("vendor/**", "*.min.js"))
    ]
    assert len({c.fingerprint() for c in configs}) == len(configs) == 12


def test_one_configuration_spelt_two_ways_is_one_version() -> None:
    a = AnalyzerConfig.from_mapping({"exclude_paths": ["b/**", "a/**", "b/**"]})
    b = AnalyzerConfig(exclude_paths=("a/**", "b/**"))
    assert a == b and a.fingerprint() == b.fingerprint()
    assert a.exclude_paths == ("a/**", "b/**")
    assert AnalyzerConfig.from_mapping(a.to_dict()) == a


def test_the_fingerprint_hashes_code_version_and_canonical_json() -> None:
    import hashlib

    config = AnalyzerConfig(detect_renames=True, exclude_paths=("日本/**", 'q"uote'))
    text = f'{{"code":"{CODE_VERSION}","config":{config.canonical_json()}}}'
    assert json.loads(text) == {"code": CODE_VERSION, "config": config.to_dict()}
    assert config.fingerprint() == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert text.isascii()


def test_fingerprints_are_stable_across_processes() -> None:
    configs = [
        {},
        {"detect_renames": True},
        {"ignore_whitespace": True, "exclude_paths": ["vendor/**", "ünï/*.js"]},
    ]
    script = (
        "import json, sys\n"
        "from workers.analysis.analyzer import AnalyzerConfig\n"
        "print(json.dumps([AnalyzerConfig.from_mapping(c).fingerprint()"
        " for c in json.loads(sys.argv[1])]))\n"
    )
    seen = set()
    for seed in ("0", "1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", script, json.dumps(configs)],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        seen.add(tuple(json.loads(out)))
    assert seen == {tuple(AnalyzerConfig.from_mapping(c).fingerprint() for c in configs)}


def test_a_config_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.detect_renames = True  # type: ignore[misc]
    assert DEFAULT.fingerprint() == DEFAULT_FINGERPRINT


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        (["detect_renames"], "config", "must be an object"),
        ("detect_renames=true", "config", "must be an object"),
        ({"detect_rename": True}, "detect_rename", "did you mean 'detect_renames'"),
        ({"colour": "red"}, "colour", "unknown key 'colour'"),
        ({1: True}, "1", "unknown key"),
        ({"detect_renames": "true"}, "detect_renames", "true or false"),
        ({"detect_renames": 1}, "detect_renames", "true or false"),
        ({"ignore_whitespace": None}, "ignore_whitespace", "true or false"),
        ({"exclude_paths": "vendor/**"}, "exclude_paths", "not a string"),
        ({"exclude_paths": {"vendor/**": 1}}, "exclude_paths", "list of glob patterns"),
        ({"exclude_paths": [3]}, "exclude_paths", "must be a string"),
        ({"exclude_paths": [""]}, "exclude_paths", "must not be empty"),
        ({"exclude_paths": ["/etc/**"]}, "exclude_paths", "relative"),
        ({"exclude_paths": [":(top)x"]}, "exclude_paths", "pathspec magic"),
        ({"exclude_paths": [":!x"]}, "exclude_paths", "pathspec magic"),
        ({"exclude_paths": ["../x"]}, "exclude_paths", "'..'"),
        ({"exclude_paths": ["a/./b"]}, "exclude_paths", "'.'"),
        ({"exclude_paths": ["a\0b"]}, "exclude_paths", "NUL"),
        ({"exclude_paths": ["x" * 2000]}, "exclude_paths", "at most"),
        ({"exclude_paths": [f"d{i}/**" for i in range(101)]}, "exclude_paths", "at most 100"),
        ({"detect_renames": True, "zzz": 1}, "zzz", "unknown key"),
    ],
)
def test_from_mapping_refuses_bad_input_naming_the_key(data: Any, key: str, fragment: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        AnalyzerConfig.from_mapping(data)
    assert isinstance(info.value, ValueError)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ")
    assert fragment in str(info.value)


def test_the_constructor_validates_too() -> None:
    with pytest.raises(InvalidConfig, match=r"^exclude_paths: "):
        AnalyzerConfig(exclude_paths="vendor/**")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match=r"^ignore_whitespace: "):
        AnalyzerConfig(ignore_whitespace="yes")  # type: ignore[arg-type]


def test_from_assignments_reads_cli_settings() -> None:
    config = AnalyzerConfig.from_assignments(
        [
            "detect_renames=true",
            "ignore_whitespace=Off",
            "exclude_paths=vendor/**",
            "exclude_paths=docs/with space/*.md",
        ]
    )
    assert config == AnalyzerConfig(
        detect_renames=True, exclude_paths=("docs/with space/*.md", "vendor/**")
    )
    assert AnalyzerConfig.from_assignments([]) == DEFAULT


@pytest.mark.parametrize(
    ("items", "key", "fragment"),
    [
        (["detect_renames"], "detect_renames", "KEY=VALUE"),
        (["=true"], "=true", "KEY=VALUE"),
        (["detect_renames=maybe"], "detect_renames", "true or false"),
        (["detect_renames=true", "detect_renames=false"], "detect_renames", "given twice"),
        (["ignore_whitespaces=true"], "ignore_whitespaces", "did you mean"),
        (["exclude_paths="], "exclude_paths", "must not be empty"),
    ],
)
def test_from_assignments_refuses_bad_input(items: list[str], key: str, fragment: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        AnalyzerConfig.from_assignments(items)
    assert info.value.key == key and fragment in str(info.value)


def test_a_worker_only_analyses_a_version_it_loaded() -> None:
    renames = AnalyzerConfig(detect_renames=True)
    assert config_for(DEFAULT_FINGERPRINT) is DEFAULT
    assert config_for(renames.fingerprint(), loaded=[DEFAULT, renames]) is renames
    with pytest.raises(VersionNotLoaded, match=renames.fingerprint()):
        config_for(renames.fingerprint())


# --------------------------------------------------------------------------- numbers vs git

SPACED = "dir with space/file one.txt"
NEWLINE = "new\nline/na\nme.py"
UNICODE = "日本語/ファイル ü.rs"
QUOTES = 'q"uote\'s/"both".js'


def _lines(n: int, tag: str = "line") -> str:
    return "".join(f"{tag} {i} of a reasonably long line\n" for i in range(n))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A history built to make each option matter; returns (bare repo, named shas)."""
    repo = Repo.create(tmp_path_factory.mktemp("analyzer") / "work")
    shas: dict[str, str] = {}
    files = {
        "src/core.py": _lines(40),
        "src/util.py": _lines(30, "util"),
        SPACED: _lines(20, "spaced"),
        NEWLINE: _lines(20, "newline"),
        UNICODE: _lines(20, "unicode"),
        QUOTES: _lines(20, "quotes"),
        "vendor/lib.js": _lines(25, "vendor"),
        "vendor/deep/er/x y.js": _lines(5, "deep"),
        "app.min.js": "minified();\n",
        "web/lib.min.js": "minified(2);\n",
    }
    for name, body in files.items():
        repo.write(name, body)
    repo.write("img/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00binary")
    shas["root"] = repo.commit("root: everything")

    # renames with edits: same directory, across directories, awkward names
    repo.rm("src/core.py")
    repo.write("src/engine.py", _lines(40).replace("line 3 ", "LINE 3 ") + "added\n")
    repo.rm("src/util.py")
    repo.write("lib/helpers/util.py", _lines(30, "util") + "more\n")
    for old in (SPACED, NEWLINE, UNICODE, QUOTES):
        body = (repo.root / old).read_bytes()
        repo.rm(old)
        repo.write("moved " + old.replace("/", "/moved "), body + b"edit\n")
    shas["renames"] = repo.commit("renames with edits")

    # a binary rename and modification; a rename out of and into excluded directories
    repo.rm("img/logo.png")
    repo.write("assets/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00binary")
    repo.write("src/data.bin", b"\x00\x01\x02")
    repo.rm("vendor/lib.js")
    repo.write("src/vendored.js", _lines(25, "vendor") + "patched\n")
    repo.rm("lib/helpers/util.py")
    repo.write("vendor/util.py", _lines(30, "util") + "more\n")
    shas["cross"] = repo.commit("rename across excluded boundaries")

    # whitespace-only and mixed edits
    engine = (repo.root / "src/engine.py").read_text()
    repo.write("src/engine.py", engine.replace(" of ", "  of\t").replace("\n", "   \n"))
    shas["whitespace"] = repo.commit("whitespace only")
    engine = (repo.root / "src/engine.py").read_text()
    repo.write("src/engine.py", "    " + engine.replace("line 7", "line seven") + "tail\n")
    shas["mixed"] = repo.commit("whitespace and real edits")

    # only excluded files change, then nothing at all
    repo.write("vendor/deep/er/x y.js", _lines(9, "deep"))
    repo.write("app.min.js", "minified(); again();\n")
    shas["excluded_only"] = repo.commit("vendor and minified only")
    shas["empty"] = repo.commit("empty")

    # a merge: side renames and touches vendor, main edits whitespace and a minified file
    repo.git("checkout", "-q", "-b", "side")
    repo.rm("src/vendored.js")
    repo.write("side dir/vendored.js", _lines(25, "vendor") + "patched\nside\n")
    repo.write("vendor/side.js", _lines(4, "side"))
    repo.write("web/lib.min.js", "minified(3);\n")
    shas["side"] = repo.commit("side work")
    repo.git("checkout", "-q", "main")
    repo.write(SPACED.replace("/", "/moved "), _lines(20, "spaced").replace(" ", "  "))
    shas["main"] = repo.commit("main work")
    shas["merge"] = repo.merge("side", msg="merge side")
    return repo.bare(), shas


CONFIGS = {
    "default": DEFAULT,
    "renames": AnalyzerConfig(detect_renames=True),
    "whitespace": AnalyzerConfig(ignore_whitespace=True),
    "exclude": AnalyzerConfig(exclude_paths=("vendor/**", "*.min.js", "dir with space/**")),
    "exclude_anywhere": AnalyzerConfig(exclude_paths=("**/*.min.js",)),
    "everything": AnalyzerConfig(
        detect_renames=True, ignore_whitespace=True, exclude_paths=("vendor/**", "*.min.js")
    ),
}

Row = tuple[str, int, int, bool, str | None]


def git_show_numstat(bare: Path, sha: str, config: AnalyzerConfig) -> list[Row]:
    """What ``git show --numstat`` reports for one commit under the options ``config``
    stands for, spelled out independently of workers.analysis.history, parsed here."""
    flags = ["-M" if config.detect_renames else "--no-renames"]
    if config.ignore_whitespace:
        flags.append("-w")
    spec = [f":(exclude,glob){p}" for p in config.exclude_paths]
    out = git(
        bare,
        "show",
        "--format=",
        "-z",
        "--numstat",
        "--diff-merges=first-parent",
        *flags,
        sha,
        *(["--", *spec] if spec else []),
        git_dir=bare,
    )
    rows: list[Row] = []
    tokens = iter(out.split(b"\0"))
    for tok in tokens:
        tok = tok.lstrip(b"\n")
        if not tok:
            continue
        added, deleted, path = tok.split(b"\t", 2)
        old = None
        if path == b"":  # rename: the old and the new path are the next two tokens
            old, path = next(tokens).decode(), next(tokens)
        binary = added == b"-"
        rows.append(
            (path.decode(), 0 if binary else int(added), 0 if binary else int(deleted), binary, old)
        )
    return sorted(rows, key=repr)


def rows_of(record: CommitRecord) -> list[Row]:
    return sorted(
        ((f.path, f.added, f.deleted, f.binary, f.old_path) for f in record.files), key=repr
    )


def stream(bare: Path, config: AnalyzerConfig) -> dict[str, CommitRecord]:
    shas = git(bare, "rev-list", "--topo-order", "--reverse", "HEAD", git_dir=bare).decode()
    got = {c.sha: c for c in stream_commits(bare, shas.split(), config=config)}
    assert list(got) == shas.split()  # every commit, whatever the config excludes
    return got


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_version_streams_exactly_what_git_reports(
    hostile: tuple[Path, dict[str, str]], name: str
) -> None:
    bare, _ = hostile
    config = CONFIGS[name]
    for sha, record in stream(bare, config).items():
        expected = git_show_numstat(bare, sha, config)
        assert rows_of(record) == expected, (name, sha)
        assert record.files_changed == len(expected)
        assert record.insertions == sum(r[1] for r in expected)
        assert record.deletions == sum(r[2] for r in expected)


def test_the_fixture_makes_every_option_change_the_numbers(
    hostile: tuple[Path, dict[str, str]],
) -> None:
    bare, _ = hostile
    totals = {
        name: [(c.files_changed, c.insertions, c.deletions) for c in stream(bare, cfg).values()]
        for name, cfg in CONFIGS.items()
    }
    assert len({tuple(t) for t in totals.values()}) == len(CONFIGS)


def test_detect_renames_makes_a_renamed_file_one_row(hostile: tuple[Path, dict[str, str]]) -> None:
    bare, shas = hostile
    plain = stream(bare, DEFAULT)[shas["renames"]]
    renamed = stream(bare, CONFIGS["renames"])[shas["renames"]]
    assert plain.files_changed == 12 and renamed.files_changed == 6
    by_path = {f.path: f for f in renamed.files}
    assert by_path["src/engine.py"].old_path == "src/core.py"
    assert (by_path["src/engine.py"].added, by_path["src/engine.py"].deleted) == (2, 1)
    assert by_path["lib/helpers/util.py"].old_path == "src/util.py"
    for old in (SPACED, NEWLINE, UNICODE, QUOTES):
        new = "moved " + old.replace("/", "/moved ")
        assert (by_path[new].old_path, by_path[new].added, by_path[new].deleted) == (old, 1, 0)
    assert by_path["lib/helpers/util.py"].language == "Python"
    cross = {f.path: f for f in stream(bare, CONFIGS["renames"])[shas["cross"]].files}
    assert cross["assets/logo.png"].binary and cross["assets/logo.png"].old_path == "img/logo.png"


def test_ignore_whitespace_counts_no_whitespace_only_lines(
    hostile: tuple[Path, dict[str, str]],
) -> None:
    bare, shas = hostile
    plain, ignored = stream(bare, DEFAULT), stream(bare, CONFIGS["whitespace"])
    assert plain[shas["whitespace"]].insertions == 41
    ws = ignored[shas["whitespace"]]
    assert (ws.insertions, ws.deletions) == (0, 0)
    mixed = ignored[shas["mixed"]]
    assert (mixed.insertions, mixed.deletions) == (2, 1)
    assert (plain[shas["mixed"]].insertions, plain[shas["mixed"]].deletions) == (3, 2)


def test_excluded_paths_vanish_but_their_commits_stay(hostile: tuple[Path, dict[str, str]]) -> None:
    bare, shas = hostile
    got = stream(bare, CONFIGS["exclude"])
    assert got[shas["excluded_only"]].files == ()  # present, with no files
    assert got[shas["empty"]].files == ()
    root = {f.path for f in got[shas["root"]].files}
    assert not any(p.startswith(("vendor/", "dir with space/")) for p in root)
    # glob pathspecs: "*.min.js" is the top level only, "**/*.min.js" every level
    assert "app.min.js" not in root and "web/lib.min.js" in root
    anywhere = {f.path for f in stream(bare, CONFIGS["exclude_anywhere"])[shas["root"]].files}
    assert "app.min.js" not in anywhere and "web/lib.min.js" not in anywhere
    # git applies the pathspec before rename detection: in/out of vendor is add/delete
    cross = {f.path: f for f in stream(bare, CONFIGS["everything"])[shas["cross"]].files}
    assert cross["src/vendored.js"].old_path is None and cross["src/vendored.js"].added == 26
    assert "vendor/util.py" not in cross and cross["lib/helpers/util.py"].deleted == 31
    merge = got[shas["merge"]]
    assert {f.path for f in merge.files} == {
        "side dir/vendored.js",
        "src/vendored.js",
        "web/lib.min.js",
    }


# --------------------------------------------------------------------------- the worker


@pytest.mark.django_db(transaction=True)
def test_an_analyze_job_refuses_a_chunk_of_a_version_its_worker_has_not_loaded(
    git_repo: Any,
) -> None:
    """Through a real RQ worker: the chunk planned for the default version is stored with
    the default numbers; a chunk planned for another version whose job lands on this
    worker's queue stores nothing and is handed back to its own version's queue, no
    attempt spent (a worker serving the wrong version dead-letters it: see
    tests/dashboard/rollouts/test_routing.py)."""
    from dashboard.models import Chunk, Commit, JobRun, Repository
    from dashboard.repositories.lifecycle import current_fingerprint, submit_repository
    from dashboard.runs.attempts import enqueue_run, ensure_run
    from tests.conftest import run_workers
    from workers.analysis.analyzer import queue_name

    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    assert current_fingerprint() == DEFAULT_FINGERPRINT
    assert Commit.objects.filter(repository=repo, fingerprint=DEFAULT_FINGERPRINT).count() == 3

    foreign = AnalyzerConfig(detect_renames=True).fingerprint()
    shas = list(reversed(git_repo.shas()))
    chunk = Chunk.objects.create(
        repository=repo, fingerprint=foreign, key=f"{shas[0]}..{shas[-1]}",
        shas="\n".join(shas), size=len(shas),
    )  # fmt: skip
    run = ensure_run(
        kind=JobRun.Kind.ANALYZE,
        job_id=chunk.job_id(),
        queue=queue_name(DEFAULT_FINGERPRINT),  # misrouted onto the default version's queue
        repository_id=repo.pk,
        chunk_id=chunk.pk,
        fingerprint=foreign,
    )
    assert enqueue_run(run)
    run_workers()
    run.refresh_from_db()
    assert (run.state, run.queue, run.budget_used) == ("queued", queue_name(foreign), 0)
    attempt = run.attempt_rows.get()
    assert "not loaded by this worker" in attempt.error and foreign in attempt.error
    assert not Commit.objects.filter(repository=repo, fingerprint=foreign).exists()
    assert Commit.objects.filter(repository=repo, fingerprint=DEFAULT_FINGERPRINT).count() == 3


# ---------------------------------------------------------------------------- path_excluded

EXCLUDE_PATHS = [
    "top.js", "a.min.js", "README.md", "vendor/y.js", "vendor/a/b/x.js", "vendor/a/c.py",
    "docs/guide/intro.md", "docs/x", "web/js/app.min.js", "web/css/site.css", "src/a.py",
    "src/ab.py", "src/sub/a.py", "vendors/z.js", "b[1].txt",
]  # fmt: skip
EXCLUDE_PATTERNS = [
    "vendor/*", "vendor", "vendor/", "vendor/**", "*.js", "**/*.js", "vendor/a", "vendor/a*",
    "vendor/*/b", "vend*", "**/b", "vendor/**/x.js", "**", "v?ndor/y.js", "[tv]op.js",
    "[!t]op.js", "**/*.min.js", "docs", "*.md", "**/*.md", "web/*/app.min.js", "src/?.py",
    "src/**/a.py", "src/*", "b\\[1].txt", "a**.js",
]  # fmt: skip


def test_path_excluded_matches_as_git_does(tmp_path: Path) -> None:
    """Every pattern against every path, compared with what ``git log --numstat --
    :(exclude,glob)PATTERN`` keeps of one commit adding them all."""
    from tests.support.gitrepo import GitRepo
    from workers.analysis.analyzer import path_excluded

    repo = GitRepo.create(tmp_path / "r")
    repo.commit("all", {p: "x\n" for p in EXCLUDE_PATHS})
    for pattern in EXCLUDE_PATTERNS:
        out = repo.git(
            "log", "-1", "--sparse", "--numstat", "--format=", "-z", "--",
            f":(exclude,glob){pattern}",
        )  # fmt: skip
        kept = {field.split("\t")[-1] for field in out.strip("\n\0").split("\0") if field}
        ours = {p for p in EXCLUDE_PATHS if not path_excluded(p, [pattern])}
        assert ours == kept, pattern
