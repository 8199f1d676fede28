"""Seal the secrets already stored in this app's configs (apps.core.sealed): the columns keep their
type, their values' env_vars, vLLM credentials and headers become ciphertext."""

from django.db import migrations

from apps.core import sealed


class Migration(migrations.Migration):
    dependencies = [("changes", "0006_redacted_drift")]

    operations = [sealed.sealing("changes")]
