"""dashboard.analytics.lenses: the rule table as SQL, as Python and as git's glob
pathspecs agree path by path; the attributes come from git's ``check-attr`` at the head;
the bot rule in SQL and Python agree; and every lens's totals, co-authors credited, equal
what ``git log --numstat`` prints with the matching pathspecs and author filter."""

from __future__ import annotations

import shlex
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from dashboard.analytics.lenses import (
    LENSES,
    RULES,
    RULESET,
    Attributes,
    Lens,
    UnknownLens,
    build_lens,
    classify,
    is_bot,
    parse_exclude,
    read_attributes,
    rules_sql,
)
from dashboard.analytics.ownership import file_ownership
from dashboard.analytics.people import author_activity, authors, file_history
from dashboard.analytics.reports import parse_params, report
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import Window
from tests.support.analytics_history import (
    BOB,
    BOT,
    CY,
    DEE,
    LENS_CASES,
    LENS_GIT,
    analysed,
    build_lenses,
    git_log,
    lens_totals,
)
from tests.support.gitrepo import GitRepo
from workers import git

SAMPLE_PATHS = [
    "node_modules/a/index.js",
    "web/node_modules/b.js",
    "my_node_modules/x.js",
    "node_modules.txt",
    "src/vendor/lib.c",
    "vendored/lib.c",
    "third_party/z/z.h",
    "package-lock.json",
    "sub/package-lock.json",
    "xpackage-lock.json",
    "Cargo.lock",
    "rust/Cargo.lock",
    "poetry.lock",
    "yarn.lock",
    "app.min.js",
    "static/x.min.css",
    "static/min.js",
    "api/svc.pb.go",
    "proto/msg_pb2.py",
    "proto/msgxpb2.py",
    "ui/Form.designer.cs",
    "src/app.js",
    "50%_done_pb2.py",
    "README.md",
]


def _sql_matches(lens: str, paths: list[str]) -> set[str]:
    sql = rules_sql(lens, "t.p")
    rows = " UNION ALL ".join("SELECT %s AS p" for _ in paths)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT t.p FROM ({rows}) t WHERE {sql}", paths)
        return {r[0] for r in cursor.fetchall()}


@pytest.mark.django_db
def test_each_rule_is_the_same_in_sql_python_and_git(tmp_path: Path) -> None:
    repo = GitRepo.create(tmp_path / "paths")
    for path in SAMPLE_PATHS:
        repo.write(path, "x\n")
    repo.git("add", "--", *SAMPLE_PATHS)
    for rule in RULES:
        assert not set("*?[]\\%") & set(rule.value), rule  # plain names: no glob of their own
    for lens in ("generated", "vendored", "lock", "minified"):
        rules = [r for r in RULES if r.lens == lens]
        python = {p for p in SAMPLE_PATHS if any(r.matches(p) for r in rules)}
        listed = repo.git("ls-files", "-z", "--", *(f":(glob){r.glob()}" for r in rules))
        assert python == set(filter(None, listed.split("\0"))), lens
        assert _sql_matches(lens, SAMPLE_PATHS) == python, lens
    assert _sql_matches("vendored", SAMPLE_PATHS) == {
        "node_modules/a/index.js",
        "web/node_modules/b.js",
        "src/vendor/lib.c",
        "third_party/z/z.h",
    }


@pytest.mark.django_db(transaction=True)
def test_attributes_add_to_and_take_out_of_a_lens(tmp_path: Path) -> None:
    repo = analysed(build_lenses(tmp_path / "origin"))
    fp = Scope.of(repo, Window()).fingerprint
    assert classify(repo.pk, fp, ["generated"], Attributes()) == ("api/svc.pb.go",)
    attributes = Attributes(
        "h", marked={"generated": ("build/out.js",)}, unmarked={"generated": ("api/svc.pb.go",)}
    )
    assert classify(repo.pk, fp, ["generated"], attributes) == ("build/out.js",)
    assert classify(repo.pk, fp, ["lock", "minified"], attributes) == (
        "package-lock.json",
        "static/app.min.js",
        "yarn.lock",
    )
    lens = build_lens({"generated", "vendored"}, repo, fp)
    assert lens.paths == (
        "api/svc.pb.go",
        "build/out.js",
        "node_modules/left-pad/index.js",
        "node_modules/left-pad/package.json",
        "vendor/lib/x.go",
    )
    assert build_lens({"bots"}, repo, fp).paths == ()


