import logging
import os

from celery import Celery
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("fleetdeck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")


@app.on_after_finalize.connect
def _install_beat_schedule(sender, **kwargs):
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()


def send(task_name: str, args: list, **options) -> bool:
    """Enqueue by name; False, logged, when the broker cannot take the message.

    Only for work whose row the periodic tick sends again when no worker took it up (queued
    changes, maintenance runs, calibrations): a broker outage then delays that work instead of
    failing the request that asked for it, after its row was already committed."""
    try:
        app.send_task(task_name, args=args, **options)
    except OperationalError as exc:
        log.warning("the broker did not take %s%s (%s); the tick sends it again", task_name, args, exc)
        return False
    return True
