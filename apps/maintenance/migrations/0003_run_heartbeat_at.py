from django.db import migrations, models
from django.db.models import F
from django.db.models.functions import Coalesce


def backfill(apps, schema_editor):
    # Runs already stuck in RUNNING have no heartbeat; without one the reaper would never see them.
    MaintenanceRun = apps.get_model("maintenance", "MaintenanceRun")
    MaintenanceRun.objects.filter(state="running", heartbeat_at__isnull=True).update(heartbeat_at=Coalesce(F("started_at"), F("created_at")))


class Migration(migrations.Migration):

    dependencies = [
        ('maintenance', '0002_run_enqueued_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='maintenancerun',
            name='heartbeat_at',
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
