"""One commit of one repository, as its page and ``GET /api/repos/<id>/commits/<sha>``
show it: the stored row and its per-file stats (the database), the full message and
each file's patch (the mirror, through :mod:`workers.git.commit_view`).

A commit belongs to a repository when it is stored for it under the served fingerprint:
the sha (4 to 64 hex digits, a prefix is enough when it names one commit) is looked up
there, never handed to git before it matched a stored full sha. A mirror that is not on
this host, or lacks the commit, is said on the page; the stats still show.
"""

from __future__ import annotations

import re
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

from django.conf import settings

from dashboard.models import Commit, FileChange, Repository
from dashboard.repositories.lifecycle import current_fingerprint
from workers.git import (
    CommitMissing,
    GitError,
    Limits,
    MirrorMissing,
    MirrorState,
    mirror_path,
    mirror_state,
    open_mirror,
    read_message,
    read_patch,
)

SHA = re.compile(r"[0-9a-fA-F]{4,64}")
#: Stored file rows shown (a git bomb's root commit has 10^9): the rest is counted.
MAX_FILE_ROWS = 1000
LIMITS = Limits()


class CommitNotFound(LookupError):
    """No such commit in this repository (or the sha is malformed or ambiguous)."""


def _upper(prefix: str) -> str | None:
    """The smallest hex string above every string starting with ``prefix``."""
    digits = "0123456789abcdef"
    chars = list(prefix)
    while chars:
        last = chars.pop()
        if last != "f":
            return "".join(chars) + digits[digits.index(last) + 1]
    return None


def find_commit(repo: Repository, sha: str, fingerprint: str) -> Commit:
    """The stored commit ``sha`` names. A prefix is a range scan of the unique
    (repository, fingerprint, sha) index, never a ``LIKE``: one query either way."""
    if not SHA.fullmatch(sha or ""):
        raise CommitNotFound("a commit id is 4 to 64 hexadecimal digits")
    sha = sha.lower()
    qs = Commit.objects.filter(repository=repo, fingerprint=fingerprint)
    if len(sha) >= 40:
        qs = qs.filter(sha=sha)
    else:
        qs = qs.filter(sha__gte=sha)
        upper = _upper(sha)
        if upper is not None:
            qs = qs.filter(sha__lt=upper)
    found = list(qs.order_by("sha")[:2])
    if not found:
        raise CommitNotFound(f"no commit {sha} in {repo.name}")
    if len(found) > 1:
        raise CommitNotFound(f"{sha} names more than one commit of {repo.name}: give more digits")
    return found[0]


def _person(name: str, email: str, moment: Any, offset: int) -> dict[str, Any]:
    local = moment.astimezone(timezone(timedelta(minutes=offset)))
    return {"name": name, "email": email, "date": local.isoformat()}


def _mirror(repo: Repository) -> Path:
    return mirror_path(Path(settings.WORKSPACE), repo.pk)


def repository_mirror(repo: Repository) -> MirrorState:
    """This host's mirror of ``repo`` (for the repository page): present, its head."""
    return mirror_state(_mirror(repo))


def _read_mirror(repo: Repository, commit: Commit) -> dict[str, Any]:
    """Message and patch from the mirror; a readable reason instead when it cannot."""
    try:
        with open_mirror(_mirror(repo)) as mirror:
            text = read_message(mirror, commit.sha, LIMITS)
            patch = read_patch(mirror, commit.sha, commit.parent_list(), LIMITS)
    except MirrorMissing as exc:
        return {"available": False, "reason": f"{exc}: the message and patch cannot be read"}
    except CommitMissing as exc:
        return {"available": False, "reason": f"{exc} (fetched since?)"}
    except (GitError, OSError, ValueError) as exc:
        return {"available": False, "reason": f"git could not read the commit: {exc}"[:300]}
    return {
        "available": True,
        "reason": "",
        "message": text.message,
        "encoding": text.encoding,
        "message_truncated": text.truncated,
        "patch": patch,
    }


def _patch_dict(p: Any) -> dict[str, Any]:
    return {
        "path": p.path,
        "status": p.status,
        "binary": p.binary,
        "truncated": p.truncated,
        "bytes": p.size,
        "text": "" if p.binary else p.text,
    }


def commit_details(repo: Repository, sha: str) -> dict[str, Any]:
    """Everything the commit page and its API show; raises :class:`CommitNotFound`.
    Three queries (fingerprint, commit, file rows) and one mirror read."""
    commit = find_commit(repo, sha, current_fingerprint())
    rows = list(
        FileChange.objects.filter(commit=commit)
        .order_by("id")
        .values_list("path", "added", "deleted", "binary", "language")[: MAX_FILE_ROWS + 1]
    )
    mirror = _read_mirror(repo, commit)
    patch = mirror.get("patch")
    by_path = {p.path: p for p in patch.files} if patch else {}
    files = []
    for path, added, deleted, binary, language in rows[:MAX_FILE_ROWS]:
        found = by_path.pop(path, None)
        files.append(
            {
                "path": path,
                "added": added,
                "deleted": deleted,
                "binary": binary,
                "language": language,
                "patch": _patch_dict(found) if found else None,
            }
        )
    # Patches git sent for files the stored rows do not name (another analyzer config
    # excluded them): shown after the stored ones, without stats.
    extra = [{"path": p.path, "added": None, "deleted": None, "binary": p.binary,
              "language": "", "patch": _patch_dict(p)} for p in by_path.values()]  # fmt: skip
    message = mirror.get("message") or commit.subject
    return {
        "repository": repo.pk,
        "sha": commit.sha,
        "parents": commit.parent_list(),
        "is_merge": commit.is_merge,
        "subject": commit.subject,
        "message": message,
        "message_encoding": mirror.get("encoding", ""),
        "message_truncated": bool(mirror.get("message_truncated")),
        "author": _person(
            commit.author_name, commit.author_email, commit.authored_at, commit.author_tz
        ),
        "committer": _person(
            commit.committer_name,
            commit.committer_email,
            commit.committed_at,
            commit.committer_tz,
        ),
        "files_changed": commit.files_changed,
        "insertions": commit.insertions,
        "deletions": commit.deletions,
        "files": files + extra,
        "files_not_listed": max(0, commit.files_changed - min(len(rows), MAX_FILE_ROWS)),
        "mirror": {"available": mirror["available"], "reason": mirror["reason"] or None},
        "patch": {
            "base": patch.base if patch else None,
            "truncated": patch.truncated if patch else False,
            "more_files": patch.more_files if patch else False,
            "error": (patch.error or None) if patch else None,
            "limits": {
                "file_bytes": LIMITS.file_bytes,
                "total_bytes": LIMITS.total_bytes,
                "files": LIMITS.files,
            },
        },
    }
