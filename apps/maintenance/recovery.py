"""Runs the tick finds without a worker: queued ones whose message was lost are sent again, and
running ones whose worker stopped are failed with how far they got."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.changes.models import ACTIVE_STATES
from apps.clusters.models import Reachability
from apps.maintenance.execution import running_replicas
from apps.maintenance.models import MaintenanceRun
from apps.maintenance.run_log import end_run, log_line
from integrations.ray.errors import RayError

log = logging.getLogger(__name__)


def requeue_lost(now=None) -> list[int]:
    """Queued runs no worker took up within FLEETDECK_CHANGE_STALE_S of being sent: the broker
    refused or lost the message (a Redis restarted without persistence keeps no queue). Each is
    claimed before it is sent again, so two ticks send it once; a late original finds it claimed
    by `execute` and does nothing."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.FLEETDECK_CHANGE_STALE_S)
    lost = MaintenanceRun.objects.filter(state=MaintenanceRun.State.QUEUED, enqueued_at__lt=cutoff)
    requeued = []
    for run in lost.order_by("pk"):
        if MaintenanceRun.objects.filter(pk=run.pk, state=MaintenanceRun.State.QUEUED, enqueued_at__lt=cutoff).update(
            enqueued_at=now
        ):
            log_line(
                run,
                f"No worker took this run up within {settings.FLEETDECK_CHANGE_STALE_S} s; sent to the workers again.",
            )
            requeued.append(run.pk)
    return requeued


def abandon_stale(now=None) -> list[int]:
    """Fail running runs whose worker stopped: no heartbeat for FLEETDECK_CHANGE_STALE_S. A recycle
    is not run again (it would stop replicas a second time without anyone deciding to); the record
    says how far it got, and failing it frees the cluster for the next recycle. Each run is claimed
    with a conditional UPDATE, so two ticks fail it once."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.FLEETDECK_CHANGE_STALE_S)
    # A run claimed by a worker of a release before heartbeats has none: its start stands in.
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    stale = MaintenanceRun.objects.select_related("cluster", "deployment__application", "change").filter(
        silent, state=MaintenanceRun.State.RUNNING
    )
    abandoned = []
    for run in stale.order_by("pk"):
        if run.change is not None and run.change.state in ACTIVE_STATES:
            # The change's own reconciler finishes it; its outcome is what this run's record should say.
            continue
        try:
            message = _abandoned(run)
        except Exception as exc:  # one unreadable cluster must not stop the tick's other work
            log.exception("maintenance run %s: reading how far it got failed", run.pk)
            message = (
                f"The worker stopped during the run (no heartbeat for {settings.FLEETDECK_CHANGE_STALE_S} s); how far "
                f"it got could not be read ({exc}): check the deployment before recycling it again."
            )
        if end_run(run, MaintenanceRun.State.FAILED, message, only_if=silent, error=message):
            abandoned.append(run.pk)
    return abandoned


def _abandoned(run: MaintenanceRun) -> str:
    lead = f"The worker stopped during the run (no heartbeat for {settings.FLEETDECK_CHANGE_STALE_S} s)"
    if run.kind == MaintenanceRun.Kind.WARMUP:
        return f"{lead}; its results were lost. A warmup changes nothing on the cluster: run it again if needed."
    if run.change is None:
        return f"{lead} before it started its change; no replica was recycled."
    change = f"change #{run.change.pk} {run.change.get_state_display().lower()}"
    before = run.replicas_before
    try:
        if run.deployment is None:
            raise LookupError("the deployment is no longer known")
        if run.cluster.reachability != Reachability.OK:
            raise LookupError(f"{run.cluster.name} is not reachable")
        now_running, _ = running_replicas(run.cluster, run.deployment)
    except (LookupError, RayError) as exc:
        return (
            f"{lead}; {change}, and the running replicas could not be read ({getattr(exc, 'message', exc)}), so how "
            f"many of the {len(before)} replica(s) were recycled is unknown: check the deployment before recycling it "
            "again."
        )
    kept = sorted(set(before) & set(now_running))
    return f"{lead}; {len(before) - len(kept)} of {len(before)} replica(s) had been recycled ({change})" + (
        f"; still running from before: {', '.join(kept)}." if kept else "."
    )
