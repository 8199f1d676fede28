import logging
import os
from functools import partial

from celery import Celery
from celery.signals import after_task_publish, beat_init, worker_init, worker_process_init
from celery.worker.consumer import Consumer
from kombu.message import Message

from apps.core import jobs
from controlplane import heap

log = logging.getLogger(__name__)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("fleetdeck")
# Services send through celery.current_app (apps.core.jobs); a request thread other than the one
# that made the app would otherwise get Celery's fallback app and its default broker.
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")


class TolerantConsumer(Consumer):
    """Celery's consumer, except that a task message it cannot read is logged and dropped. Celery
    reads some malformed messages (a body that is not [args, kwargs, options], a missing id header,
    an unhashable task name) by raising, and an error raised there ends the worker for good."""

    def create_task_handler(self, *args, **kwargs):
        on_task_received = super().create_task_handler(*args, **kwargs)

        def tolerant(message):
            # Looked up by Celery when it builds the task's ack, so this instance's own wins.
            message.ack_log_error = partial(_ack_unless_connection_gone, message)
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

    def on_connection_error_after_connected(self, exc):
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as cleanup:
            # Celery 5.7 collects the lost connection, then closes it; with a message still unacked
            # (an acks_late task running when the broker went away), the close puts it back through
            # the collected transport and raises this, which Celery takes for an unrecoverable
            # error: the worker stops consuming for good. The connection is already detached by
            # then, so reconnecting is safe; the broker redelivers the message after its visibility
            # timeout, or lost it with its own restart.
            log.warning("the lost broker connection could not be closed cleanly (%s); reconnecting", cleanup)


def _ack_unless_connection_gone(message: Message, logger, errors, multiple=False):
    """Acknowledge a late-acknowledged task's message. When the broker connection it came on was
    lost while the task ran, kombu's Redis channel acks through the collected connection and raises
    AttributeError in the event loop, which Celery takes for an unrecoverable error: the worker then
    stops consuming for good. There is nothing to acknowledge on a lost connection: the broker
    delivers the message again after its visibility timeout (or lost it with its own restart), and
    only tasks that may run twice are acknowledged late."""
    try:
        Message.ack_log_error(message, logger, errors, multiple=multiple)
    except AttributeError as exc:
        log.warning(
            "a task message from a lost broker connection was not acknowledged (%s); the broker delivers it again", exc
        )


@app.on_after_finalize.connect
def _install_beat_schedule(sender, **kwargs):
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()


@worker_init.connect
def _freeze_before_the_pool_forks(sender=None, **kwargs):
    # The pool's processes inherit a frozen heap: see controlplane/heap.py.
    heap.freeze()


@worker_process_init.connect
def _freeze_in_each_pool_process(**kwargs):
    heap.freeze()


@beat_init.connect
def _beat_heartbeats(sender, **kwargs):
    """Beat records a heartbeat as it starts and each time it sends the tick, so a page can tell a
    dead beat (no tick sent) from a dead worker (ticks sent, none run)."""
    _record_beat_heartbeat()
    after_task_publish.connect(_on_beat_publish, weak=False)


def _on_beat_publish(sender=None, **kwargs):
    if sender == jobs.TICK:
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
