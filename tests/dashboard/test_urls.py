"""dashboard.urls: every named route resolves to the view it names and reverses to its
path; an unknown /api/ path is a JSON 404, an unknown page an HTML one."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import resolve, reverse

from dashboard import api, urls
from dashboard.web import analytics, commits, ops, probes, repositories, rollouts, runs

pytestmark = pytest.mark.django_db

ARGS = {"repo_id": 7, "run_id": 8, "rollout_id": 9, "action_id": 10, "job_id": "sync-1-g1",
        "verb": "promote", "action": "promote", "group": "abc123", "sha": "0abc1234",
        "version_id": 11, "fingerprint": "f" * 64, "analysis": "hotspots",
        "identity": "ada@example.com", "verification_id": 12}  # fmt: skip


def named() -> list[tuple[str, object, list[str]]]:
    out = []
    for pattern in urls.urlpatterns:
        name = getattr(pattern, "name", None)
        if name:
            out.append((name, pattern.callback, list(pattern.pattern.converters)))
    return out


def test_every_route_of_the_dashboard_is_named_once() -> None:
    names = [name for name, _, _ in named()]
    assert len(names) == len(set(names))
    unnamed = [p for p in urls.urlpatterns if not getattr(p, "name", None)]
    assert [str(p.pattern) for p in unnamed] == ["admin/"]


@pytest.mark.parametrize(
    ("name", "view", "params"), named(), ids=lambda v: getattr(v, "__qualname__", str(v))
)
def test_a_named_route_round_trips(name: str, view: object, params: list[str]) -> None:
    path = reverse(name, kwargs={p: ARGS[p] for p in params})
    match = resolve(path)
    assert match.url_name == name
    assert match.func is view
    assert match.kwargs == {p: ARGS[p] for p in params}


def test_the_api_routes_are_the_api_modules_views() -> None:
    for name, view, _ in named():
        is_api = name.startswith("api-") or name == "metrics"
        pages = (probes, commits, ops, repositories, rollouts, runs, analytics)
        modules = (api.__name__,) if is_api else tuple(m.__name__ for m in pages)
        assert getattr(view, "__module__", "").startswith(modules) or name in {
            "login", "logout"
        }, name  # fmt: skip


@pytest.mark.parametrize("path", ["/api/nowhere", "/api/repos/7/nothing", "/api/", "/api/repos/x"])
def test_an_unknown_api_path_is_a_json_404(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": "not found"}


def test_an_unknown_page_is_an_html_404() -> None:
    response = Client().get("/no/such/page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
