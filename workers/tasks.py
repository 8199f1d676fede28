"""Celery tasks: thin shells over services. They take ids and return quietly if the row is gone."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from apps.fleet import sync
from apps.incidents.webhooks import RETRY_BACKOFF_MAX_S
from integrations.webhook_client import DeliveryError

log = logging.getLogger(__name__)


@shared_task(name="fleet.sync_cluster", ignore_result=True, acks_late=True)
def sync_cluster(cluster_id: int) -> None:
    from apps.incidents import services as incidents
    from apps.kubernetes.services import is_linked
    from apps.remediation import findings

    outcome = sync.sync_cluster(cluster_id)
    if outcome is not None and not outcome.ok:
        log.warning("sync of cluster %s failed: %s", cluster_id, outcome.error)
    elif outcome is not None:
        # OOM evidence lives in the state API, not in Serve's status: read it with every sync,
        # and take a metrics reading for the latency detectors.
        incidents.detect(cluster_id)
        incidents.collect_metrics(cluster_id)
        findings.recompute(cluster_id)
    # Kubernetes is read after failed syncs too: a head pod the kernel keeps killing is exactly
    # when the dashboard does not answer.
    if outcome is not None and is_linked(cluster_id):
        inspect_kubernetes.delay(cluster_id)


@shared_task(name="kube.inspect_cluster", ignore_result=True, acks_late=True)
def inspect_kubernetes(cluster_id: int) -> None:
    """K1-K4 findings, kernel OOM kills and the pods snapshot of a cluster linked to Kubernetes."""
    from apps.kubernetes import inspection

    inspection.inspect(cluster_id)


@shared_task(name="fleet.tick", ignore_result=True, acks_late=True)
def tick() -> None:
    """The one periodic entry point: find due work in the database and enqueue it."""
    from apps.changes import protocol
    from apps.liveness import services as liveness
    from apps.liveness.models import Heartbeat

    # Before the work: a tick whose work fails still shows that the worker runs.
    liveness.record(Heartbeat.Process.WORKER)

    for cluster_id in sync.claim_due_clusters():
        sync_cluster.apply_async(args=[cluster_id], expires=settings.FLEETDECK_SYNC_INTERVAL_S)
    for change_id in protocol.stale_changes():
        reconcile_change.delay(change_id)
    from apps.changes import rollouts

    for rollout_id in rollouts.running_rollouts():
        rollouts.advance(rollout_id)
    from apps.maintenance import dispatch, recovery

    for run_id in dispatch.claim_due() + recovery.requeue_lost():
        run_maintenance.delay(run_id)
    recovery.abandon_stale()
    from apps.incidents import webhooks

    for delivery_id in webhooks.requeue_lost():
        deliver_webhook.delay(delivery_id)
    from apps.calibration import services as calibration

    for calibration_id in calibration.stale_ids():
        poll_calibration.delay(calibration_id, follow=False)
    from apps.remediation import verification

    for wizard_id in verification.due():
        verification.evaluate(wizard_id)
    from apps.remediation import wizards

    for wizard_id in wizards.awaiting_calibration():
        wizards.settle_calibration(wizard_id)


@shared_task(name="changes.run", ignore_result=True)
def run_change(change_id: int) -> None:
    from apps.changes import protocol

    protocol.run(change_id)


@shared_task(name="changes.reconcile", ignore_result=True, acks_late=True)
def reconcile_change(change_id: int) -> None:
    from apps.changes import protocol

    protocol.reconcile(change_id)


@shared_task(name="maintenance.run", ignore_result=True)
def run_maintenance(run_id: int) -> None:
    from apps.maintenance import execution

    execution.execute(run_id)


@shared_task(name="calibration.poll", ignore_result=True, acks_late=True)
def poll_calibration(calibration_id: int, follow: bool = True) -> None:
    """Polls until the calibration is final, then stops: past its deadline the service fails it,
    so the chain always ends. The tick polls (without following) any whose chain was lost."""
    from apps.calibration import services

    calibration = services.poll(calibration_id)
    if follow and calibration is not None and not calibration.is_final:
        poll_calibration.apply_async(args=[calibration_id], countdown=services.poll_interval_s())
    elif calibration is not None and calibration.is_final:
        from apps.remediation import wizards

        # A wizard waiting on this calibration computes its values now, not at the next tick.
        for wizard_id in calibration.wizard_steps.values_list("wizard_id", flat=True):
            wizards.settle_calibration(wizard_id)


@shared_task(
    name="incidents.deliver_webhook",
    ignore_result=True,
    autoretry_for=(DeliveryError,),
    retry_backoff=2,
    retry_backoff_max=RETRY_BACKOFF_MAX_S,
    retry_jitter=True,
    max_retries=5,
)
def deliver_webhook(delivery_id: int) -> None:
    """Retried with backoff only when the service raises (a transient failure it recorded)."""
    from apps.incidents import webhooks

    webhooks.deliver(delivery_id)
