from django.db import migrations, models


def split(apps, schema_editor):
    for name in ("SignalWindow", "NodeWindow"):
        model = apps.get_model("incidents", name)
        for window in model.objects.all().iterator():
            window.summaries = [p for p in window.recent if "summary" in p]
            window.recent = [p for p in window.recent if "summary" not in p]
            window.save(update_fields=["recent", "summaries"])


def join(apps, schema_editor):
    for name in ("SignalWindow", "NodeWindow"):
        model = apps.get_model("incidents", name)
        for window in model.objects.all().iterator():
            window.recent = [*window.summaries, *window.recent]
            window.save(update_fields=["recent"])


class Migration(migrations.Migration):
    """A window's 5-minute summaries get a column of their own, so a reading rewrites only the raw hour."""

    dependencies = [
        ("incidents", "0006_engine_stuck_kind"),
    ]

    operations = [
        migrations.RenameField(model_name="signalwindow", old_name="points", new_name="recent"),
        migrations.RenameField(model_name="nodewindow", old_name="points", new_name="recent"),
        migrations.AddField(model_name="signalwindow", name="summaries", field=models.JSONField(default=list)),
        migrations.AddField(model_name="nodewindow", name="summaries", field=models.JSONField(default=list)),
        migrations.RunPython(split, join),
    ]
