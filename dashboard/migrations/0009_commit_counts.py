"""The kept number of stored commits per (repository, fingerprint), back-filled with
``COUNT(*)`` of what is stored (``dashboard.commitcounts``).

Run it with no worker of an older version writing chunks (``manage.py up`` migrates
before it starts workers): a chunk written by code that does not bump the count, after
the back-fill read its group, would be missing from it. The back-fill runs in the
migration's own transaction, so on SQLite it holds the write lock throughout.
"""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Count


def backfill(apps, schema_editor):
    Commit = apps.get_model("dashboard", "Commit")
    CommitCount = apps.get_model("dashboard", "CommitCount")
    db = schema_editor.connection.alias
    groups = (
        Commit.objects.using(db)
        .order_by()
        .values_list("repository_id", "fingerprint")
        .annotate(n=Count("id"))
    )
    CommitCount.objects.using(db).bulk_create(
        [CommitCount(repository_id=r, fingerprint=fp, commits=n) for r, fp, n in groups],
        batch_size=500,
    )


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0008_observe'),
    ]

    operations = [
        migrations.CreateModel(
            name='CommitCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('fingerprint', models.CharField(max_length=64)),
                ('commits', models.BigIntegerField(default=0)),
                ('repository', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='dashboard.repository')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('repository', 'fingerprint'), name='commitcount_repo_fp_unique')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
