"""What a failed fetch means: git's stderr read into a permanent refusal or a retry.

A fetch that fails for a reason retrying cannot fix (the remote is missing, refuses
us, or sent objects ``transfer.fsckObjects`` refused) is a
:class:`RepositoryUnavailable`: the run is dead-lettered at once with the readable
reason built here; anything else is an ordinary, retried :class:`GitError`.
"""

from __future__ import annotations

import re

from workers.git.runner import GitError, first_error_line


class RepositoryUnavailable(GitError):
    """The remote cannot be read (missing, unreachable, no such branch): not retried."""


class RepositoryTooLarge(RepositoryUnavailable):
    """The repository exceeds a size limit (whole mirror or one object): not retried."""


class RateLimited(GitError):
    """The remote host refused us for now (HTTP 429, a "rate limit" message): the host
    is backed off for every worker (``workers.git.fetch_limits``) and the fetch retried
    after ``retry_after`` seconds (None: the deployment's default backoff)."""

    def __init__(
        self, message: str, *, retry_after: float | None, returncode: int | None, stderr: str
    ) -> None:
        super().__init__(message, returncode=returncode, stderr=stderr)
        self.retry_after = retry_after


_RATE_LIMITED = (
    "returned error: 429",
    "http 429",
    "too many requests",
    "rate limit",
    "secondary rate limit",
)
#: ``Retry-After: 120`` or ``retry after 120 seconds`` in what the remote said (git shows a
#: text/plain error body as ``remote: …`` lines).
_RETRY_AFTER = re.compile(r"retry[- ]after:?\s*(\d{1,6})", re.IGNORECASE)


def rate_limited(stderr: str) -> tuple[bool, float | None]:
    """Whether git's stderr is a rate-limit refusal, and the wait the remote asked for
    (seconds, None if it named none).  Checked before :func:`is_permanent`: a 429 also
    reads "unable to access", which would otherwise be a permanent refusal."""
    text = stderr.lower()
    if not any(marker in text for marker in _RATE_LIMITED):
        return False, None
    m = _RETRY_AFTER.search(stderr)
    return True, float(m.group(1)) if m else None


def is_permanent(stderr: str) -> bool:
    text = stderr.lower()
    return any(
        marker in text
        for marker in (
            "does not appear to be a git repository",
            "repository not found",
            "couldn't find remote ref",
            "not found",
            "could not read from remote repository",
            "authentication failed",
            "could not read username",
            "could not read password",
            "could not resolve host",
            "unable to access",
            "connection refused",
            "transport '",
            "not allowed",
            "fsck error",
            "did not receive expected object",
            "returned error: 30",
            "redirect",
        )
    )


#: index-pack's report of one fsck finding: ``error: object <sha>: <msg-id>: <text>``.
_FSCK_FINDING = re.compile(r"error: object ([0-9a-f]{7,64}): ([A-Za-z][A-Za-z0-9]*): ([^\n]*)")


def fsck_findings(stderr: str) -> list[tuple[str, str, str]]:
    """``(msg_id, git's text, object id)`` of every fsck finding git reported, in order,
    each finding once.  Which ids are refused at all is ``workers.git.fsck_policy``'s table."""
    found: list[tuple[str, str, str]] = []
    for m in _FSCK_FINDING.finditer(stderr):
        finding = (m.group(2), m.group(3).strip(), m.group(1))
        if finding not in found:
            found.append(finding)
    return found


def fsck_refusal(stderr: str) -> str:
    """The refusal, naming git's exact findings (at most three, each text cut to 200
    characters) so a user can tell a forged ``.git`` entry from a corrupt object:
    ``repository contains malformed objects, refused by git fsck (<msg-id>: <text> in
    object <sha12>; …)``."""
    findings = fsck_findings(stderr)
    details = "; ".join(
        f"{msg_id}: {text[:200]} in object {sha[:12]}" for msg_id, text, sha in findings[:3]
    )
    if len(findings) > 3:
        details += f"; and {len(findings) - 3} more"
    detail = f" ({details})" if details else ""
    return f"repository contains malformed objects, refused by git fsck{detail}"


def readable(stderr: str, branch: str) -> str:
    text = stderr.lower()
    if "fsck error" in text:
        return fsck_refusal(stderr)
    if "did not receive expected object" in text:
        m = re.search(r"did not receive expected object ([0-9a-f]{7,64})", stderr)
        missing = f" (object {m.group(1)[:12]} is missing)" if m else ""
        return (
            "the repository sent an incomplete history"
            f"{missing}: its server cuts the history (grafts) or is corrupt"
        )
    if "returned error: 30" in text or "redirect" in text:
        return "the repository host answered with a redirect, which is not followed"
    if "couldn't find remote ref" in text:
        return f"branch {branch!r} does not exist in the repository"
    if "does not appear to be a git repository" in text or "not found" in text:
        return "repository not found or not a git repository"
    if "could not resolve host" in text:
        return "host name could not be resolved"
    if "connection refused" in text:
        return "connection refused by the repository host"
    if (
        "authentication" in text
        or "could not read from remote" in text
        or "could not read username" in text
        or "could not read password" in text
    ):
        return "repository requires authentication or is not readable"
    return first_error_line(stderr) or "git fetch failed"
