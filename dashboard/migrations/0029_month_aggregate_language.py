from django.db import migrations, models


class Migration(migrations.Migration):
    """``MonthAggregate.language`` (docs/analytics.md#performance): the rows computed
    before it have none, so every month's and year's file aggregates are made stale
    (their records cleared): the next view needing them computes them again, with it."""

    dependencies = [
        ('dashboard', '0028_coupling_blocks'),
    ]

    operations = [
        migrations.AddField(
            model_name='monthaggregate',
            name='language',
            field=models.CharField(blank=True, default='', max_length=40),
        ),
        migrations.RunSQL(
            'UPDATE dashboard_monthstamp SET aggregated = NULL, year_aggregated = NULL',
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
