"""Background work by name: the job names the worker registers its tasks under, and `enqueue`,
which services call so that no app imports the Celery app (the control plane's top layer)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from celery import current_app
from django.utils import timezone
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

TICK = "fleet.tick"
SYNC_CLUSTER = "fleet.sync_cluster"
SYNC_BATCH = "fleet.sync_batch"
INSPECT_KUBERNETES = "kube.inspect_cluster"
RUN_CHANGE = "changes.run"
RECONCILE_CHANGE = "changes.reconcile"
RUN_MAINTENANCE = "maintenance.run"
POLL_CALIBRATION = "calibration.poll"
DELIVER_WEBHOOK = "incidents.deliver_webhook"
COLLECT_METRICS = "incidents.collect_metrics"

ALL = (
    TICK,
    SYNC_CLUSTER,
    SYNC_BATCH,
    INSPECT_KUBERNETES,
    RUN_CHANGE,
    RECONCILE_CHANGE,
    RUN_MAINTENANCE,
    POLL_CALIBRATION,
    DELIVER_WEBHOOK,
    COLLECT_METRICS,
)


@dataclass(frozen=True)
class Job:
    """One message for the worker: the job's name, its arguments and Celery's sending options."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


def enqueue(job: str, *args, **options) -> bool:
    """Enqueue by name; False, logged, when the broker cannot take the message.

    Only for work whose row the periodic tick sends again when no worker took it up (queued
    changes, maintenance runs, calibrations): a broker outage then delays that work instead of
    failing the request that asked for it, after its row was already committed."""
    try:
        current_app.send_task(job, args=list(args), **options)
    except OperationalError as exc:
        log.warning("the broker did not take %s%s (%s); the tick sends it again", job, list(args), exc)
        return False
    return True


# A running worker takes a message up within a second or two; past this, the page says why it may wait.
PICKUP_S = 10


def unclaimed_for(sent_at: datetime | None, now: datetime | None = None) -> int | None:
    """Whole seconds a queued row has waited for a worker since it was last sent, once that is
    longer than a worker normally takes; None before then."""
    if sent_at is None:
        return None
    waited = ((now or timezone.now()) - sent_at).total_seconds()
    return int(waited) if waited >= PICKUP_S else None
