from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0015_fleet_push_webhooks_refresh"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerbeat",
            name="code_version",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
