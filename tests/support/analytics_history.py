"""A real git history with planted patterns for the analytics (docs/analytics.md), and
what ``git log --numstat`` says about it, parsed here independently of gitward.

Planted: ``core/a.py`` and ``core/b.py`` change together in 8 of their 10 revisions each
(degree 80); a 35-file commit touching both (over code-maat's change-set limit of 30); Ada
makes 9 of the 10 changes of ``handbook/`` (90 %); Cy changes ``legacy/`` only, then is silent
for 200+ days; Bob commits under an old address that ``.mailmap`` maps to his current one;
a side branch merged with ``--no-ff`` (its merge commit is left out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.gitrepo import GitRepo

ADA = ("Ada Lovelace", "ada@example.com")
BOB = ("Bob", "bob@example.com")
BOB_OLD = ("bobby", "bob@old.example.org")
CY = ("Cy", "cy@example.com")
DAY = 86_400


def build(path: Path) -> GitRepo:
    repo = GitRepo.create(path)
    repo.commit("init", {".mailmap": "Bob <bob@example.com> <bob@old.example.org>\n"}, author=ADA)
    for i in range(3):
        repo.commit(f"legacy {i}", {"legacy/old.py": f"v = {i}\n"}, author=CY)
    repo.commit("legacy util", {"legacy/util.py": "u = 1\n"}, author=CY)
    repo.clock += 210 * DAY  # Cy is never seen again
    n = 0
    for i in range(8):
        n += 1
        repo.commit(
            f"core pair {i}", {"core/a.py": f"a = {n}\n", "core/b.py": f"b = {n}\n"}, author=ADA
        )
        if i < 2:
            repo.commit(
                f"core c {i}", {"core/a.py": f"a = {n}c\n", "core/c.py": f"c = {i}\n"}, author=ADA
            )
    n += 1
    repo.commit("b alone", {"core/b.py": f"b = {n}\n"}, author=ADA)
    repo.commit("b alone again", {"core/b.py": f"b = {n}x\n"}, author=ADA)
    big = {f"gen/f{i:02}.txt": f"{i}\n" for i in range(33)}
    repo.commit(
        "big sweep", {**big, "core/a.py": "a = big\n", "core/b.py": "b = big\n"}, author=ADA
    )
    for i in range(10):
        repo.clock += 2 * DAY
        who = BOB_OLD if i == 4 else ADA
        repo.commit(f"guide {i}", {"handbook/guide.md": f"line {i}\n" * (i + 1)}, author=who)
    repo.git("checkout", "-q", "-b", "side")
    repo.commit("side work", {"side/x.py": "x = 1\n"}, author=BOB)
    repo.git("checkout", "-q", "main")
    repo.commit("main again", {"README.md": "hello\n"}, author=ADA)
    repo.clock += 3600
    date = f"{repo.clock} +0000"
    repo.git("merge", "-q", "--no-ff", "-m", "merge side", "side",
             GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)  # fmt: skip
    repo.commit("late", {"README.md": "hello\nagain\n", "side/x.py": "x = 2\n"}, author=BOB)
    return repo


@dataclass(frozen=True)
class LoggedCommit:
    sha: str
    committed_at: str
    author: str
    files: dict[str, tuple[int, int]]


def git_log(repo: GitRepo, *args: str) -> list[LoggedCommit]:
    """``git log --no-merges --no-renames --numstat`` (plus ``args``, e.g. ``--since``),
    parsed: each commit's committer date, mailmap author email, and per-file lines."""
    out = repo.git(
        "log", "--no-merges", "--no-renames", "--numstat", "--format=@@%H %cI %aE", *args
    )
    commits: list[LoggedCommit] = []
    for line in out.splitlines():
        if line.startswith("@@"):
            sha, at, author = line[2:].split(" ")
            commits.append(LoggedCommit(sha, at, author, {}))
        elif line.strip():
            added, deleted, path = line.split("\t", 2)
            binary = added == "-"
            commits[-1].files[path] = (0 if binary else int(added), 0 if binary else int(deleted))
    return commits


def analysed(origin: GitRepo):  # -> Repository (imported late: Django must be set up)
    """Submit ``origin`` and drain the queues with a real RQ worker until it is ready."""
    from dashboard.models import Repository
    from dashboard.repositories.lifecycle import submit_repository
    from tests.conftest import run_workers

    repo, _ = submit_repository(url=str(origin.path))
    run_workers()
    repo.refresh_from_db()
    assert repo.status == Repository.Status.READY, repo.error
    return repo


BOT = ("dependabot[bot]", "49699333+dependabot[bot]@users.noreply.github.com")
DEE = ("Dee", "dee@example.com")


