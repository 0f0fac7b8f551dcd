"""dashboard.analytics.export: every exported commit and file row of a real analysed
history equals what ``git log --numstat`` prints for the head (equality, merges included
for the commits), inside a window and through the lenses; CSV and NDJSON carry the same
rows; the API (one repository, several, report tables as NDJSON, its 4xx) and the CLI
stream them; and the memory consuming an export peaks at the same height for 50,000
rows as for 200,000 (a memory property: nothing measures time)."""

from __future__ import annotations

import csv
import io
import json
import tracemalloc
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import AsyncClient, Client
from django.utils import timezone

from dashboard.analytics.export import (
    BATCH,
    EXPORT_COLUMNS,
    Export,
    export_lines,
    parse_export,
    parse_repository_ids,
)
from dashboard.analytics.reports import BadParameter
from dashboard.models import ApiToken, Commit, FileChange, Repository
from dashboard.repositories import current_fingerprint
from tests.support.analytics_history import (
    LENS_GIT,
    analysed,
    build,
    build_lenses,
    co_authors,
    git_log,
)
from tests.support.gitrepo import GitRepo


def rows_of(text: str, fmt: str) -> list[dict[str, Any]]:
    """The export's rows as dicts, parsed from CSV or NDJSON (every NDJSON line parses)."""
    if fmt == "ndjson":
        return [json.loads(line) for line in text.splitlines()]
    return list(csv.DictReader(io.StringIO(text)))


def exported(repos: list[Repository], **values: str) -> list[dict[str, Any]]:
    """``values`` exported as CSV and as NDJSON: the two must hold the same rows; the
    NDJSON's (typed) are returned."""
    found = {}
    for fmt in ("csv", "ndjson"):
        export = parse_export({**values, "format": fmt})
        found[fmt] = rows_of("".join(export_lines(repos, export)), fmt)
    as_text = [
        {k: "; ".join(v) if isinstance(v, list) else str(v) for k, v in row.items()}
        for row in found["ndjson"]
    ]
    assert found["csv"] == as_text
    return found["ndjson"]


def file_rows(rows: list[dict[str, Any]]) -> Counter[tuple[str, str, int, int]]:
    return Counter((r["sha"], r["path"], r["added"], r["deleted"]) for r in rows)


def git_file_rows(origin: GitRepo, *args: str) -> Counter[tuple[str, str, int, int]]:
    return Counter(
        (c.sha, path, a, d) for c in git_log(origin, *args) for path, (a, d) in c.files.items()
    )


def git_commits(origin: GitRepo) -> dict[str, dict[str, Any]]:
    """Every commit of the head (merges too): its mailmap author, committer date, merge
    flag, and its lines and files as ``git diff --numstat`` of its first parent says."""
    out = origin.git("log", "--format=%H%x1f%aN%x1f%aE%x1f%cI%x1f%P")
    found: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        sha, name, email, at, parents = line.split("\x1f")
        first = parents.split()[0] if parents else "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        numstat = origin.git("diff", "--no-renames", "--numstat", first, sha)
        lines = [n.split("\t", 2) for n in numstat.splitlines() if n.strip()]
        found[sha] = {
            "author_name": name,
            "author_email": email,
            "committed_at": datetime.fromisoformat(at),
            "insertions": sum(int(a) for a, _, _ in lines if a != "-"),
            "deletions": sum(int(d) for _, d, _ in lines if d != "-"),
            "files": len(lines),
            "merge": len(parents.split()) > 1,
        }
    return found


