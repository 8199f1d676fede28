"""Celery tasks: thin shells over services. They take ids and return quietly if the row is gone."""

from __future__ import annotations

import logging

from celery import current_app, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from apps.calibration import services as calibration
from apps.changes import protocol
from apps.core import jobs
from apps.fleet import sync
from apps.incidents import metrics_jobs, webhooks
from apps.incidents.webhooks import RETRY_BACKOFF_MAX_S
from apps.kubernetes import inspection
from apps.kubernetes.services import linked
from apps.liveness import services as liveness
from apps.liveness.models import Heartbeat
from apps.maintenance import execution
from apps.remediation import wizards
from integrations.webhook_client import DeliveryError

log = logging.getLogger(__name__)


@shared_task(name=jobs.SYNC_CLUSTER, ignore_result=True, acks_late=True)
def sync_cluster(cluster_id: int) -> None:
    sync_batch([cluster_id])


@shared_task(name=jobs.SYNC_BATCH, ignore_result=True, acks_late=True)
def sync_batch(cluster_ids: list[int]) -> None:
    """Sync a batch of clusters, their dashboards read at once."""
    outcomes = sync.sync_and_announce(cluster_ids)
    for outcome in outcomes:
        if not outcome.ok:
            log.warning("sync of cluster %s failed: %s", outcome.cluster_id, outcome.error)
    # Kubernetes is read after failed syncs too: a head pod the kernel keeps killing is exactly
    # when the dashboard does not answer.
    for cluster_id in sorted(linked([outcome.cluster_id for outcome in outcomes])):
        inspect_kubernetes.delay(cluster_id)


@shared_task(name=jobs.INSPECT_KUBERNETES, ignore_result=True, acks_late=True)
def inspect_kubernetes(cluster_id: int) -> None:
    """K1-K4 findings, kernel OOM kills and the pods snapshot of a cluster linked to Kubernetes."""
    inspection.inspect(cluster_id)


@shared_task(
    name=jobs.COLLECT_METRICS,
    ignore_result=True,
    soft_time_limit=metrics_jobs.soft_limit_s(),
    time_limit=metrics_jobs.hard_limit_s(),
)
def collect_metrics(cluster_id: int) -> None:
    """One cluster's metrics reading, on its own queue and under a time limit (a slow endpoint
    holds this task, never a sync batch)."""
    try:
        metrics_jobs.run(cluster_id)
    except SoftTimeLimitExceeded:
        log.warning("the metrics reading of cluster %s passed its time limit", cluster_id)
        metrics_jobs.timed_out(cluster_id)


@shared_task(name=jobs.TICK, ignore_result=True, acks_late=True)
def tick() -> None:
    """The one periodic entry point: each app's handler finds its due work, and its jobs are sent."""
    # Before the work: a tick whose work fails still shows that the worker runs.
    liveness.record(Heartbeat.Process.WORKER)
    liveness.run_tick(
        lambda job: current_app.tasks[job.name].apply_async(args=job.args, kwargs=job.kwargs, **job.options)
    )


@shared_task(name=jobs.RUN_CHANGE, ignore_result=True)
def run_change(change_id: int) -> None:
    protocol.run(change_id)


@shared_task(name=jobs.RECONCILE_CHANGE, ignore_result=True, acks_late=True)
def reconcile_change(change_id: int) -> None:
    protocol.reconcile(change_id)


@shared_task(name=jobs.RUN_MAINTENANCE, ignore_result=True)
def run_maintenance(run_id: int) -> None:
    execution.execute(run_id)


@shared_task(name=jobs.POLL_CALIBRATION, ignore_result=True, acks_late=True)
def poll_calibration(calibration_id: int, follow: bool = True) -> None:
    """Polls until the calibration is final, then stops: past its deadline the service fails it,
    so the chain always ends. The tick polls (without following) any whose chain was lost."""
    polled = calibration.poll(calibration_id)
    if follow and polled is not None and not polled.is_final:
        poll_calibration.apply_async(args=[calibration_id], countdown=calibration.poll_interval_s())
    elif polled is not None and polled.is_final:
        # A wizard waiting on this calibration computes its values now, not at the next tick.
        for wizard_id in polled.wizard_steps.values_list("wizard_id", flat=True):
            wizards.settle_calibration(wizard_id)


@shared_task(
    name=jobs.DELIVER_WEBHOOK,
    ignore_result=True,
    autoretry_for=(DeliveryError,),
    retry_backoff=2,
    retry_backoff_max=RETRY_BACKOFF_MAX_S,
    retry_jitter=True,
    max_retries=5,
)
def deliver_webhook(delivery_id: int) -> None:
    """Retried with backoff only when the service raises (a transient failure it recorded)."""
    webhooks.deliver(delivery_id)
