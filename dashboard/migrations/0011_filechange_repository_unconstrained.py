"""Drop the database foreign-key constraint of ``FileChange.repository``.

A file row's ``commit_id`` is constrained to an existing commit, and that commit's
``repository_id`` to an existing repository; the file row's own, denormalised
``repository_id`` (copied from its commit by ``write_chunk``, the only writer) is what
per-repository aggregates read without a join. Its constraint re-checked what the other
two already guarantee, once per inserted file row: on PostgreSQL a deferred trigger run
at every chunk's commit, ~145 ms of server time per 54,000 file rows (measured: as much as
the COPY of those rows). Deleting a repository still removes its file rows
(Django's ``on_delete=CASCADE``, unchanged).

The state change is Django's ``db_constraint=False``. The database change is PostgreSQL's
``ALTER TABLE … DROP CONSTRAINT`` (instant). SQLite is left as it is: its check is a
lookup in the small repository table and measured nothing (0.25 s for 54,000 rows either
way), while ``AlterField`` would rebuild the table there, copying every file row; a later
rebuild of the table for another reason drops the clause with it.
"""

import django.db.models.deletion
from django.db import migrations, models


def _constraints(schema_editor, model):
    """Names of the foreign keys of ``model.repository`` in the database."""
    field = model._meta.get_field("repository")
    with schema_editor.connection.cursor() as cursor:
        found = schema_editor.connection.introspection.get_constraints(
            cursor, model._meta.db_table
        )
    return [
        name
        for name, info in found.items()
        if info["foreign_key"] and info["columns"] == [field.column]
    ]


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    model = apps.get_model("dashboard", "FileChange")
    for name in _constraints(schema_editor, model):
        schema_editor.execute(schema_editor._delete_fk_sql(model, name))


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    model = apps.get_model("dashboard", "FileChange")
    if not _constraints(schema_editor, model):
        field = model._meta.get_field("repository")
        schema_editor.execute(
            schema_editor._create_fk_sql(model, field, "_fk_%(to_table)s_%(to_column)s")
        )


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0010_repository_fk_indexes_covered"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, create)],
            state_operations=[
                migrations.AlterField(
                    model_name="filechange",
                    name="repository",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="dashboard.repository",
                    ),
                ),
            ],
        ),
    ]
