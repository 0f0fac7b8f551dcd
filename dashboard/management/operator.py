"""The operator a management command acts as: whoever runs ``manage.py`` on a host holds
every permission, and is audited as ``cli`` (docs/cli.md)."""

from __future__ import annotations

__all__ = ["CLI_OPERATOR", "CliOperator"]


class CliOperator:
    """A user-like object for core functions that check ``has_perm`` and audit
    ``username``: every permission, audited as ``cli``."""

    pk = None
    username = "cli"

    def has_perm(self, perm: str) -> bool:
        return True


CLI_OPERATOR = CliOperator()
