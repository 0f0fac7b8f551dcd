"""Branch names a user may submit (docs/security.md#g3)."""

from __future__ import annotations

from workers.remotes.policy import InvalidRemote, has_unsafe_chars

__all__ = ["MAX_BRANCH_LENGTH", "normalise_branch"]

MAX_BRANCH_LENGTH = 255

_BRANCH_FORBIDDEN = frozenset("~^:?*[\\")


def normalise_branch(raw: str | None) -> str:
    """Validate a branch name (``git check-ref-format --branch`` rules, stricter).

    Returns "" for "use the default branch".  A leading ``refs/heads/`` is
    dropped.  Refuses anything git could read as an option or a revision
    expression (``--output=…``, ``HEAD@{-1}``, ``a..b``), G3."""
    if raw is None:
        return ""
    name = raw.strip(" ")
    if not name:
        return ""
    if len(name) > MAX_BRANCH_LENGTH:
        raise InvalidRemote(f"branch name is longer than {MAX_BRANCH_LENGTH} characters")
    if has_unsafe_chars(name):
        raise InvalidRemote("branch name contains control or whitespace characters")
    if name.startswith("-"):
        # --output=/tmp/pwn, -o/tmp/pwn, --exec=…: option injection into git.
        raise InvalidRemote("branch name must not start with '-'")
    if name.startswith("refs/heads/"):
        name = name[len("refs/heads/") :]
        if not name:
            raise InvalidRemote("branch name is empty")
    if name.startswith("refs/"):
        # refs/heads/refs/heads/x is a branch named "refs/heads/x": legal for git, but
        # it would read as another name at the next check (the mirror's); refused so the
        # result is a fixed point.
        raise InvalidRemote("branch name must not start with 'refs/' (after refs/heads/)")
    if any(ch in _BRANCH_FORBIDDEN for ch in name):
        raise InvalidRemote("branch name contains one of ~ ^ : ? * [ \\")
    if ".." in name:
        # Range syntax and ../ path traversal (CVE-2023-41040).
        raise InvalidRemote("branch name must not contain '..'")
    if "@{" in name or name == "@":
        # Reflog syntax (HEAD@{-1}) selects another revision.
        raise InvalidRemote("branch name must not contain '@{' or be '@'")
    if name.startswith("/") or name.endswith("/") or "//" in name:
        raise InvalidRemote("branch name must not start or end with '/' or contain '//'")
    if name.endswith(".") or name.endswith(".lock"):
        raise InvalidRemote("branch name must not end with '.' or '.lock'")
    for component in name.split("/"):
        if component.startswith(".") or component.startswith("-"):
            raise InvalidRemote("a branch name component must not start with '.' or '-'")
        if component.endswith(".lock"):
            raise InvalidRemote("a branch name component must not end with '.lock'")
    if name == "HEAD":
        raise InvalidRemote("'HEAD' is not a branch name")
    return name
