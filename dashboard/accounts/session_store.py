"""The session store (``SESSION_ENGINE``): Django's database sessions, read with one
plain SELECT instead of the ORM's ``get``.

Every logged-in request — every page, every API call, every socket's handshake — loads
its session first. Through the ORM that lookup costs about 0.2 ms of CPU on SQLite (a
queryset, its lookups and SQL compiled anew, a model built), the SELECT itself a
tenth of it (load test, BENCHMARKS.md: the web processes' CPU per request is what the two
cores run out of). Everything else is Django's own database store unchanged: the same
table and rows (so sessions written before and by any other version of gitward stay
valid both ways), the same expiry rule (``expire_date`` later than now, decided by the
database at each request), the same writes, ``flush`` and ``cycle_key`` (logout and
login), the same encoding and signature check of the data. The database remains the
only truth: a session deleted by any web process is refused by every other at its next
request, as before — nothing is cached in a process.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.contrib.sessions.backends import db
from django.core.exceptions import SuspiciousOperation
from django.db import connections, router
from django.utils import timezone

if TYPE_CHECKING:  # the models are imported once the apps are ready, as Django's store does
    from django.contrib.sessions.models import Session


class SessionStore(db.SessionStore):
    """``django.contrib.sessions.backends.db.SessionStore`` whose load is one SELECT."""

    def _get_session_from_db(self) -> Session | None:
        """The live session row of this key (only its data is read), or None; as
        Django's: a missing or expired key forgets the key (a new one on save)."""
        model = self.model
        alias = router.db_for_read(model)
        conn = connections[alias]
        opts = model._meta
        quote = conn.ops.quote_name
        key_field = opts.get_field("session_key")
        data_field = opts.get_field("session_data")
        expire_field = opts.get_field("expire_date")
        # Identifiers from the model's metadata, quoted; both values are parameters.
        sql = (
            f"SELECT {quote(data_field.column)} FROM {quote(opts.db_table)} "  # noqa: S608
            f"WHERE {quote(key_field.column)} = %s AND {quote(expire_field.column)} > %s"
        )
        try:
            if self.session_key is None:  # no cookie, or a key that failed validation
                raise model.DoesNotExist
            # The expiry bound converted as the ORM converts it for this column.
            now = expire_field.get_db_prep_value(timezone.now(), conn)
            with conn.cursor() as cursor:
                cursor.execute(sql, [self.session_key, now])
                row = cursor.fetchone()
            if row is None:
                raise model.DoesNotExist
        except (model.DoesNotExist, SuspiciousOperation) as exc:
            if isinstance(exc, SuspiciousOperation):
                logger = logging.getLogger(f"django.security.{exc.__class__.__name__}")
                logger.warning(str(exc))
            self._session_key = None
            return None
        # Only ``session_data`` is read from it (``load``); no expiry needed here.
        return model(session_key=self.session_key, session_data=row[0])