@pytest.mark.django_db(transaction=True)
def test_commits_and_files_equal_git_log_for_the_head_and_the_window(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    files = exported([repo], what="files")
    assert file_rows(files) == git_file_rows(origin)
    assert {(r["repository"], r["name"]) for r in files} == {(repo.pk, repo.name)}
    assert list(files[0]) == list(EXPORT_COLUMNS["files"])
    assert not any(r["binary"] for r in files)

    commits = exported([repo], what="commits")
    want = git_commits(origin)
    assert len(commits) == len(want)  # each commit once
    got = {
        r["sha"]: {**r, "committed_at": datetime.fromisoformat(r["committed_at"])} for r in commits
    }
    assert {sha: {k: got[sha][k] for k in want[sha]} for sha in got} == want
    assert sum(r["merge"] for r in commits) == 1  # the --no-ff merge of "side"
    assert all(r["co_authors"] == [] for r in commits)

    # A window: the days of the "guide" commits, as git log --since --until selects them.
    days = sorted({c.committed_at[:10] for c in git_log(origin, "--grep=^guide")})
    since, until = days[1], days[-2]
    window = [f"--since={since}T00:00:00Z", f"--until={until}T23:59:59Z"]
    inside = exported([repo], what="files", since=since, until=until)
    assert inside and file_rows(inside) == git_file_rows(origin, *window)
    logged = origin.git("log", "--format=%H", *window).split()
    assert [r["sha"] for r in exported([repo], what="commits", since=since, until=until)] == (
        logged[::-1]
    )  # in id order: oldest first, as the analysis stored them


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", [("lock", "vendored"), ("bots",), ("generated", "minified")])
def test_the_lenses_leave_out_what_git_leaves_out(tmp_path: Path, case: tuple[str, ...]) -> None:
    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    args = [w for lens in case if lens == "bots" for w in LENS_GIT["bots"]]
    specs = [w for lens in case if lens != "bots" for w in LENS_GIT[lens]]
    selected = [*args, *(["--", ".", *specs] if specs else [])]
    files = exported([repo], what="files", exclude=",".join(case))
    assert file_rows(files) == git_file_rows(origin, *selected)
    commits = exported([repo], what="commits", exclude=",".join(case))
    want = {
        c.sha: (sum(a for a, _ in c.files.values()), sum(d for _, d in c.files.values()),
                len(c.files))
        for c in git_log(origin, *selected)
    }  # fmt: skip
    assert {r["sha"]: (r["insertions"], r["deletions"], r["files"]) for r in commits} == want
    # Co-authors as git's trailer parser reads them; the bots lens drops a bot co-author.
    trailers = co_authors(origin)
    for row in commits:
        emails = [c.rsplit("<", 1)[1].rstrip(">") for c in row["co_authors"]]
        expected = [e for e in trailers[row["sha"]] if "bots" not in case or "[bot]" not in e]
        assert emails == expected, row["sha"]
    assert any(row["co_authors"] for row in commits)


def test_parameters_are_checked_by_name() -> None:
    assert parse_export({"what": "files"}) == Export(what="files", format="csv")
    for values, message in (
        ({}, "what must be one of commits, files"),
        ({"what": "tags"}, "what must be"),
        ({"what": "files", "format": "xml"}, "format must be one of csv, ndjson"),
        ({"what": "files", "since": "2024-02-30"}, "since"),
        ({"what": "files", "exclude": "nope"}, "exclude: unknown lens"),
    ):
        with pytest.raises(BadParameter, match=message):
            parse_export(values)
    assert parse_repository_ids(" 3,1,3 ") == [3, 1]
    for raw in ("", "a", "1,-2", "0", str(2**63), ",".join(str(i) for i in range(1, 102))):
        with pytest.raises(BadParameter, match="repos"):
            parse_repository_ids(raw)


# ---------------------------------------------------------------------- API and CLI


@pytest.fixture
def client() -> tuple[Client, dict[str, str]]:
    user = User.objects.create_user("reader", password="pw-reader-123456")
    return Client(raise_request_exception=False), {
        "HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user)[1]}"
    }


def streamed(res: Any) -> str:
    assert res.streaming, res.content
    return b"".join(res.streaming_content).decode()


def through_asgi(url: str, query: dict[str, str], auth: dict[str, str]) -> tuple[int, int]:
    """``url`` through Django's ASGI handler (as uvicorn serves it), the response's
    async stream consumed chunk by chunk: the lines it held, and the peak of Python
    memory allocated meanwhile."""
    headers = {"Authorization": auth["HTTP_AUTHORIZATION"]}

    async def go() -> int:
        res = await AsyncClient().get(url, query, headers=headers)
        assert res.status_code == 200 and res.is_async
        lines = 0
        async for chunk in res.streaming_content:
            lines += chunk.count(b"\n")
        return lines

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        lines = async_to_sync(go)()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return lines, peak


@pytest.mark.django_db(transaction=True)
def test_the_api_streams_one_repository_several_and_report_tables(
    tmp_path: Path, client: tuple[Client, dict[str, str]]
) -> None:
    c, auth = client
    planted = analysed(build(tmp_path / "planted"))
    lensed_origin = build_lenses(tmp_path / "lensed")
    lensed = analysed(lensed_origin)

    res = c.get(f"/api/repos/{planted.pk}/export", {"what": "files", "format": "ndjson"}, **auth)
    assert res.status_code == 200 and res["Content-Type"].startswith("application/x-ndjson")
    assert res["Content-Disposition"] == f'attachment; filename="{planted.name}-files.ndjson"'
    assert rows_of(streamed(res), "ndjson") == exported([planted], what="files")
    res = c.get(f"/api/repos/{lensed.pk}/export", {"what": "commits", "exclude": "bots"}, **auth)
    assert res["Content-Type"].startswith("text/csv")
    shas = [r["sha"] for r in rows_of(streamed(res), "csv")]
    assert set(shas) == {c.sha for c in git_log(lensed_origin, *LENS_GIT["bots"])}

    # Under ASGI (uvicorn) the same rows come through an async stream.
    lines, _ = through_asgi(f"/api/repos/{planted.pk}/export", {"what": "files"}, auth)
    assert lines == 1 + len(exported([planted], what="files"))

    # Several repositories, in the order asked, each row naming its own.
    res = c.get(
        "/api/export",
        {"repos": f"{lensed.pk},{planted.pk}", "what": "files", "format": "ndjson"},
        **auth,
    )
    assert res.status_code == 200
    assert res["Content-Disposition"] == 'attachment; filename="gitward-files.ndjson"'
    rows = rows_of(streamed(res), "ndjson")
    assert rows == exported([lensed], what="files") + exported([planted], what="files")
    assert [r["repository"] for r in rows] == sorted(
        (r["repository"] for r in rows), key=lambda i: i != lensed.pk
    )

    # A report table as NDJSON: the JSON report's rows, one object a line.
    body = c.get(f"/api/repos/{planted.pk}/hotspots", **auth).json()
    res = c.get(f"/api/repos/{planted.pk}/hotspots", {"format": "ndjson", "table": "files"}, **auth)
    assert res["Content-Type"].startswith("application/x-ndjson")
    assert res["Content-Disposition"].endswith('-hotspots-files.ndjson"')
    assert rows_of(streamed(res), "ndjson") == body["files"]

    for url, query, status in (
        (f"/api/repos/{planted.pk}/export", {"what": "nope"}, 400),
        (f"/api/repos/{planted.pk}/export", {"what": "files", "format": "xml"}, 400),
        (f"/api/repos/{planted.pk}/export", {"what": "files", "until": "soon"}, 400),
        (f"/api/repos/{planted.pk}/export", {"what": "files", "exclude": "x"}, 400),
        (f"/api/repos/{planted.pk + 1000}/export", {"what": "files"}, 404),
        ("/api/export", {"repos": "1,x", "what": "files"}, 400),
        ("/api/export", {"what": "files"}, 400),
        ("/api/export", {"repos": f"{planted.pk},{planted.pk + 1000}", "what": "files"}, 404),
        ("/api/export", {"repos": str(planted.pk), "what": "files", "format": "xml"}, 400),
        (f"/api/repos/{planted.pk}/hotspots", {"format": "xml"}, 400),
    ):
        res = c.get(url, query, **auth)
        assert res.status_code == status and "error" in res.json(), (url, query)
    res = Client().get("/api/export", {"repos": str(planted.pk), "what": "files"})
    assert res.status_code == 401 and not res.streaming


@pytest.mark.django_db(transaction=True)
def test_the_cli_streams_to_stdout_or_a_file(tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    other = analysed(build_lenses(tmp_path / "lensed"))
    out = io.StringIO()
    call_command("analytics", "export", str(repo.pk), "--what", "files", stdout=out)
    assert file_rows(
        [{**r, "added": int(r["added"]), "deleted": int(r["deleted"])}
         for r in rows_of(out.getvalue(), "csv")]
    ) == git_file_rows(origin)  # fmt: skip
    target = tmp_path / "out.ndjson"
    call_command(
        "analytics", "export", str(other.pk), repo.url, "--what", "commits",
        "--format", "ndjson", "--exclude", "bots", "-o", str(target),
    )  # fmt: skip
    assert rows_of(target.read_text(), "ndjson") == exported(
        [other, repo], what="commits", exclude="bots"
    )
    # A report table as NDJSON, as the API's ?format=ndjson&table=T.
    out = io.StringIO()
    call_command("analytics", "hotspots", str(repo.pk), "--ndjson", "files", stdout=out)
    body = io.StringIO()
    call_command("analytics", "hotspots", str(repo.pk), "--json", stdout=body)
    assert rows_of(out.getvalue(), "ndjson") == json.loads(body.getvalue())["files"]
    for argv, message in (
        (["hotspots", str(repo.pk), "--ndjson", "nope"], "--ndjson must be one of"),
        (["export", "999999", "--what", "files"], "no repository"),
        (["export", str(repo.pk), "--what", "tags"], "what must be"),
        (["export", str(repo.pk), "--what", "files", "--since", "x"], "since"),
        (["hotspots", str(repo.pk), str(other.pk)], "one repository"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("analytics", *argv)


# ---------------------------------------------------------------------- flat memory


def _add_rows(repo: Repository, commit: Commit, n: int) -> None:
    FileChange.objects.bulk_create(
        (
            FileChange(
                commit=commit,
                repository=repo,
                fingerprint=commit.fingerprint,
                path=f"src/dir{i % 97}/file{i}.py",
                added=i % 50,
                deleted=i % 7,
            )
            for i in range(n)
        ),
        batch_size=5000,
    )


def _peak_consuming(client: Client, auth: dict[str, str], repo: Repository) -> tuple[int, int]:
    """Rows streamed and the peak of Python memory allocated while the export response
    is produced and consumed (each chunk dropped as it arrives, as a socket would)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        res = client.get(f"/api/repos/{repo.pk}/export", {"what": "files"}, **auth)
        lines = 0
        for chunk in res.streaming_content:
            lines += chunk.count(b"\n")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return lines - 1, peak


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_memory_stays_flat_as_the_rows_grow(client: tuple[Client, dict[str, str]]) -> None:
    c, auth = client
    repo = Repository.objects.create(url="https://example.com/big.git", status="ready")
    now = timezone.now()
    commit = Commit.objects.create(
        repository=repo, fingerprint=current_fingerprint(), sha="a" * 40, author_name="A",
        author_email="a@example.com", author_canonical_name="A",
        author_canonical_email="a@example.com", authored_at=now, committer_name="A",
        committer_email="a@example.com", committed_at=now, subject="synthetic",
    )  # fmt: skip
    _add_rows(repo, commit, 50_000)
    url, query = f"/api/repos/{repo.pk}/export", {"what": "files"}
    _peak_consuming(c, auth, repo)  # warm-up: imports and first-use caches are not rows
    through_asgi(url, query, auth)
    small_rows, small = _peak_consuming(c, auth, repo)
    small_lines, small_asgi = through_asgi(url, query, auth)
    _add_rows(repo, commit, 150_000)
    large_rows, large = _peak_consuming(c, auth, repo)
    large_lines, large_asgi = through_asgi(url, query, auth)
    assert (small_rows, large_rows) == (50_000, 200_000)
    assert (small_lines, large_lines) == (50_001, 200_001)
    # One batch is what an export holds, under WSGI and ASGI alike: the peak does not
    # grow with the rows (a whole-result read would hold 4 times as much at 200,000).
    assert large / small < 1.5, (small, large)
    assert large_asgi / small_asgi < 1.5, (small_asgi, large_asgi)
    assert max(small, small_asgi) < 50_000 * 200  # well under the whole result
    assert BATCH < 50_000


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("what", ["files", "commits"])
def test_each_batch_is_a_range_of_the_primary_key_on_sqlite(what: str) -> None:
    """The batch query's plan (SQLite's EXPLAIN QUERY PLAN): driven by the id range and
    ordered by it, no sort of the repository's rows per batch (which would make an export
    quadratic in its rows)."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's planner costs the LIMIT itself (bench/export.py)")
    repo = Repository.objects.create(url="https://example.com/plan.git", status="ready")
    seen: list[tuple[str, list[Any]]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        list(export_lines([repo], parse_export({"what": what, "exclude": "bots"})))
    batch = [(s, p) for s, p in seen if f"ORDER BY {what[0]}.id LIMIT" in s]
    assert len(batch) == 1
    sql, params = batch[0]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = [row[-1] for row in cursor.fetchall()]
    table = "f" if what == "files" else "c"
    assert plan[0].startswith(f"SEARCH {table} USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)")
    assert not any("TEMP B-TREE" in step for step in plan), plan
