"""A cluster's metrics reading runs as a job of its own, never inside the sync that asked for it.

A sync batch is every team's work; a metrics endpoint that answers slowly (a byte every few
seconds, an answer that never ends) would otherwise hold the whole batch for as long as the
transport's deadline allows, and each tick's next batch another worker slot. The reading is asked
for at every sync of a cluster with a metrics source and runs on the `metrics` queue under a Celery
time limit. One claim per cluster (`ScrapeState.claimed_at`) keeps the syncs that come while a
slow reading runs from queueing more of them: a claim older than the time limit is one whose
worker died or whose message was lost, and the next sync takes it over."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.core import jobs
from apps.incidents import ingest
from apps.incidents.models import ScrapeState
from apps.incidents.signals import metrics_collected

# After the soft limit the worker has this long to record the timeout and release the claim before
# Celery kills the process.
HARD_LIMIT_GRACE_S = 10


def soft_limit_s() -> float:
    return settings.FLEETDECK_METRICS_TIME_LIMIT_S


def hard_limit_s() -> float:
    return soft_limit_s() + HARD_LIMIT_GRACE_S


def on_cluster_synced(sender, cluster_id: int, outcome, **kwargs) -> None:
    # A metrics reading is a reading of now, for the latency detectors: asked for with every sync.
    if outcome.cluster.has_metrics_source:
        request(cluster_id)


def request(cluster_id: int) -> bool:
    """Queue a reading of the cluster unless one is already queued or running. True when queued."""
    now = timezone.now()
    ScrapeState.objects.get_or_create(cluster_id=cluster_id, defaults={"at": 0})
    free = Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - timedelta(seconds=hard_limit_s()))
    if not ScrapeState.objects.filter(free, cluster_id=cluster_id).update(claimed_at=now):
        return False
    if not jobs.enqueue(jobs.COLLECT_METRICS, cluster_id):
        release(cluster_id)
        return False
    return True


def run(cluster_id: int) -> list[int]:
    """Take the reading and release the claim, whatever happens; returns the incidents touched."""
    try:
        touched = ingest.collect_metrics(cluster_id)
    finally:
        release(cluster_id)
    metrics_collected.send(sender=run, cluster_id=cluster_id)
    return touched


def timed_out(cluster_id: int) -> None:
    """The reading passed its time limit: said where the cluster's metrics errors are shown."""
    ScrapeState.objects.filter(cluster_id=cluster_id).update(
        claimed_at=None,
        error=(
            f"The metrics reading took longer than {soft_limit_s():g} s (FLEETDECK_METRICS_TIME_LIMIT_S) "
            "and was stopped; the next sync tries again."
        ),
    )


def release(cluster_id: int) -> None:
    ScrapeState.objects.filter(cluster_id=cluster_id).update(claimed_at=None)
