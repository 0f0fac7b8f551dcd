"""Fencing tokens (docs/locks.md): the database, not the Redis majority, makes writes safe.

``next_token`` is the Redlock's token source, called right after the quorum; every write
the lock guards calls ``check_token`` inside its own transaction, before writing anything.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, transaction
from django.db.models import F

from dashboard.models import FenceToken
from dashboard.observability import count_fencing_rejection


class StaleToken(RuntimeError):
    """A newer holder of the resource exists: this writer's lease is over."""


def next_token(resource: str, confirm: Callable[[int], None] | None = None) -> int:
    """Increment and return the resource's counter, in its own transaction.

    ``confirm(token)`` (the Redlock passes one) runs inside that transaction, before the
    commit; if it raises, the increment is rolled back and the exception propagates. The
    Redlock's confirm writes the token into its lock value on a quorum within the lease,
    so only a lock Redis still agrees on can advance the counter: a token fetched after
    the lease lapsed is never committed and cannot fence out the holder that acquired
    meanwhile.

    Race: two acquirers of the same resource increment concurrently. The UPDATE takes
    the row lock (PostgreSQL) or the database write lock (SQLite, IMMEDIATE), so the
    increments serialise and each caller reads back its own value inside the same
    transaction: tokens are strictly increasing and never shared. Because that lock is
    held through ``confirm``, a holder that acquires after our confirmation (it must: our
    lease held at that moment) increments after our commit and gets a larger token. The
    first acquirer of a new resource inserts the row; a concurrent insert loses on the
    unique constraint and retries the UPDATE.
    """
    for _ in range(5):
        with transaction.atomic():
            updated = FenceToken.objects.filter(resource=resource).update(token=F("token") + 1)
            if updated:
                token = int(
                    FenceToken.objects.values_list("token", flat=True).get(resource=resource)
                )
            else:
                try:
                    with transaction.atomic():
                        FenceToken.objects.create(resource=resource, token=1)
                except IntegrityError:
                    continue
                token = 1
            if confirm is not None:
                confirm(token)
            return token
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
        count_fencing_rejection(resource)
        raise StaleToken(f"fencing token {token} for {resource} is stale (newest is {current})")
