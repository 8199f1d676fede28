"""Seal the secrets already stored in this app's configs (apps.core.sealed): the columns keep their
type, their values' env_vars, vLLM credentials and headers become ciphertext."""

from django.db import migrations

from apps.core import sealed


def seal_secrets(apps, schema_editor, undo=False):
    for label, field, kind in sealed.SEALED_FIELDS:
        app_label, model_name = label.split(".")
        if app_label == "fleet":
            sealed.seal_stored(apps.get_model(app_label, model_name), field, kind, undo=undo)


def open_secrets(apps, schema_editor):
    seal_secrets(apps, schema_editor, undo=True)


class Migration(migrations.Migration):
    dependencies = [("fleet", "0006_revision_order_per_application")]

    operations = [migrations.RunPython(seal_secrets, open_secrets)]
