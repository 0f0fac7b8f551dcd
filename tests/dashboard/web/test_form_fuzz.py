"""Every POST form of the pages, fed arbitrary data by Hypothesis (docs/testing.md#fuzzing):
the known fields with any text (control characters, NUL, ESC, long, non-ASCII), unknown
fields, and raw bodies that are not form encoding at all (invalid UTF-8, stray ``%``,
``&`` and ``=``). Through the whole stack as an operator with every permission: the
answer is a page or a redirect, never a 5xx (a 503 only if a server it needs is down,
which none is here), and nothing is logged at ERROR (no traceback).
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.models import Repository
from dashboard.rollouts.start import start_rollout
from dashboard.versions.state_machine import ensure_baseline

pytestmark = pytest.mark.django_db(transaction=True)

#: Text the test client can encode: anything but a lone surrogate (the client itself
#: would raise). NUL, ESC and the other controls are in.
TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=300)
#: Each form's own fields, so the generated data reaches its validation.
FIELDS = {
    "/repos/": ["url", "branch"],
    "/rollouts/start/": [
        "queue",
        "detect_renames",
        "ignore_whitespace",
        "exclude_paths",
        "steps",
        "auto",
        "reason",
    ],
    "/rollouts/{rollout}/{verb}/": ["reason", "percent", "next"],
    "/rollouts/versions/{version}/retire/": ["reason", "next"],
    "/login/": ["username", "password", "next"],
    "/logout/": ["next"],
}
VERBS = st.sampled_from(["promote", "rollback", "abort", "takeover", "ramp", "nonsense"])


def form_data(path: str) -> st.SearchStrategy[dict[str, Any]]:
    known = st.fixed_dictionaries({}, optional={f: TEXT for f in FIELDS[path]})
    unknown = st.dictionaries(TEXT.filter(bool), TEXT, max_size=3)
    return st.builds(lambda a, b: {**b, **a}, known, unknown)


RAW_BODIES = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(["a=", "=", "&", "%", "%zz", "%00", "%ff", "url=%C0%80", "x"]),
             max_size=20).map(lambda parts: "".join(parts).encode()),
)  # fmt: skip


@pytest.fixture
def operator() -> Client:
    """A client signed in anew before each example (``/logout/`` signs it out)."""
    client = Client(raise_request_exception=False)
    user = User.objects.create_superuser("op", password="pw-op-123456")
    client.force_login(user)
    client.user = user  # type: ignore[attr-defined]
    return client


@pytest.fixture
def targets() -> dict[str, int]:
    """A real pending rollout and its version for the rollout forms to act on."""
    ensure_baseline(actor="setup")
    rollout = start_rollout(config={"detect_renames": True}, actor="setup", enqueue_driver=False)
    return {"rollout": rollout.pk, "version": rollout.version_id}


def check(response: Any, caplog: pytest.LogCaptureFixture, what: object) -> None:
    assert response.status_code < 500, (what, response.status_code, response.content[:300])
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    caplog.clear()
    assert not errors, (what, errors)


FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_arbitrary_form_data_never_gives_a_server_error(
    path: str, operator: Client, targets: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)

    @FUZZ
    @given(data=form_data(path), verb=VERBS)
    def one(data: dict[str, Any], verb: str) -> None:
        operator.force_login(operator.user)  # type: ignore[attr-defined]
        url = path.format(verb=verb, **targets)
        check(operator.post(url, data), caplog, (url, data))

    one()


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_arbitrary_raw_bodies_never_give_a_server_error(
    path: str, operator: Client, targets: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)

    @FUZZ
    @given(body=RAW_BODIES, verb=VERBS)
    def one(body: bytes, verb: str) -> None:
        operator.force_login(operator.user)  # type: ignore[attr-defined]
        url = path.format(verb=verb, **targets)
        response = operator.generic(
            "POST", url, body, content_type="application/x-www-form-urlencoded"
        )
        check(response, caplog, (url, body))

    one()


#: The list pages and the query parameters each reads (docs/api.md#limits).
LIST_QUERIES = {
    "/repos/": ["q", "status", "before"],
    "/runs/": ["q", "state", "kind", "repo", "before"],
    "/audit/": ["q", "action", "actor", "before"],
    "/dead-letters/": ["q", "page"],
    "/repos/{repo}/": ["cursor"],
    "/rollouts/": ["queue"],
    "/": [],
}
#: Values as they arrive in a query string: any text (a NUL included), numbers past 64
#: bits, digits ``int`` refuses (``²``), base64-looking cursors.
QUERY_VALUES = st.one_of(
    TEXT,
    st.integers().map(str),
    st.sampled_from(["²", "١٢", "9" * 30, "-1", "0", "1e3", " 7 ", "WyIx", "null"]),
    st.binary(max_size=40).map(lambda b: base64.urlsafe_b64encode(b).decode()),
)


@pytest.mark.parametrize("path", sorted(LIST_QUERIES))
def test_arbitrary_list_queries_never_give_a_server_error(
    path: str, operator: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Every list page read with arbitrary values of its own parameters and others: a
    page (200), or a 400 for what no query may hold (a NUL), never a 5xx."""
    caplog.set_level(logging.ERROR)
    repo = Repository.objects.create(url="https://example.com/owner/repo")
    known = st.fixed_dictionaries({}, optional={p: QUERY_VALUES for p in LIST_QUERIES[path]})

    @FUZZ
    @given(query=known, extra=st.dictionaries(TEXT.filter(bool), QUERY_VALUES, max_size=2))
    def one(query: dict[str, str], extra: dict[str, str]) -> None:
        url = path.format(repo=repo.pk)
        response = operator.get(url, {**extra, **query})
        check(response, caplog, (url, query, extra))
        assert response.status_code in {200, 400}, (url, query, response.status_code)

    one()
