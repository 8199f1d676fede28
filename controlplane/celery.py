import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("fleetdeck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")


@app.on_after_finalize.connect
def _install_beat_schedule(sender, **kwargs):
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
