"""Fencing tokens (DESIGN §4): the database, not the Redis majority, makes writes safe.

``next_token`` is called right after a lock is acquired; every write the lock guards
calls ``check_token`` inside its own transaction, before writing anything.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F

from dashboard.models import FenceToken


class StaleToken(RuntimeError):
    """A newer holder of the resource exists: this writer's lease is over."""


def next_token(resource: str) -> int:
    """Increment and return the resource's counter, in its own transaction.

    Race: two acquirers of the same resource increment concurrently. The UPDATE takes
    the row lock (PostgreSQL) or the database write lock (SQLite, IMMEDIATE), so the
    increments serialise and each caller reads back its own value inside the same
    transaction: tokens are strictly increasing and never shared. The first acquirer of
    a new resource inserts the row; a concurrent insert loses on the unique constraint
    and retries the UPDATE.
    """
    for _ in range(5):
        with transaction.atomic():
            updated = FenceToken.objects.filter(resource=resource).update(token=F("token") + 1)
            if updated:
                return int(
                    FenceToken.objects.values_list("token", flat=True).get(resource=resource)
                )
            try:
                with transaction.atomic():
                    FenceToken.objects.create(resource=resource, token=1)
                return 1
            except IntegrityError:
                continue
    raise RuntimeError(f"could not issue a fencing token for {resource}")


def check_token(resource: str, token: int | None) -> None:
    """Raise StaleToken unless ``token`` is still the newest for ``resource``.

    Must be called inside the transaction that performs the guarded write: the row is
    locked (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's IMMEDIATE transaction
    already holds the write lock), so no newer token can be issued between this check
    and the commit — an acquirer that comes later waits, then gets a larger token.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("check_token must run inside the guarded write's transaction")
    current = (
        FenceToken.objects.select_for_update()
        .filter(resource=resource)
        .values_list("token", flat=True)
        .first()
    )
    if token is None or current is None or int(current) != int(token):
        raise StaleToken(f"fencing token {token} for {resource} is stale (newest is {current})")
