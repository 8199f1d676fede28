from django.db import migrations, models

from apps.core import secrets
from integrations.webhook_client import shown


def encrypt(apps, schema_editor):
    Webhook = apps.get_model("incidents", "Webhook")
    for webhook in Webhook.objects.all().iterator():
        webhook.url_ciphertext = secrets.encrypt(webhook.url)
        webhook.url_shown = shown(webhook.url)
        webhook.save(update_fields=["url_ciphertext", "url_shown"])


def decrypt(apps, schema_editor):
    Webhook = apps.get_model("incidents", "Webhook")
    for webhook in Webhook.objects.all().iterator():
        webhook.url = secrets.decrypt(webhook.url_ciphertext)
        webhook.save(update_fields=["url"])


class Migration(migrations.Migration):
    """A webhook's URL is a credential (Slack-style URLs carry their secret in the path): it is
    stored encrypted, beside the scheme and host that are all anyone is shown of it."""

    dependencies = [
        ("incidents", "0007_window_recent_and_summaries"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhook", name="url_ciphertext", field=models.TextField(default=""), preserve_default=False
        ),
        migrations.AddField(
            model_name="webhook",
            name="url_shown",
            field=models.CharField(default="", max_length=500),
            preserve_default=False,
        ),
        migrations.RunPython(encrypt, decrypt),
        migrations.RemoveField(model_name="webhook", name="url"),
    ]
