import json

from django.db import migrations, models

from apps.core import redaction, secrets


def encrypt(apps, schema_editor):
    MemoryCalibration = apps.get_model("calibration", "MemoryCalibration")
    for calibration in MemoryCalibration.objects.all().iterator():
        request = dict(calibration.request or {})
        representative = request.get("representative")
        headers = representative.get("headers") if isinstance(representative, dict) else None
        if isinstance(headers, dict) and headers:
            calibration.headers_ciphertext = secrets.encrypt(json.dumps(headers))
            request["representative"] = {**representative, "headers": redaction.redact_headers(headers)}
        if request.get("runtime_env"):
            request["runtime_env"] = redaction.redact_config(request["runtime_env"])
        if request != calibration.request:
            calibration.request = request
            calibration.save(update_fields=["headers_ciphertext", "request"])


def decrypt(apps, schema_editor):
    # The headers go back as they were sent; the env vars, never needed again, stay redacted.
    MemoryCalibration = apps.get_model("calibration", "MemoryCalibration")
    for calibration in MemoryCalibration.objects.exclude(headers_ciphertext="").iterator():
        representative = {**calibration.request["representative"]}
        representative["headers"] = json.loads(secrets.decrypt(calibration.headers_ciphertext))
        calibration.request = {**calibration.request, "representative": representative}
        calibration.save(update_fields=["request"])


class Migration(migrations.Migration):
    """A calibration's representative request may carry credentials in its headers (Authorization,
    an API key): they are stored encrypted, and the stored request keeps their names with redacted
    values, as it keeps the runtime_env's env vars."""

    dependencies = [
        ("calibration", "0002_shape_cold_baseline_limit_reason"),
    ]

    operations = [
        migrations.AddField(
            model_name="memorycalibration",
            name="headers_ciphertext",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.RunPython(encrypt, decrypt),
    ]
