"""dashboard.management.operator: the operator management commands act as."""

from __future__ import annotations

from dashboard.management.operator import CLI_OPERATOR


def test_the_cli_operator_holds_every_permission_and_is_audited_as_cli() -> None:
    assert CLI_OPERATOR.username == "cli" and CLI_OPERATOR.pk is None
    assert CLI_OPERATOR.has_perm("dashboard.change_repository")
    assert CLI_OPERATOR.has_perm("dashboard.change_jobrun")
