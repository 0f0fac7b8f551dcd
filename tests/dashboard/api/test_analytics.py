"""``GET /api/repos/<id>/hotspots|coupling|ownership|age``: the planted patterns through the
API, equal to the core functions' tables, and a JSON 400 for every bad parameter."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.analytics.coupling import file_coupling
from dashboard.analytics.rows import Scope
from dashboard.analytics.window import parse_window
from dashboard.models import ApiToken
from tests.support.analytics_history import analysed, build, git_log

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token() -> str:
    return ApiToken.issue(User.objects.create_user("alice", password="pw-alice-123"))[1]


def get(client: Client, path: str, token: str):
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_every_analysis_through_the_api(client: Client, token: str, tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    days = sorted({c.committed_at[:10] for c in git_log(origin)})
    base = f"/api/repos/{repo.pk}"

    res = get(client, f"{base}/coupling", token)
    assert res.status_code == 200
    body = res.json()
    assert [(r["entity"], r["coupled"], r["degree"]) for r in body["files"]] == [
        ("core/a.py", "core/b.py", 80)
    ]
    assert body["files"] == file_coupling(Scope.of(repo, parse_window()))
    assert body["window"] == {"since": None, "until": None}
    assert body["reproduce"] == "git log --no-merges --no-renames --numstat"

    res = get(client, f"{base}/coupling?path=core/b.py&min_revs=1&min_shared_revs=1", token)
    assert [(r["coupled"], r["degree"]) for r in res.json()["coupled"]] == [("core/a.py", 80)]

    res = get(client, f"{base}/ownership?until={days[-1]}&inactive_days=90", token)
    body = res.json()
    docs = next(d for d in body["directories"] if d["directory"] == "handbook")
    assert (docs["main_dev"], docs["ownership"], docs["bus_factor"]) == ("ada@example.com", 0.9, 1)
    legacy = next(d for d in body["directories"] if d["directory"] == "legacy")
    assert (legacy["main_dev"], legacy["bus_factor"], legacy["main_dev_inactive"]) == (
        "cy@example.com",
        1,
        True,
    )  # a bus factor of one, and its author left
    assert docs["main_dev_inactive"] is False
    risk = body["knowledge_at_risk"]
    assert [(a["author"], a["files"]) for a in risk["authors"]] == [
        ("cy@example.com", ["legacy/old.py", "legacy/util.py"])
    ]

    res = get(client, f"{base}/age?until={days[-1]}", token)
    ages = {r["directory"]: r["age_months"] for r in res.json()["directories"]}
    assert ages["legacy"] == 7 and ages["handbook"] == 0

    since, until = days[1], days[-1]
    res = get(client, f"{base}/hotspots?since={since}&until={until}&limit=2", token)
    body = res.json()
    assert [r["path"] for r in body["files"]] == ["core/a.py", "core/b.py"]
    assert body["window"] == {"since": since, "until": until}
    windowed = git_log(origin, f"--since={since}T00:00:00Z", f"--until={until}T23:59:59Z")
    assert body["files"][0]["revs"] == sum("core/a.py" in c.files for c in windowed)
    assert f"--since={since}T00:00:00Z" in body["reproduce"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("since=2024-02-30", "since must be an ISO date"),
        ("until=tomorrow", "until must be an ISO date"),
        ("since=2024-03-01&until=2024-02-01", "since must not be after until"),
        ("last=7", "last must be one of 30, 90, 365"),
        ("since=2024-01-01&last=30", "not both"),
        ("depth=0", "depth must be between 1 and 6"),
        ("depth=x", "depth must be an integer"),
        ("limit=100000", "limit must be between 1 and 1000"),
        ("min_coupling=101", "min_coupling must be between 0 and 100"),
        ("max_changeset_size=1", "max_changeset_size must be between 2"),
        ("inactive_days=-3", "inactive_days must be between 1"),
    ],
)
def test_bad_parameters_are_a_json_400(
    client: Client, token: str, query: str, message: str
) -> None:
    from dashboard.models import Repository

    repo = Repository.objects.create(url="https://example.com/x.git", status="ready")
    for kind in ("hotspots", "coupling", "ownership", "age"):
        res = get(client, f"/api/repos/{repo.pk}/{kind}?{query}", token)
        assert res.status_code == 400, (kind, query)
        assert message in res.json()["error"]


def test_unknown_repository_and_no_credentials(client: Client, token: str) -> None:
    res = get(client, "/api/repos/999999/hotspots", token)
    assert res.status_code == 404 and res.json() == {"error": "repository not found"}
    assert client.get("/api/repos/1/coupling").status_code == 401
    assert get(client, "/api/repos/1/nonsense", token).status_code == 404


def test_authors_an_author_and_a_file(client: Client, token: str, tmp_path: Path) -> None:
    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    base = f"/api/repos/{repo.pk}"
    log = git_log(origin)
    body = get(client, f"{base}/authors", token).json()
    assert [(a["author"], a["commits"]) for a in body["authors"]] == [
        ("ada@example.com", sum(c.author == "ada@example.com" for c in log)),
        ("cy@example.com", 4),
        ("bob@example.com", 3),
    ]
    res = get(client, f"{base}/authors/cy@example.com", token)
    cy = res.json()["activity"]
    assert res.status_code == 200 and cy["commits"] == 4 and cy["name"] == "Cy"
    assert [f["path"] for f in cy["files"]] == ["legacy/old.py", "legacy/util.py"]
    res = get(client, f"{base}/authors/cy@example.com?last=30&until=2030-01-01", token)
    assert res.status_code == 404 and "no commit by cy@example.com" in res.json()["error"]
    res = get(client, f"{base}/files?path=core/b.py", token)
    history = res.json()["history"]
    assert history["revs"] == len(git_log(origin, "--", "core/b.py"))
    assert history["coupled"][0]["coupled"] == "core/a.py"
    assert get(client, f"{base}/files", token).status_code == 400
    assert get(client, f"{base}/files?path=nowhere.txt", token).status_code == 404


def test_csv_export_of_each_table(client: Client, token: str, tmp_path: Path) -> None:
    import csv
    import io

    origin = build(tmp_path / "origin")
    repo = analysed(origin)
    base = f"/api/repos/{repo.pk}"
    last_day = max(c.committed_at[:10] for c in git_log(origin))
    body = get(client, f"{base}/hotspots", token).json()
    res = get(client, f"{base}/hotspots?format=csv&table=files", token)
    assert res.status_code == 200 and res["Content-Type"] == "text/csv; charset=utf-8"
    assert res["Content-Disposition"] == 'attachment; filename="origin-hotspots-files.csv"'
    rows = list(csv.DictReader(io.StringIO(b"".join(res.streaming_content).decode())))
    assert [{k: str(v) for k, v in r.items()} for r in body["files"]] == rows
    res = get(client, f"{base}/ownership?format=csv&table=at_risk&until={last_day}", token)
    rows = list(csv.DictReader(io.StringIO(b"".join(res.streaming_content).decode())))
    assert [(r["author"], r["path"]) for r in rows] == [
        ("cy@example.com", "legacy/old.py"),
        ("cy@example.com", "legacy/util.py"),
    ]
    res = get(client, f"{base}/ownership?format=csv&table=directories", token)
    header = b"".join(res.streaming_content).decode().splitlines()[0]
    assert header.startswith("directory,revs,authors,main_dev") and "by_author" not in header
    res = get(client, f"{base}/coupling?format=csv&table=nope", token)
    assert res.status_code == 400 and res.json() == {
        "error": "table must be one of files, directories"
    }
    res = get(client, f"{base}/age?format=xml", token)
    assert res.status_code == 400 and res.json() == {"error": "format must be json, csv or ndjson"}


def test_a_repository_with_no_commit_yet_has_empty_tables(client: Client, token: str) -> None:
    from dashboard.models import Repository

    repo = Repository.objects.create(url="https://example.com/empty.git", status="queued")
    for kind in ("hotspots", "coupling", "ownership", "age", "authors"):
        res = get(client, f"/api/repos/{repo.pk}/{kind}?last=90", token)
        assert res.status_code == 200, kind
        tables = {k: v for k, v in res.json().items() if isinstance(v, list)}
        assert tables and all(v == [] for v in tables.values()), kind
    res = get(client, f"/api/repos/{repo.pk}/hotspots?format=csv&table=files", token)
    assert res.status_code == 200 and b"".join(res.streaming_content) == b""


@pytest.mark.parametrize(
    ("kind", "query", "status", "answer"),
    [
        ("hotspots", "until=9999-12-31", 400, "until must be before 9999-12-31"),
        ("age", "until=0001-01-01&last=365", 400,
         "the last 365 days before until start before year 1"),
        ("ownership", "until=0001-01-02&inactive_days=90", 200, "0001-01-01T00:00:00+00:00"),
        ("ownership", "until=2024-01-01&inactive_days=90", 200, "2023-10-04T00:00:00+00:00"),
        ("hotspots", "since=0001-01-01&until=9999-12-30", 200, None),
        ("ownership", "since=9999-12-30", 200, None),
        ("hotspots", "since=9999-12-30", 200, None),
        ("age", "until=0001-01-01&last=30", 400, "before year 1"),
        ("age", "until=0001-01-31&last=30", 200, None),
    ],
)  # fmt: skip
def test_dates_at_the_ends_of_the_calendar_are_a_400_or_an_answer(
    client: Client, token: str, kind: str, query: str, status: int, answer: str | None
) -> None:
    """A window whose edge falls past the dates Python holds is a JSON 400 saying so; an
    inactivity cutoff before year 1 is the first instant (nobody is inactive that early):
    never a 500 (they were: OverflowError)."""
    from dashboard.models import Repository

    repo = Repository.objects.create(url="https://example.com/edge.git", status="ready")
    res = get(client, f"/api/repos/{repo.pk}/{kind}?{query}", token)
    assert res.status_code == status, (query, res.status_code)
    body = res.json()
    if status == 400:
        assert answer in body["error"]
    elif kind == "ownership" and answer:
        assert body["knowledge_at_risk"]["cutoff"] == answer


def test_each_lens_through_the_api_equals_git_and_enqueues_nothing(
    client: Client, token: str, tmp_path: Path
) -> None:
    from tests.support.analytics_history import (
        LENS_CASES,
        build_lenses,
        lens_totals,
        queue_state,
    )

    origin = build_lenses(tmp_path / "origin")
    repo = analysed(origin)
    before = queue_state()
    base = f"/api/repos/{repo.pk}"
    for case in LENS_CASES:
        want = lens_totals(origin, case)
        query = f"exclude={','.join(case)}&limit=1000"
        body = get(client, f"{base}/hotspots?{query}", token).json()
        assert {r["path"]: (r["revs"], r["churn"]) for r in body["files"]} == want.files, case
        assert body["exclude"] == list(case) and body["parameters"]["exclude"] == list(case)
        people = get(client, f"{base}/authors?{query}", token).json()["authors"]
        got = {r["author"]: (r["commits"], r["insertions"], r["deletions"]) for r in people}
        assert got == want.people, case
    # Repeated parameters are the same as a list; every analysis takes it.
    repeated = get(client, f"{base}/hotspots?exclude=lock&exclude=bots&limit=1000", token).json()
    assert {r["path"] for r in repeated["files"]} == set(
        lens_totals(origin, ("lock", "bots")).files
    )
    for kind in ("coupling", "ownership", "age", "authors/cy@example.com"):
        assert get(client, f"{base}/{kind}?exclude=vendored", token).status_code == 200, kind
    path = f"{base}/files?path=src/app.js&exclude=bots"
    assert get(client, path, token).status_code == 200
    assert queue_state() == before  # no job, no run: a lens is read time only
    res = get(client, f"{base}/hotspots?exclude=lock,tests", token)
    assert res.status_code == 400 and res.json() == {
        "error": "exclude: unknown lens 'tests' (one of generated, vendored, lock, minified, bots)"
    }