def build_lenses(path: Path) -> GitRepo:
    """A history with a file of every lens (docs/analytics.md#lenses) and co-authors:
    a ``node_modules/`` tree and a ``vendor/`` directory changed on its own (vendored), a
    ``package-lock.json`` and a ``yarn.lock`` (lock), a ``.min.js`` (minified), a
    ``.pb.go`` (a generated rule) and ``build/`` marked ``linguist-generated`` in
    ``.gitattributes``; ``dependabot[bot]`` commits, one of them to an ordinary file;
    Bob's commit with ``Co-authored-by:`` Cy and Dee (Bob named again: credited once),
    and Ada's with the bot as co-author."""
    repo = GitRepo.create(path)
    repo.commit(
        "init",
        {
            "README.md": "lenses\n",
            ".gitattributes": "build/** linguist-generated\n",
            "src/app.js": "let a = 1;\n",
        },
        author=ADA,
    )
    repo.commit(
        "add deps",
        {
            "node_modules/left-pad/index.js": "module.exports = 1;\n" * 5,
            "node_modules/left-pad/package.json": "{}\n",
            "package-lock.json": "{\n}\n",
            "src/app.js": "let a = 2;\nlet b = 1;\n",
        },
        author=ADA,
    )
    repo.commit("vendor only", {"vendor/lib/x.go": "package x\n" * 3}, author=BOB)
    repo.commit(
        "minify",
        {"static/app.min.js": "var a=1;" * 4 + "\n", "src/app.js": "let a = 3;\n"},
        author=ADA,
    )
    repo.commit(
        "generate",
        {
            "build/out.js": "out\n" * 7,
            "api/svc.pb.go": "package api\n" * 2,
            "src/api.py": "x = 1\n",
        },
        author=BOB,
    )
    repo.commit(
        "Bump left-pad", {"package-lock.json": "{\n  \"v\": 2\n}\n", "yarn.lock": "# y\n"},
        author=BOT,
    )  # fmt: skip
    repo.commit(
        "pair work\n\nCo-authored-by: Cy <cy@example.com>\n"
        "Co-authored-by: Dee <dee@example.com>\nCo-authored-by: Bob <bob@example.com>",
        {"src/app.js": "let a = 4;\nlet c = 2;\n", "src/util.js": "u\n"},
        author=BOB,
    )
    repo.commit("Bump version", {"src/version.txt": "2\n"}, author=BOT)
    repo.commit(
        f"with the bot\n\nCo-authored-by: {BOT[0]} <{BOT[1]}>",
        {"src/api.py": "x = 2\ny = 3\n", "yarn.lock": "# y2\n"},
        author=ADA,
    )
    return repo


def co_authors(repo: GitRepo) -> dict[str, list[str]]:
    """Each commit's ``Co-authored-by:`` e-mails as git's own trailer parser reads them."""
    out = repo.git(
        "log", "--format=%H%x1f%(trailers:key=Co-authored-by,valueonly,separator=%x1f)%x1e"
    )
    found: dict[str, list[str]] = {}
    for record in out.split("\x1e"):
        sha, *values = record.strip().split("\x1f")
        if sha:
            found[sha] = [v.rsplit("<", 1)[1].rstrip(">").strip() for v in values if "<" in v]
    return found


#: Each lens of ``build_lenses`` as git selects it, written by hand from what is planted
#: (not from gitward's rule table): pathspecs to leave out, or the author filter.
LENS_GIT: dict[str, list[str]] = {
    "generated": [":(exclude)build", ":(exclude)api/svc.pb.go"],
    "vendored": [":(exclude)node_modules", ":(exclude)vendor"],
    "lock": [":(exclude)package-lock.json", ":(exclude)yarn.lock"],
    "minified": [":(exclude)static/app.min.js"],
    "bots": ["--perl-regexp", r"--author=^(?!.*\[bot\])"],
}


@dataclass(frozen=True)
class LensTotals:
    """What git says of ``build_lenses`` through some lenses: per file (revisions,
    churn); per credited person (commits, lines added, lines deleted), a commit credited
    to its author and its co-authors once each (the bots lens credits no bot)."""

    files: dict[str, tuple[int, int]]
    people: dict[str, tuple[int, int, int]]


def lens_totals(repo: GitRepo, lenses: list[str] | tuple[str, ...]) -> LensTotals:
    args: list[str] = []
    specs: list[str] = []
    for lens in lenses:
        (args if lens == "bots" else specs).extend(LENS_GIT[lens])
    log = git_log(repo, *args, *(["--", ".", *specs] if specs else []))
    co = co_authors(repo)
    files: dict[str, list[int]] = {}
    people: dict[str, list[int]] = {}
    for c in log:
        for path, (added, deleted) in c.files.items():
            row = files.setdefault(path, [0, 0])
            row[0] += 1
            row[1] += added + deleted
        credited = {c.author, *co[c.sha]}
        if "bots" in lenses:
            credited = {p for p in credited if "[bot]" not in p}
        for person in credited:
            row = people.setdefault(person, [0, 0, 0])
            row[0] += 1
            row[1] += sum(a for a, _ in c.files.values())
            row[2] += sum(d for _, d in c.files.values())
    return LensTotals(
        {k: (v[0], v[1]) for k, v in files.items()},
        {k: (v[0], v[1], v[2]) for k, v in people.items()},
    )


#: The lens selections the interface tests walk: none, each alone, and all together.
LENS_CASES: list[tuple[str, ...]] = [
    (),
    ("generated",),
    ("vendored",),
    ("lock",),
    ("minified",),
    ("bots",),
    ("generated", "vendored", "lock", "minified", "bots"),
]


def queue_state() -> tuple[dict[bytes, object], int]:
    """Every RQ key of the queue server with its members, and the number of job runs:
    what enqueueing anything would change (a lens must change neither)."""
    from dashboard.infra import queues
    from dashboard.models import JobRun

    conn = queues.connection()
    state: dict[bytes, object] = {}
    for key in sorted(conn.keys("rq:*")):
        kind = conn.type(key)
        if kind == b"list":
            state[key] = tuple(conn.lrange(key, 0, -1))
        elif kind == b"zset":
            state[key] = tuple(conn.zrange(key, 0, -1))
        elif kind == b"set":
            state[key] = tuple(sorted(conn.smembers(key)))
        else:
            state[key] = kind
    return state, JobRun.objects.count()
