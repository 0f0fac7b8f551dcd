"""Rollout.contract: the result contract's state (docs/rollouts.md#result-contract)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0015_fleet_push_webhooks_refresh")]

    operations = [
        migrations.AddField(
            model_name="rollout",
            name="contract",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
