"""The authentication backend (``AUTHENTICATION_BACKENDS``): Django's ``ModelBackend``,
whose per-request user lookup is one plain SELECT instead of the ORM's ``get``.

Every logged-in request — page, API call through the session, socket handshake — loads
its user after its session (``django.contrib.auth.get_user``). Through the ORM that is
a queryset, its lookup and SQL compiled anew for each request: about 0.2 ms of CPU, 8 %
of the web processes' samples on the load test's mix (BENCHMARKS.md). Here the
SELECT is compiled once per database connection vendor and the row goes through the same
converters the ORM applies (so an SQLite datetime or boolean comes back as the same
Python value), then ``Model.from_db``, as the ORM builds an instance. The rest is
``ModelBackend``'s: the same password check on login, the same ``is_active`` rule, the
same permissions. Nothing is cached between requests: a deactivated or deleted user,
or a new password (Django's session hash, checked by ``get_user`` after this), is
refused at the next request, by every web process.

Sessions store the dotted path of the backend that logged them in, and Django logs out
a session whose path is not listed. ``ModelBackend`` therefore stays listed after this
one, so sessions logged in before this backend existed stay valid (they are served by
``ModelBackend`` until their next login). So that a wrong password is not checked twice
(once per backend: a second PBKDF2 round per failed login), this backend ends the
chain on a failed password login (Django's documented ``PermissionDenied`` rule): the
listed ``ModelBackend`` is only ever asked for users, never to authenticate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connections, router
from django.db.models import Q
from django.http import HttpRequest

Converter = Callable[[Any, Any, Any], Any]

#: ``(sql, attnames, per column: (its expression, its converters))``
Query = tuple[str, list[str], list[tuple[Any, list[Converter]]]]
#: ``{vendor: Query}``, built on first use.
_QUERIES: dict[str, Query] = {}


def _query(conn: Any) -> Query:
    """The user SELECT by primary key for this connection's vendor: every concrete
    column, with the converters the ORM would apply to each (backend's, then field's).
    Race: two threads building it at once compute the same value; the last one stays."""
    found = _QUERIES.get(conn.vendor)
    if found is not None:
        return found
    model = get_user_model()
    opts = model._meta
    quote = conn.ops.quote_name
    fields = list(opts.concrete_fields)
    columns = ", ".join(quote(f.column) for f in fields)
    sql = (
        f"SELECT {columns} FROM {quote(opts.db_table)} "  # noqa: S608 - identifiers from the model
        f"WHERE {quote(opts.pk.column)} = %s"
    )
    converters = []
    for f in fields:
        col = f.get_col(opts.db_table)
        converters.append((col, conn.ops.get_db_converters(col) + f.get_db_converters(conn)))
    built = (sql, [f.attname for f in fields], converters)
    _QUERIES[conn.vendor] = built
    return built


class UserBackend(ModelBackend):
    """``ModelBackend`` with a one-SELECT ``get_user`` (see the module docstring)."""

    def get_user(self, user_id: Any) -> Any:
        model = get_user_model()
        try:
            pk = model._meta.pk.to_python(user_id)
        except ValidationError:  # a session whose user id is not an id: no user
            return None
        alias = router.db_for_read(model)
        conn = connections[alias]
        sql, names, converters = _query(conn)
        with conn.cursor() as cursor:
            cursor.execute(sql, [pk])
            row = cursor.fetchone()
        if row is None:
            return None
        col_values = []
        for value, (col, funcs) in zip(row, converters, strict=True):
            for func in funcs:  # as the ORM's compiler applies them
                value = func(value, col, conn)
            col_values.append(value)
        user = model.from_db(alias, names, col_values)
        return user if self.user_can_authenticate(user) else None

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        """``ModelBackend``'s permission set (the user's own and their groups'), read in
        one query instead of two: every operations page checks a permission, so each
        logged-in page view loads the set once (cached on the user object for the
        request, ``_perm_cache``, the attribute ``ModelBackend`` reads too, so the
        backend listed after this one asks nothing more). Superusers, inactive and
        anonymous users, and object permissions: ``ModelBackend``'s own answer."""
        if (
            obj is not None
            or not user_obj.is_active
            or user_obj.is_anonymous
            or user_obj.is_superuser
            or hasattr(user_obj, "_perm_cache")
        ):
            return super().get_all_permissions(user_obj, obj)
        rows = (
            Permission.objects.filter(Q(user=user_obj) | Q(group__user=user_obj))
            .values_list("content_type__app_label", "codename")
            .distinct()
        )
        user_obj._perm_cache = {f"{app}.{codename}" for app, codename in rows}
        return user_obj._perm_cache

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None and password is not None:
            # A failed password login ends here: the ModelBackend listed after us (for
            # older sessions' stored path) would hash the same password again.
            raise PermissionDenied
        return user
