"""dashboard.observability.otlp: with OTEL_EXPORTER_OTLP_ENDPOINT set, every job attempt's spans
reach an OTLP/HTTP collector — here a real loopback HTTP server in the test that decodes the
protobuf ``ExportTraceServiceRequest`` — from real (forking) RQ workers: the same spans as
``JobAttempt.spans``, in order, as a tree, in the run's trace, with the run's attributes
and no credential anywhere in the bytes sent."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from dashboard.infra import system_checks
from dashboard.models import ApiToken, JobAttempt, JobRun, Repository
from dashboard.observability import otlp
from dashboard.observability.traces import trace_id_of
from dashboard.repositories.lifecycle import submit_repository
from tests.conftest import run_workers
from tests.dashboard.live.test_live_view import make_user
from tests.dashboard.observability.test_logs import SECRET
from tests.dashboard.operations.test_prometheus import make_repo
from tests.support.gitrepo import GitRepo
from tests.support.processes import run_burst_worker, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


class Collector:
    """A minimal OTLP/HTTP traces receiver on 127.0.0.1 (what a collector's otlphttp
    receiver does): POST /v1/traces with a protobuf body, 200 with an empty response."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.types: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                encoding = self.headers.get("Content-Encoding", "")
                body = gzip.decompress(raw) if encoding == "gzip" else raw
                body = zlib.decompress(body) if encoding == "deflate" else body
                collector.bodies.append(body)
                collector.paths.append(self.path)
                collector.types.append(self.headers.get("Content-Type", ""))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every exported span with its resource's attributes, in the order received."""
        out = []
        for body in self.bodies:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            for rs in req.resource_spans:
                resource = attrs_of(rs.resource.attributes)
                for ss in rs.scope_spans:
                    out.extend((resource, span) for span in ss.spans)
        return out


def value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value"))


