"""Drop the single-column ``repository_id`` indexes of commits and file rows.

Both tables have composite indexes that lead with ``repository_id`` (the unique
(repository, fingerprint, sha) and page indexes; the path and language indexes), so
every lookup by repository — cascade deletes included — uses one of those, and the extra
B-tree only cost each chunk write one more insertion per row.

The state change is Django's ``db_index=False``; the database change is a plain ``DROP
INDEX`` (``AlterField`` would rebuild both tables on SQLite, copying every row).
"""

import django.db.models.deletion
from django.db import migrations, models

TABLES = ("commit", "filechange")


def _index(apps, schema_editor, name):
    model = apps.get_model("dashboard", name)
    field = model._meta.get_field("repository")
    # Django's own name for a ForeignKey's index (``_field_indexes_sql``).
    index = schema_editor._create_index_name(model._meta.db_table, [field.column], suffix="")
    return model, field, index


def drop(apps, schema_editor):
    for name in TABLES:
        _, _, index = _index(apps, schema_editor, name)
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(index)}")


def create(apps, schema_editor):
    for name in TABLES:
        model, field, _ = _index(apps, schema_editor, name)
        schema_editor.execute(schema_editor._create_index_sql(model, fields=[field]))


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0009_commit_counts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, create)],
            state_operations=[
                migrations.AlterField(
                    model_name="commit",
                    name="repository",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="commits",
                        to="dashboard.repository",
                    ),
                ),
                migrations.AlterField(
                    model_name="filechange",
                    name="repository",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="dashboard.repository",
                    ),
                ),
            ],
        ),
    ]
