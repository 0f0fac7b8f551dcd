"""The commit page (``/repos/<id>/commits/<sha>/``): thin over
``dashboard.repositories.one_commit``.

Reached from the repository page's commit table. An unknown repository or commit, or a
malformed sha, is a 404 page saying which; a mirror missing on this host is said on the
page itself (the stored stats still show)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.models import Repository
from dashboard.repositories import CommitNotFound, commit_details


@login_required
def commit(request: HttpRequest, repo_id: int, sha: str) -> HttpResponse:
    repo = Repository.objects.filter(pk=repo_id).first()
    if repo is None:
        return render(request, "commit_missing.html", {"reason": "no such repository"},
                      status=404)  # fmt: skip
    try:
        details = commit_details(repo, sha)
    except CommitNotFound as exc:
        return render(request, "commit_missing.html", {"repo": repo, "reason": str(exc)},
                      status=404)  # fmt: skip
    return render(request, "commit.html", {"repo": repo, "c": details})
