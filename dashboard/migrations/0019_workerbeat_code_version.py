from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0018_coauthors"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerbeat",
            name="code_version",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
