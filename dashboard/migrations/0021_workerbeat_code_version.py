from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0020_fair_scheduling"),
    ]

    operations = [
        migrations.AddField(
            model_name="analyzerversion",
            name="declared_effect",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="workerbeat",
            name="code_version",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
