"""Integer parameters that ``str.isdigit`` accepts but ``int`` or the database refuses
("²", a superscript digit; a number past 64 bits): the runs page ignores the filter, the
API answers 400 with JSON ``{error}``, a repository reference is simply not found —
never a 500."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.models import Repository
from dashboard.repositories.lifecycle import resolve_repository

pytestmark = pytest.mark.django_db

HOSTILE = ["²", "١٢", "9" * 30]


@pytest.fixture
def admin() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-123456"))
    return client


@pytest.mark.parametrize("raw", HOSTILE)
def test_the_runs_page_ignores_a_repo_filter_that_is_no_usable_integer(
    admin: Client, raw: str
) -> None:
    response = admin.get("/runs/", {"repo": raw})
    assert response.status_code == 200


@pytest.mark.parametrize("name", ["repo", "before"])
@pytest.mark.parametrize("raw", HOSTILE)
def test_the_runs_api_refuses_it_with_a_json_error(admin: Client, name: str, raw: str) -> None:
    response = admin.get("/api/runs", {name: raw})
    assert response.status_code == 400
    assert response.json() == {"error": f"{name} must be an integer"}


@pytest.mark.parametrize("raw", HOSTILE)
def test_a_repository_reference_that_is_no_usable_integer_is_not_found(raw: str) -> None:
    Repository.objects.create(url="https://example.com/a.git")
    with pytest.raises(Repository.DoesNotExist):
        resolve_repository(raw)
