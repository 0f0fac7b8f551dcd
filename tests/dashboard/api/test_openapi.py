"""dashboard.api.openapi: ``GET /api/openapi.json`` serves the document; it names every
route under /api/ in the URLconf, with the methods each really allows, and nothing
else; and real responses of every operation — a repository analysed by real workers
from a real git repository, runs, dead letters, queues, locks, rollouts, and their
errors — validate against it (status documented, body valid)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, get_resolver
from jsonschema import Draft202012Validator

from dashboard.analytics.integrity import run_verification
from dashboard.api.openapi import DOCUMENT, PATHS, SCHEMAS
from dashboard.infra import queues
from dashboard.models import ApiToken, FileChange, JobRun, Repository, Verification
from dashboard.repositories import current_fingerprint
from tests.conftest import run_workers
from tests.support.analytics_history import build, git_log
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)

METHODS = ("get", "post", "put", "patch", "delete")


def url_routes() -> dict[str, str]:
    """Every route under /api/ as an OpenAPI path → its URL name."""
    out = {}
    for pattern in get_resolver().url_patterns:
        if isinstance(pattern, URLPattern) and str(pattern.pattern).startswith("api/"):
            path = "/" + re.sub(r"<\w+:(\w+)>", r"{\1}", str(pattern.pattern))
            out[path] = str(pattern.name)
    return out


class Checked:
    """A client that validates every response against the document."""

    def __init__(self, token: str) -> None:
        self.client = Client(raise_request_exception=False)
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        self.seen: set[tuple[str, str, str]] = set()

    def call(self, method: str, template: str, body: Any = None, **values: Any) -> Any:
        query = values.pop("query", None)
        path = template.format(**values)
        if method == "get":
            res = self.client.get(path, query or {}, **self.auth)
        else:
            res = self.client.post(
                path, json.dumps(body or {}), content_type="application/json", **self.auth
            )
        kind = res["Content-Type"].split(";")[0]
        if kind in ("text/csv", "application/x-ndjson"):  # a table or an export, streamed
            body: Any = b"".join(res.streaming_content).decode()
        else:
            body = res.json()
        validate(template, method, res.status_code, body, kind)
        self.seen.add((template, method, str(res.status_code)))
        return res


def validate(
    template: str, method: str, status: int, body: Any, kind: str = "application/json"
) -> None:
    responses = PATHS[template][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {template}: {status} not documented"
    content = responses[str(status)]["content"]
    assert kind in content, f"{method.upper()} {template} {status}: {kind} not documented"
    schema = content[kind]["schema"]
    validator = Draft202012Validator({**schema, "components": {"schemas": SCHEMAS}})
    errors = sorted(validator.iter_errors(body), key=str)
    assert not errors, f"{method.upper()} {template} {status}: {errors[0].message}"


@pytest.fixture
def admin() -> Checked:
    root = User.objects.create_superuser("root", password="pw-root-123456")
    return Checked(ApiToken.issue(root)[1])


def test_it_is_served_to_anyone_as_openapi_3_1() -> None:
    res = Client().get("/api/openapi.json")
    assert res.status_code == 200 and res.json() == json.loads(json.dumps(DOCUMENT))
    assert DOCUMENT["openapi"] == "3.1.0"
    schemes = DOCUMENT["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert Client().post("/api/openapi.json").status_code == 405


def test_it_documents_every_api_route_and_only_those() -> None:
    routes = url_routes()
    assert set(routes) == set(PATHS), (
        f"undocumented: {sorted(set(routes) - set(PATHS))}; "
        f"documented but not routed: {sorted(set(PATHS) - set(routes))}"
    )


def test_each_route_allows_exactly_the_documented_methods(admin: Checked) -> None:
    """Each route is called with every method: a 405 exactly for the undocumented ones
    (the ids need not exist: the method is checked first)."""
    samples = {"repo_id": 1, "sha": "a" * 40, "run_id": 1, "rollout_id": 1, "action": "promote"}
    samples |= {"fingerprint": "abcd", "group": "g", "action_id": 1, "identity": "a@b.c"}
    samples |= {"verification_id": 1}
    for template, item in PATHS.items():
        path = template.format(**samples)
        for method in METHODS:
            res = getattr(admin.client, method)(path, **admin.auth)
            documented = method in item
            assert (res.status_code == 405) is not documented, (method, path, res.status_code)


def test_every_error_answer_is_documented_and_has_the_error_shape(admin: Checked) -> None:
    anonymous = Client(raise_request_exception=False)
    res = anonymous.get("/api/status")
    validate("/api/status", "get", res.status_code, res.json())
    assert res.status_code == 401
    for template, item in PATHS.items():
        for method, op in item.items():
            for status, answer in op["responses"].items():
                if status.startswith(("4", "5")):
                    assert answer["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/Error"
                    }, (template, method, status)


def test_real_responses_of_every_operation_validate(
    admin: Checked, git_repo: GitRepo, tmp_path: Path, settings: Any
) -> None:
    a = admin
    created = a.call("post", "/api/repos", {"url": str(git_repo.path)})
    assert created.status_code == 202
    repo_id = created.json()["id"]
    assert a.call("post", "/api/repos", {"url": str(git_repo.path)}).status_code == 200
    assert a.call("post", "/api/repos", {"url": "ftp://x"}).status_code == 400
    planted = build(tmp_path / "planted")  # every analytics table has rows
    analysed_id = a.call("post", "/api/repos", {"url": str(planted.path)}).json()["id"]
    run_workers()
    call_every_analysis(a, analysed_id, planted)
    _withheld_and_cleared(a, analysed_id, settings)
    a.call("get", "/api/repos/{repo_id}", repo_id=repo_id)
    detail = a.call("get", "/api/repos/{repo_id}", repo_id=repo_id, query={"summary": "1"})
    assert detail.json()["status"] == "ready"
    page = a.call("get", "/api/repos/{repo_id}/commits", repo_id=repo_id,
                  query={"limit": "1", "files": "1"})  # fmt: skip
    assert page.json()["next"] is not None
    a.call("get", "/api/repos/{repo_id}/commits", repo_id=repo_id,
           query={"cursor": page.json()["next"]})  # fmt: skip
    sha = page.json()["results"][0]["sha"]
    a.call("get", "/api/repos/{repo_id}/commits/{sha}", repo_id=repo_id, sha=sha)
    a.call("get", "/api/repos/{repo_id}/commits/{sha}", repo_id=repo_id, sha="f" * 40)
    a.call("get", "/api/repos/{repo_id}", repo_id=repo_id + 1000)
    a.call("post", "/api/repos/{repo_id}/reanalyse", repo_id=repo_id)
    queued_sync = JobRun.objects.filter(repository_id=repo_id, state="queued").first()
    assert queued_sync is not None
    a.call("post", "/api/runs/{run_id}/cancel", run_id=queued_sync.pk)
    a.call("post", "/api/repos/{repo_id}/cancel", repo_id=repo_id)
    a.call("post", "/api/runs/cancel", {"state": "queued", "repo": repo_id})
    a.call("post", "/api/runs/cancel", {})  # no filter: 400
    hook = a.call("post", "/api/repos/{repo_id}/hook-secret", repo_id=repo_id).json()
    a.call("post", "/api/hooks/push/{repo_id}", {"ref": "refs/heads/main"}, repo_id=repo_id)
    assert hook["secret"]

    a.call("get", "/api/status")
    runs = a.call("get", "/api/runs", query={"limit": "1"}).json()
    a.call("get", "/api/runs/{run_id}", run_id=runs["results"][0]["id"])
    a.call("get", "/api/runs", query={"state": "nonsense"})
    dead = JobRun.objects.filter(repository_id=repo_id).first()
    assert dead is not None
    JobRun.objects.filter(pk=dead.pk).update(
        state=JobRun.State.DEAD, cause="boom", cause_key="abc123", error="boom"
    )
    groups = a.call("get", "/api/dlq").json()["groups"]
    a.call("get", "/api/dlq/{group}", group=groups[0]["group"])
    a.call("get", "/api/dlq/{group}", group="nothing")
    a.call("post", "/api/dlq/retry", {"runs": [dead.pk]})
    bulk = a.call("post", "/api/dlq/discard", {"all": True})
    assert bulk.status_code == 202
    a.call("get", "/api/actions/{action_id}", action_id=bulk.json()["id"])
    a.call("post", "/api/dlq/discard", {"runs": [2**63]})

    queue = queues.queue_names()[0]
    a.call("post", "/api/queues/pause", {"queue": queue})
    a.call("post", "/api/queues/resume", {"queue": queue})
    a.call("post", "/api/queues/resume", {"queue": "nowhere"})
    a.call("post", "/api/locks/release", {"key": "locks:repo:nothing"})
    a.call("post", "/api/locks/release", {"key": "not-a-lock"})

    started = a.call("post", "/api/rollouts", {"config": {"detect_renames": True}})
    assert started.status_code == 202, started.json()
    rollout_id = started.json()["id"]
    a.call("post", "/api/rollouts", {"config": {"detect_renames": True}})  # busy: 409
    a.call("get", "/api/rollouts", query={"limit": "5"})
    a.call("get", "/api/rollouts/{rollout_id}", rollout_id=rollout_id)
    a.call("get", "/api/rollouts/freeze")
    a.call("post", "/api/rollouts/freeze", {"on": True})  # no reason: 400
    assert a.call("post", "/api/rollouts/freeze", {"on": True, "reason": "drill"}).json()["frozen"]
    a.call("post", "/api/rollouts/freeze", {"on": False})
    a.call("post", "/api/rollouts/{rollout_id}/{action}", {"reason": "x\x1b"},
           rollout_id=rollout_id, action="abort")  # fmt: skip
    a.call("post", "/api/rollouts/{rollout_id}/{action}", {"force": True},
           rollout_id=rollout_id, action="abort")  # fmt: skip
    a.call("post", "/api/rollouts/{rollout_id}/{action}", rollout_id=rollout_id,
           action="takeover")  # fmt: skip
    # docs/rollouts.md#pinning: the rollout is not ramping (409), a bad body (400)
    a.call("post", "/api/rollouts/{rollout_id}/pin", {"repositories": [1]}, rollout_id=rollout_id)
    a.call("post", "/api/rollouts/{rollout_id}/unpin", {"repositories": "1"},
           rollout_id=rollout_id)  # fmt: skip
    fingerprint = started.json()["rollout"]["version"]["fingerprint"]
    a.call("post", "/api/versions/{fingerprint}/retire", {"reason": "done"},
           fingerprint=fingerprint[:12])  # fmt: skip
    a.call("post", "/api/versions/{fingerprint}/retire", fingerprint="abcdef0123")
    listed = a.call("get", "/api/versions").json()["versions"]
    assert [v["fingerprint"] for v in listed if v["fingerprint"] == fingerprint] == [fingerprint]
    a.call("post", "/api/rollouts", {"version": "abcdef0123"})  # unknown: 404

    operations = {(t, m) for t, item in PATHS.items() for m in item} - {
        ("/api/openapi.json", "get")
    }
    called = {(t, m) for t, m, _ in a.seen}
    assert operations - called == set(), "operations this test never called"
    statuses = {s for _, _, s in a.seen}
    assert {"200", "202", "400", "404", "409"} <= statuses, statuses
    assert Repository.objects.filter(pk=repo_id).exists()


def _withheld_and_cleared(a: Checked, repo_id: int, settings: Any) -> None:
    """A verification mismatch under the withhold policy (docs/analytics.md#verification):
    the repository's detail with its ``verification``, a withheld analysis (409), the
    integrity group, and its clear (200, then 409: nothing left to clear)."""
    settings.VERIFY_ON_MISMATCH = "withhold"
    fp = current_fingerprint()
    row = FileChange.objects.filter(repository_id=repo_id).order_by("id").first()
    assert row is not None
    FileChange.objects.filter(pk=row.pk).update(added=row.added + 1)
    ver = Verification.objects.create(repository_id=repo_id, fingerprint=fp)
    run_verification(repo_id, fp)
    detail = a.call("get", "/api/repos/{repo_id}", repo_id=repo_id).json()
    assert detail["withheld"] and detail["verification"]["state"] == "mismatch"
    assert a.call("get", "/api/repos/{repo_id}/age", repo_id=repo_id).status_code == 409
    assert a.call("get", "/api/integrity").json()["open"] == 1
    cleared = a.call("post", "/api/integrity/{verification_id}/clear", verification_id=ver.pk)
    assert cleared.status_code == 200
    a.call("post", "/api/integrity/{verification_id}/clear", verification_id=ver.pk)  # 409
    FileChange.objects.filter(pk=row.pk).update(added=row.added)


def call_every_analysis(a: Checked, repo_id: int, origin: GitRepo) -> None:
    """Each analytics operation on a repository with the planted patterns of
    tests/support/analytics_history.py, with every table it has non-empty (so each row
    schema meets real rows), as JSON and as CSV, and its 400s and 404s."""
    base = "/api/repos/{repo_id}/"
    last_day = max(c.committed_at[:10] for c in git_log(origin))
    loose = {"min_revs": "1", "min_shared_revs": "1", "min_coupling": "1"}
    reports = {
        "hotspots": a.call("get", base + "hotspots", repo_id=repo_id, query={"depth": "2"}),
        "coupling": a.call("get", base + "coupling", repo_id=repo_id, query=loose),
        "coupled": a.call(
            "get",
            base + "coupling",
            repo_id=repo_id,
            query={**loose, "path": "core/a.py", "last": "365", "until": last_day},
        ),
        "ownership": a.call(
            "get",
            base + "ownership",
            repo_id=repo_id,
            query={"until": last_day, "inactive_days": "90"},
        ),
        "age": a.call("get", base + "age", repo_id=repo_id, query={"limit": "3"}),
        "authors": a.call("get", base + "authors", repo_id=repo_id),
        "by query": a.call(
            "get", base + "authors", repo_id=repo_id, query={"author": "ada@example.com"}
        ),
        "author": a.call(
            "get", base + "authors/{identity}", repo_id=repo_id, identity="cy@example.com"
        ),
        "file": a.call(
            "get", base + "files", repo_id=repo_id, query={**loose, "path": "core/b.py"}
        ),
    }
    for name, res in reports.items():
        assert res.status_code == 200, (name, res.json())
        body = res.json()
        tables = [body.get(t) for t in ("files", "directories", "coupled", "authors")]
        tables += [body.get("knowledge_at_risk", {}).get("authors")]
        for nested in ("activity", "history"):
            if nested in body:
                tables += [v for v in body[nested].values() if isinstance(v, list)]
        present = [t for t in tables if t is not None]
        assert present and all(present), (name, body)  # some tables, none empty
    assert reports["coupled"].json()["window"]["until"] == last_day
    for template, table in (("hotspots", "files"), ("ownership", "at_risk"),
                            ("authors/{identity}", "weekly"), ("files", "commits")):  # fmt: skip
        res = a.call("get", base + template, repo_id=repo_id, identity="cy@example.com",
                     query={"format": "csv", "table": table, "path": "core/b.py"})  # fmt: skip
        assert res.status_code == 200 and res["Content-Type"].startswith("text/csv")
    res = a.call("get", base + "hotspots", repo_id=repo_id,
                 query={"format": "ndjson", "table": "directories"})  # fmt: skip
    assert res.status_code == 200 and res["Content-Type"].startswith("application/x-ndjson")
    for what, fmt in (("commits", "csv"), ("files", "ndjson")):
        res = a.call("get", base + "export", repo_id=repo_id, query={"what": what, "format": fmt})
        assert res.status_code == 200
        res = a.call("get", "/api/export", query={"repos": str(repo_id), "what": what,
                                                  "format": fmt, "exclude": "bots"})  # fmt: skip
        assert res.status_code == 200
    assert a.call("get", base + "export", repo_id=repo_id, query={}).status_code == 400
    assert a.call("get", base + "export", repo_id=repo_id + 1000,
                  query={"what": "files"}).status_code == 404  # fmt: skip
    assert a.call("get", "/api/export", query={"repos": "x"}).status_code == 400
    assert a.call("get", "/api/export", query={"repos": str(repo_id + 1000),
                                               "what": "files"}).status_code == 404  # fmt: skip
    for template, query in (
        ("hotspots", {"since": "2024-02-30"}),
        ("coupling", {"min_coupling": "101"}),
        ("ownership", {"inactive_days": "0"}),
        ("age", {"format": "xml"}),
        ("authors", {"format": "csv", "table": "nope"}),
        ("files", {}),
        ("authors/{identity}", {"last": "7"}),
    ):
        res = a.call("get", base + template, repo_id=repo_id, identity="cy@example.com",
                     query=query)  # fmt: skip
        assert res.status_code == 400, (template, query)
    for template, query in (
        ("files", {"path": "nowhere.txt"}),
        ("authors/{identity}", {}),
        ("age", {}),
    ):
        res = a.call("get", base + template, repo_id=repo_id + (template == "age") * 1000,
                     identity="nobody@example.com", query=query)  # fmt: skip
        assert res.status_code == 404, (template, query)


def test_the_check_fails_a_body_off_the_schema_or_an_undocumented_status() -> None:
    with pytest.raises(AssertionError, match="is a required property"):
        validate("/api/repos", "post", 202, {"id": 1})
    with pytest.raises(AssertionError, match="not documented"):
        validate("/api/repos", "post", 201, {})
    with pytest.raises(AssertionError, match="'error' is a required property"):
        validate("/api/repos", "post", 400, {"detail": "x"})
