import logging
import os
from datetime import datetime

from celery import Celery
from celery.signals import after_task_publish, beat_init
from celery.worker.consumer import Consumer
from django.utils import timezone
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("fleetdeck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")


class TolerantConsumer(Consumer):
    """Celery's consumer, except that a task message it cannot read is logged and dropped. Celery
    reads some malformed messages (a body that is not [args, kwargs, options], a missing id header,
    an unhashable task name) by raising, and an error raised there ends the worker for good."""

    def create_task_handler(self, *args, **kwargs):
        on_task_received = super().create_task_handler(*args, **kwargs)

        def tolerant(message):
            try:
                return on_task_received(message)
            except self.connection_errors + self.channel_errors:
                raise  # Celery reconnects on these
            except (LookupError, ValueError, TypeError, AttributeError) as exc:
                log.error(
                    "dropped a task message the worker cannot read (%s: %s); headers %.200r, body %.200r",
                    type(exc).__name__,
                    exc,
                    message.headers,
                    message.body,
                )
                if not message.acknowledged:
                    message.reject_log_error(log, self.connection_errors)

        return tolerant


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


@beat_init.connect
def _beat_heartbeats(sender, **kwargs):
    """Beat records a heartbeat as it starts and each time it sends the tick, so a page can tell a
    dead beat (no tick sent) from a dead worker (ticks sent, none run)."""
    _record_beat_heartbeat()
    after_task_publish.connect(_on_beat_publish, weak=False)


def _on_beat_publish(sender=None, **kwargs):
    if sender == "fleet.tick":
        _record_beat_heartbeat()


def _record_beat_heartbeat() -> None:
    from django.db import DatabaseError, close_old_connections

    from apps.liveness import services
    from apps.liveness.models import Heartbeat

    # Beat has no request cycle to drop a connection the database closed.
    close_old_connections()
    try:
        services.record(Heartbeat.Process.BEAT)
    except DatabaseError as exc:
        # Scheduling goes on without it; the page then names beat, which is where to look.
        log.warning("beat could not record its heartbeat: %s", exc)


# A running worker takes a message up within a second or two; past this, the page says why it may wait.
PICKUP_S = 10


def unclaimed_for(sent_at: datetime | None, now: datetime | None = None) -> int | None:
    """Whole seconds a queued row has waited for a worker since it was last sent, once that is
    longer than a worker normally takes; None before then."""
    if sent_at is None:
        return None
    waited = ((now or timezone.now()) - sent_at).total_seconds()
    return int(waited) if waited >= PICKUP_S else None
