"""workers.remotes.branches: every branch name the submission check accepts is one git
accepts too, as the same name (``git check-ref-format --branch``), so nothing accepted at
submission fails later for its name; names git refuses are refused at submission by the
form, the API and the CLI alike (docs/security.md#g3)."""

from __future__ import annotations

import json
import subprocess

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.models import Repository
from tests.support.gitrepo import GitRepo
from workers.git.mirror import _check_branch
from workers.remotes.branches import normalise_branch
from workers.remotes.policy import InvalidRemote

#: What branch names are made of, tricky parts weighted in: separators, ref syntax,
#: shell and glob characters, non-ASCII (full-width, accents, emoji), spaces and controls.
_PIECES = st.sampled_from(
    [*"ab/.-_@{}[]~^:?*\\ #!'\"$%&()+,;<=>`|", "é", "ｍａｉｎ", "\u00a0", "\u200b", "\x7f",
     "\u3000", "\uff0e", "😀", ".lock", "..", "@{", "refs/heads/", "HEAD"]
)  # fmt: skip


def git_accepts(name: str) -> str | None:
    out = subprocess.run(["git", "check-ref-format", "--branch", name], capture_output=True)
    return out.stdout.decode().strip() if out.returncode == 0 else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES, min_size=1, max_size=6).map("".join))
def test_what_the_submission_check_accepts_git_accepts_and_the_fetch_takes(raw: str) -> None:
    try:
        name = normalise_branch(raw)
    except InvalidRemote:
        return
    if name:
        assert git_accepts(name) == name
        _check_branch(name)  # the mirror's own check agrees: no failure later for the name


GIT_REFUSES = ["a..b", "x/.y", "a.lock", "a@{1}", "a\\b", "-x", "a b", "a:b", "a~1", "a/", "x?"]


@pytest.mark.parametrize("name", GIT_REFUSES)
def test_names_git_refuses_are_refused(name: str) -> None:
    assert git_accepts(name) is None
    with pytest.raises(InvalidRemote):
        normalise_branch(name)


@pytest.mark.django_db(transaction=True)
def test_the_form_the_api_and_the_cli_refuse_them_at_submission(git_repo: GitRepo) -> None:
    client = Client()
    client.force_login(User.objects.create_user("bob"))
    for name in GIT_REFUSES:
        form = client.post("/repos/", {"url": str(git_repo.path), "branch": name})
        assert form.status_code == 400 and form.context["form"].errors["branch"], name
        api = client.post(
            "/api/repos", json.dumps({"url": str(git_repo.path), "branch": name}),
            content_type="application/json",
        )  # fmt: skip
        assert api.status_code == 400 and "branch" in api.json()["error"], name
        with pytest.raises(CommandError) as exc:
            call_command("submit", str(git_repo.path), "--branch", name)
        assert "\n" not in str(exc.value) and "branch" in str(exc.value), name
    assert not Repository.objects.exists()
