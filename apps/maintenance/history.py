"""Maintenance runs as what happened on a cluster, for the pages that show work around a moment."""

from __future__ import annotations

from datetime import datetime

from apps.fleet.activity import Activity
from apps.maintenance.models import MaintenanceRun


def runs_since(clusters: set[int], since: datetime) -> list[Activity]:
    # Only what an item shows: a run's results and replica lists are JSON an incident page never reads.
    runs = (
        MaintenanceRun.objects.filter(cluster_id__in=clusters, created_at__gte=since)
        .only("cluster", "deployment", "created_at", "started_at", "kind", "state")
        .order_by("created_at", "id")
    )
    return [
        Activity(
            cluster_id=run.cluster_id,
            deployment_id=run.deployment_id,
            created_at=run.created_at,
            at=run.started_at or run.created_at,
            kind="maintenance",
            id=run.pk,
            text=f"{run.get_kind_display()} run #{run.pk} ({run.get_state_display().lower()})",
        )
        for run in runs
    ]