def test_unknown_lenses_are_refused_by_name() -> None:
    assert parse_exclude("lock, Bots,,") == frozenset({"lock", "bots"})
    assert parse_exclude(["lock", "minified,vendored"]) == {"lock", "minified", "vendored"}
    assert parse_exclude(None) == parse_exclude("") == frozenset()
    with pytest.raises(UnknownLens, match=r"exclude: unknown lens 'tests' \(one of generated"):
        parse_exclude("lock,tests")


@pytest.mark.django_db
def test_the_bot_rule_in_sql_and_in_python() -> None:
    people = [
        BOT,
        ("renovate-bot", "bot@renovateapp.com"),
        ("Ada", "ada@example.com"),
        ("ci", "ci+50%@build.example"),
        ("Snap [BOT]", "snap@example.com"),
    ]
    lens = Lens(exclude=frozenset({"bots"}), bot_patterns=("renovate*", "*@build.example"))
    condition = lens.bot_sql("t.n", "t.e")
    rows = " UNION ALL ".join("SELECT %s AS n, %s AS e" for _ in people)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.n FROM ({rows}) t WHERE {condition}",
            [v for p in people for v in p],
        )
        found = {r[0] for r in cursor.fetchall()}
    assert found == {n for n, e in people if is_bot(n, e, lens.bot_patterns)}
    assert found == {"dependabot[bot]", "renovate-bot", "ci", "Snap [BOT]"}


@pytest.mark.django_db(transaction=True)
def test_attributes_are_read_by_git_at_the_head(tmp_path: Path) -> None:
    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    fp = Scope.of(repo, Window()).fingerprint
    got = read_attributes(repo, fp)
    assert got.marked == {"generated": ("build/out.js",)} and got.unmarked == {}
    assert got.head == repo.head and got.source == f".gitattributes at {repo.head[:12]}"
    assert read_attributes(repo, fp) is got  # cached per head
    mirror = git.mirror_path(Path(django_settings.WORKSPACE), repo.pk)
    assert not (mirror / "index").exists()  # the head's tree went to a throw-away index
    # A path no commit stored is asked of git as well (patterns, not files, decide).
    assert read_attributes(repo, fp, ["build/new/x.js", "src/a.js"]).marked == {
        "generated": ("build/new/x.js",)
    }
    repo.head = "0" * 40  # a head the mirror lacks: git refuses, the rules alone apply
    assert read_attributes(repo, fp).source.startswith("not read: git failed")
    other = type(repo)(pk=repo.pk + 1000, head=repo.head)
    assert "no mirror" in read_attributes(other, fp).source


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", LENS_CASES, ids=lambda c: "+".join(c) or "none")
def test_each_lens_equals_git(tmp_path: Path, case: tuple[str, ...]) -> None:
    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    want = lens_totals(origin, case)
    params = parse_params({"exclude": ",".join(case), "limit": "1000"})
    body = report("hotspots", repo, params)
    assert {r["path"]: (r["revs"], r["churn"]) for r in body["files"]} == want.files
    people = report("authors", repo, params)["authors"]
    assert {r["author"]: (r["commits"], r["insertions"], r["deletions"]) for r in people} == (
        want.people
    )
    # Coupling through the lens: every pair of files of a commit, from git's change sets.
    loose = {"min_revs": "0", "min_shared_revs": "1", "min_coupling": "0"}
    coupled = report("coupling", repo, parse_params({**loose, "exclude": ",".join(case)}))
    args = [w for lens in case if lens == "bots" for w in LENS_GIT["bots"]]
    specs = [w for lens in case if lens != "bots" for w in LENS_GIT[lens]]
    sets = [
        sorted(c.files) for c in git_log(origin, *args, *(["--", ".", *specs] if specs else []))
    ]
    shared = Counter((a, b) for files in sets for a, b in combinations(files, 2))
    revs = Counter(f for files in sets for f in files)
    assert {
        (r["entity"], r["coupled"]): (r["shared_revs"], r["revs"], r["coupled_revs"])
        for r in coupled["files"]
    } == {(a, b): (n, revs[a], revs[b]) for (a, b), n in shared.items()}
    assert body["provenance"]["lenses"]["ruleset"] == RULESET
    assert body["provenance"]["lenses"]["excluded"] == [n for n in LENSES if n in case]
    # The reproduce command itself, run in the clone, prints the same files.
    words = shlex.split(body["provenance"]["command"])
    assert words[:5] == ["git", "log", "--no-merges", "--no-renames", "--numstat"]
    again: dict[str, list[int]] = {}
    for c in git_log(origin, *words[5:]):
        for path, (a, d) in c.files.items():
            row = again.setdefault(path, [0, 0])
            row[0] += 1
            row[1] += a + d
    assert {k: (v[0], v[1]) for k, v in again.items()} == want.files


