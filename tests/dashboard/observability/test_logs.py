"""dashboard.observability.logs: JSON or text lines, the job's context on each, and no credential
anywhere — not in logs, traces, metrics, job records, the audit log or live events."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps
from django.test import Client

from dashboard.models import ApiToken, JobRun, Repository
from dashboard.observability.logs import JsonFormatter, TextFormatter, bind
from dashboard.operations.prometheus import metrics_text
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo
from tests.support.live_tap import Tap
from tests.support.processes import ROOT, worker_env
from tests.support.sockets import make_user

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "s3cr3t-T0KEN-q7"


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord(
        "gitward.test", logging.ERROR, __file__, 1, msg, args,
        (type(exc), exc, exc.__traceback__) if exc else None,
    )  # fmt: skip


def test_json_lines_carry_the_bound_context_and_redact_credentials() -> None:
    try:
        raise RuntimeError(f"git fetch https://bob:{SECRET}@example.com/r.git failed")
    except RuntimeError as exc:
        err = exc
    with bind(job="analyze-1", trace="ab" * 16, repo=7, worker="host.1", lock="locks:x"):
        line = JsonFormatter().format(
            record("fetching %s", f"https://alice:{SECRET}@example.com/r.git", exc=err)
        )
    entry = json.loads(line)
    assert SECRET not in line
    assert entry["msg"] == "fetching https://<redacted>@example.com/r.git"
    assert entry["job"] == "analyze-1" and entry["trace"] == "ab" * 16 and entry["repo"] == 7
    assert entry["worker"] == "host.1" and entry["lock"] == "locks:x"
    assert entry["level"] == "ERROR" and "RuntimeError" in entry["exc"]
    assert "token" not in entry  # unbound fields are absent, not null


def test_text_lines_carry_the_context_and_redact_credentials() -> None:
    with bind(job="sync-3-g1", trace="cd" * 16):
        line = TextFormatter().format(record("Authorization: Bearer %s", SECRET))
    assert SECRET not in line
    assert "[job=sync-3-g1 trace=" + "cd" * 16 + "]" in line
    assert TextFormatter().format(record("plain")).endswith("gitward.test: plain")


@pytest.mark.parametrize("value", ["xml", "JSONL", "1"])
def test_a_bad_log_format_stops_start_up_with_one_line(value: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITWARD_")}
    env.update(GITWARD_LOG_FORMAT=value, GITWARD_VAR_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"GITWARD_LOG_FORMAT must be one of json, text, got {value.lower()!r}" in lines[0]


@pytest.fixture
def captured() -> Iterator[list[str]]:
    """Every log line of this process at DEBUG, as the JSON formatter writes it."""
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            lines.append(self.format(rec))

    handler = Capture(level=logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def everything_stored() -> str:
    """Every row of every gitward table, as text."""
    out = []
    for model in apps.get_app_config("dashboard").get_models():
        out.extend(json.dumps(row, default=str) for row in model.objects.values())
    return "\n".join(out)


def test_a_credential_in_a_submitted_url_appears_nowhere(
    captured: list[str], git_repo: GitRepo, tmp_path: Path, settings
) -> None:
    url = f"https://alice:{SECRET}@example.com/team/app.git"
    tap = Tap()
    user = make_user("submitter", staff=True, perms=("view_jobrun",))
    _, raw = ApiToken.issue(user)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    # 1. The API, the form and the CLI all refuse it, naming the rule, not the URL.
    api = Client().post("/api/repos", {"url": url}, content_type="application/json", **auth)
    assert api.status_code == 400 and SECRET not in api.content.decode()
    form = Client()
    form.force_login(user)
    page = form.post("/repos/", {"url": url, "branch": ""})
    # (The form shows the submitter their own input back, as forms do; it is stored nowhere.)
    assert (
        page.status_code == 400 and "credentials in URLs are not accepted" in page.content.decode()
    )
    env = worker_env(settings, tmp_path, GITWARD_LOG_FORMAT="json", GITWARD_LOG_LEVEL="DEBUG")
    cli = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "submit", url, "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode != 0
    assert SECRET not in cli.stdout + cli.stderr
    # 2. A real analysis runs beside it (so there are jobs, traces, events, metrics).
    submit_repository(url=str(git_repo.path))
    run_workers()
    tap.until(lambda events: any(e["type"] == "job.succeeded" for e in events))
    # 3. The secret is nowhere: logs, rows (runs, attempts and their spans, audit), events,
    #    metrics — while the logs did record the refusals and the jobs.
    assert captured and any("attempt 1 finished" in line for line in captured)
    assert not [line for line in captured if SECRET in line]
    assert SECRET not in everything_stored()
    assert SECRET not in json.dumps(tap.events)
    assert SECRET not in metrics_text()


def test_a_credential_already_stored_in_a_url_leaks_from_no_job(
    captured: list[str], git_repo: GitRepo, tmp_path: Path
) -> None:
    """Defence in depth: rows from before URLs were checked may hold a credential. Their
    jobs (one that fetches, one whose remote is the credential URL itself and fails)
    put it in no log line, event, metric, run, attempt, span or other row."""
    tap = Tap()
    good = f"https://alice:{SECRET}@example.com/team/good.git"
    bad = f"https://bob:{SECRET}@example.com/team/bad.git"
    ok, _ = submit_repository(url=str(git_repo.path))
    Repository.objects.filter(pk=ok.pk).update(url=good, fetch_url=str(git_repo.path))
    other = GitRepo.create(tmp_path / "other")
    other.commit("one", {"a.txt": "a\n"})
    failing, _ = submit_repository(url=str(other.path))
    Repository.objects.filter(pk=failing.pk).update(url=bad, fetch_url=bad)
    run_workers()
    tap.until(lambda events: any(e["type"] == "job.succeeded" for e in events))
    assert Repository.objects.get(pk=ok.pk).status == Repository.Status.READY
    failed = JobRun.objects.filter(repository=failing, kind="sync").get()
    assert failed.state == JobRun.State.DEAD and failed.error  # a dead letter, too
    assert captured and not [line for line in captured if SECRET in line]
    # Nor do the pages and the API that show these repositories and runs.
    op = make_user("op", staff=True, perms=("view_jobrun",))
    c = Client()
    c.force_login(op)
    for path in ("/", "/repos/", f"/repos/{ok.pk}/", f"/repos/{failing.pk}/", "/runs/",
                 f"/runs/{failed.pk}/", "/dead-letters/", "/locks/", "/api/dlq",
                 f"/api/dlq/{failed.cause_key}", f"/api/repos/{ok.pk}",
                 f"/api/runs/{failed.pk}", "/api/status"):  # fmt: skip
        res = c.get(path)
        assert res.status_code == 200, path
        assert SECRET not in res.content.decode(), path
    # ... and show the URL redacted rather than not at all.
    from django.utils.html import escape

    from workers.remotes.redaction import redact

    for path in (f"/runs/{failed.pk}/", f"/repos/{failing.pk}/"):
        assert escape(redact(bad)) in c.get(path).content.decode(), path
    # Every row but the two legacy URL columns themselves.
    for pk in (ok.pk, failing.pk):
        Repository.objects.filter(pk=pk).update(url=f"legacy-{pk}", fetch_url="")
    assert SECRET not in everything_stored()
    assert SECRET not in json.dumps(tap.events)
    assert SECRET not in metrics_text()