def attrs_of(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def by_trace(spans: list[tuple[dict[str, Any], Span]], trace_id: str) -> list[Span]:
    return [s for _, s in spans if s.trace_id.hex() == trace_id]


def ns(seconds: float) -> int:
    return round(seconds * 1e9)


def check_attempt(exported: list[Span], attempt: JobAttempt) -> dict[str, Span]:
    """The exported tree of one attempt against its stored spans; {name: span}."""
    run = attempt.run
    stored = attempt.spans
    root, rest = exported[0], exported[1:]
    # Names and order: the attempt's root, then the stored spans in their stored order.
    assert root.name == run.kind
    assert [s.name for s in rest] == [s["name"] for s in stored]
    starts = [s.start_time_unix_nano for s in exported[:-1]]
    assert starts == sorted(starts)
    # Same times as stored, to the microsecond they were stored at.
    for span, s in zip(rest, stored, strict=True):
        assert span.start_time_unix_nano == ns(s["start"])
        assert span.end_time_unix_nano == ns(s["end"])
    assert root.start_time_unix_nano == min(s.start_time_unix_nano for s in rest)
    assert root.end_time_unix_nano == max(s.end_time_unix_nano for s in rest)
    # One trace (the run's), one tree: parents exist and contain their children.
    assert {s.trace_id.hex() for s in exported} == {trace_id_of(run.job_id)}
    assert len({s.span_id for s in exported}) == len(exported)
    named = {s.name: s for s in rest}
    end = named[stored[-1]["name"]]
    parent_of = {s.name: s.parent_span_id for s in rest}
    assert root.parent_span_id == b""
    assert parent_of["queued"] == parent_of["dequeued"] == parent_of[end.name] == root.span_id
    assert parent_of["lock wait"] == end.span_id
    by_id = {s.span_id: s for s in exported}
    for s in rest:
        p = by_id[s.parent_span_id]
        assert p.start_time_unix_nano <= s.start_time_unix_nano, (s.name, p.name)
        assert s.end_time_unix_nano <= p.end_time_unix_nano, (s.name, p.name)
    if "lock held" in named:
        held = named["lock held"]
        assert parent_of["lock held"] == end.span_id
        for phase in ("mirror fetch", "git stream", "rows write"):
            if phase in named:
                inside = (
                    held.start_time_unix_nano <= named[phase].start_time_unix_nano
                    and named[phase].end_time_unix_nano <= held.end_time_unix_nano
                )
                assert parent_of[phase] == (held.span_id if inside else end.span_id), phase
    # The run's attributes on the root; each span's own on it.
    a = attrs_of(root.attributes)
    assert a["gitward.job_id"] == run.job_id and a["gitward.run_id"] == run.pk
    assert a["gitward.attempt"] == attempt.number and a["gitward.kind"] == run.kind
    assert a["gitward.repository.id"] == run.repository_id and a["gitward.queue"] == run.queue
    assert a["gitward.worker"] == attempt.worker and a["gitward.version"] == run.version[:12]
    wait = attrs_of(named["lock wait"].attributes)
    if "lock held" in named:
        assert a["gitward.lock_key"] == run.lock_key and a["gitward.token"] == run.token
        assert wait["gitward.lock_key"] == run.lock_key and wait["gitward.token"] == run.token
        assert 2 <= wait["gitward.agreeing"] <= 3
    deq = attrs_of(named["dequeued"].attributes)
    assert deq["gitward.worker"] == attempt.worker and deq["gitward.pid"] == attempt.pid
    assert root.kind == Span.SPAN_KIND_INTERNAL
    return {"": root, **named}


def test_forked_work_horses_export_every_attempt(
    collector: Collector, git_repo: GitRepo, tmp_path: Path, settings
) -> None:
    cred = f"https://alice:{SECRET}@example.com/team/app.git"
    # A credential submitted through the API is refused, naming the rule…
    user = make_user("submitter", staff=True)
    _, raw = ApiToken.issue(user)
    res = Client().post("/api/repos", {"url": cred}, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {raw}")  # fmt: skip
    assert res.status_code == 400
    # …and one stored in a row from before URLs were checked is redacted on export.
    repo, _ = submit_repository(url=str(git_repo.path))
    Repository.objects.filter(pk=repo.pk).update(url=cred, fetch_url=str(git_repo.path))
    env = worker_env(
        settings,
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_SERVICE_NAME="gitward-test",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci",
    )
    result = run_burst_worker(env)  # `manage.py worker --burst`: a forking RQ worker
    assert result.returncode == 0, result.stderr[-2000:]
    assert JobRun.objects.filter(state="succeeded").count() == 2
    # The horse's export is synchronous, so it is all here once the worker has exited.
    assert set(collector.paths) == {"/v1/traces"}
    assert set(collector.types) == {"application/x-protobuf"}
    spans = collector.spans()
    assert {r["service.name"] for r, _ in spans} == {"gitward-test"}
    assert {r["deployment.environment"] for r, _ in spans} == {"ci"}
    for kind in ("sync", "analyze"):
        [attempt] = JobAttempt.objects.filter(run__kind=kind)
        assert attempt.pid != 0
        exported = by_trace(spans, trace_id_of(attempt.run.job_id))
        named = check_attempt(exported, attempt)
        root = attrs_of(named[""].attributes)
        assert root["gitward.outcome"] == "finished"
        assert root["gitward.repository.url"] == "https://<redacted>@example.com/team/app.git"
        assert "gitward.result" in attrs_of(named["finished"].attributes)
    assert len(spans) == 16  # 7 + 1 for the sync, 7 + 1 for the analysis: nothing else
    sent = b"".join(collector.bodies)
    assert SECRET.encode() not in sent and b"alice" not in sent


def test_a_failed_attempt_is_exported_with_its_error(
    collector: Collector, tmp_path: Path, settings, monkeypatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("GITWARD_FAILPOINTS", "analyze.parsing#poison=raise")
    settings.OTLP_EXPORT = True
    submit_repository(url=str(make_repo(tmp_path, "poison").path))
    run_workers()
    spans = collector.spans()
    attempts = list(JobAttempt.objects.filter(run__kind="analyze").order_by("number"))
    assert len(attempts) == 3
    exported = by_trace(spans, trace_id_of(attempts[0].run.job_id))
    roots = [s for s in exported if s.parent_span_id == b""]
    assert [attrs_of(r.attributes)["gitward.attempt"] for r in roots] == [1, 2, 3]
    for root in roots:
        assert root.status.code == Status.STATUS_CODE_ERROR
        assert root.status.message.startswith("FailpointError")
        assert attrs_of(root.attributes)["gitward.outcome"] == "error"
    errors = [s for s in exported if s.name == "error"]
    assert len(errors) == 3
    assert all(attrs_of(e.attributes)["gitward.error"].startswith("FailpointError") for e in errors)
    held = {s.span_id for s in exported if s.name == "lock held"}
    assert len(held) == 3


def test_a_collector_that_is_down_never_fails_a_job(
    tmp_path: Path, git_repo: GitRepo, settings, monkeypatch
) -> None:
    down = Collector()
    endpoint = down.endpoint
    down.close()  # nothing listens there now: connection refused
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    settings.OTLP_EXPORT = True
    settings.OTEL_EXPORTER_OTLP_TIMEOUT = 0.2
    submit_repository(url=str(git_repo.path))
    run_workers()
    assert set(JobRun.objects.values_list("state", flat=True)) == {"succeeded"}
    assert all(a.spans for a in JobAttempt.objects.all())  # still stored


def test_off_by_default(git_repo: GitRepo, collector: Collector, settings, monkeypatch) -> None:
    assert settings.OTLP_EXPORT is False  # no OTEL_EXPORTER_OTLP_ENDPOINT in the test env
    assert otlp.export(run_id=1, number=1, trace_id="0" * 31 + "1", spans=[{}]) is False
    # The exporter would find the collector, but the setting (OTEL_SDK_DISABLED, or no
    # endpoint when the process started) says no.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    submit_repository(url=str(git_repo.path))
    run_workers()
    assert collector.bodies == []


def test_an_endpoint_without_the_sdk_is_a_startup_warning(settings, monkeypatch) -> None:
    settings.OTLP_EXPORT = True
    assert system_checks.check_otlp() == []  # installed here (the test extra)
    assert system_checks._installed("no_such_package.sub") is False
    monkeypatch.setattr(system_checks, "_installed", lambda module: False)
    [warning] = system_checks.check_otlp()
    assert warning.id == "gitward.W005" and "gitward[otel]" in warning.hint
