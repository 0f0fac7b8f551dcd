"""Rollout.contract: the result contract's state (docs/rollouts.md#result-contract)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0018_coauthors")]

    operations = [
        migrations.AddField(
            model_name="rollout",
            name="contract",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