@pytest.mark.django_db(transaction=True)
def test_co_authors_are_credited_with_the_whole_commit(tmp_path: Path) -> None:
    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    scope = Scope.of(repo, Window())
    pair = next(c for c in git_log(origin) if "src/util.js" in c.files)
    lines = (sum(a for a, _ in pair.files.values()), sum(d for _, d in pair.files.values()))
    cy = author_activity(scope, CY[1])
    assert cy is not None and (cy["commits"], cy["insertions"], cy["deletions"]) == (1, *lines)
    assert {f["path"] for f in cy["files"]} == set(pair.files)
    dee = next(r for r in authors(scope) if r["author"] == DEE[1])
    assert dee["name"] == "Dee" and dee["commits"] == 1  # a co-author's name is the trailer's
    util = next(r for r in file_ownership(scope) if r["path"] == "src/util.js")
    # Bob named himself as a co-author too: credited once.
    assert (util["revs"], util["credits"], util["authors"]) == (1, 3, 3)
    assert util["ownership"] == round(1 / 3, 4) and util["bus_factor"] == 2
    history = file_history(scope, "src/util.js")
    assert history is not None and history["revs"] == 1
    assert {a["author"] for a in history["authors"]} == {BOB[1], CY[1], DEE[1]}
    # The bots lens credits no bot co-author; without it the bot is credited.
    api = next(r for r in file_ownership(scope) if r["path"] == "src/api.py")
    assert api["credits"] == 3 and api["revs"] == 2
    lens = build_lens({"bots"}, repo, scope.fingerprint)
    lensed = Scope(repo, scope.fingerprint, Window(), lens)
    api = next(r for r in file_ownership(lensed) if r["path"] == "src/api.py")
    assert (api["revs"], api["credits"]) == (2, 2)


@pytest.mark.django_db(transaction=True)
def test_the_identity_map_joins_addresses(tmp_path: Path, settings) -> None:
    settings.IDENTITY_MAP = {"DEE@example.com": "cy@example.com"}
    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    body = report("authors", repo, parse_params({}))
    people = {r["author"]: r["commits"] for r in body["authors"]}
    assert DEE[1] not in people and people[CY[1]] == 1  # one commit, credited once
    assert body["provenance"]["lenses"]["identity_map"] == 1


@pytest.mark.django_db(transaction=True)
def test_configured_bot_patterns_and_their_git_author_filter(tmp_path: Path, settings) -> None:
    settings.BOT_AUTHORS = ["ADA*", "*@nowhere.example"]
    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    body = report("hotspots", repo, parse_params({"exclude": "bots", "limit": "1000"}))
    assert body["provenance"]["lenses"]["bot_patterns"] == ["*[bot]*", "ADA*", "*@nowhere.example"]
    kept = [c for c in git_log(origin) if not is_bot(*_identity(origin, c.sha), ["ADA*"])]
    assert {c.author for c in kept} == {BOB[1]}  # Ada (by name) and the bot are left out
    want: dict[str, list[int]] = {}
    for c in kept:
        for path, (a, d) in c.files.items():
            row = want.setdefault(path, [0, 0])
            row[0] += 1
            row[1] += a + d
    got = {r["path"]: [r["revs"], r["churn"]] for r in body["files"]}
    assert got == want
    # The reproduce command's --perl-regexp author filter selects the same commits.
    words = shlex.split(body["provenance"]["command"])
    assert {c.sha for c in git_log(origin, *words[5:])} == {c.sha for c in kept}


def _identity(origin: GitRepo, sha: str) -> tuple[str, str]:
    name, email = origin.git("log", "-1", "--format=%aN%x00%aE", sha).strip().split("\0")
    return name, email


@pytest.mark.django_db(transaction=True)
def test_a_head_without_linguist_attributes_asks_git_about_no_path(tmp_path: Path) -> None:
    from tests.support.analytics_history import build

    repo = analysed(build(tmp_path / "origin"))
    got = read_attributes(repo, Scope.of(repo, Window()).fingerprint)
    assert got.marked == {} and got.unmarked == {}
    assert got.source == f".gitattributes at {repo.head[:12]}: no linguist attributes"
