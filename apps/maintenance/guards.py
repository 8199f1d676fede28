"""Why a recycle must not run now: what the cluster, the deployment's replicas and the other apps'
holds on the deployment say."""

from __future__ import annotations

import math

from django.conf import settings

from apps.changes.models import ACTIVE_STATES, Change
from apps.clusters.services import dashboard_for
from apps.fleet import holds
from apps.maintenance.models import MaintenanceRun
from integrations.ray.errors import RayError


def recycle_guards(run: MaintenanceRun, running: list[str], effective: dict) -> list[str]:
    """Why a recycle must not run now; empty when it may."""
    blocked = []
    cluster = run.cluster
    active = Change.objects.filter(cluster=cluster, state__in=ACTIVE_STATES).first()
    if active:
        blocked.append(f"Change #{active.pk} is in progress on {cluster.name}.")
    blocked += holds.reasons(run.deployment)
    surge = effective.get("max_surge_percent") or 0
    if len(running) < 2 and not surge:
        blocked.append(
            f"Only {len(running)} running replica(s) and no surge (max_surge_percent 0): the deployment would have "
            "no replica for about 2–3 s. Keep min_replicas at 2 or more, enable surge, or override."
        )
    if surge:
        per_replica = (effective.get("ray_actor_options") or {}).get(
            "memory"
        ) or settings.FLEETDECK_RECYCLE_REPLICA_MEMORY_MB * 2**20
        needed = math.ceil(len(running) * surge / 100) * per_replica
        try:
            with dashboard_for(cluster) as ray:
                available = sum(node.available_bytes for node in ray.node_memory())
        except RayError as exc:
            blocked.append(f"Cannot read the cluster's free memory for the surge: {exc.message}")
        else:
            if available < needed:
                blocked.append(
                    f"Surge starts new replicas before stopping old ones and needs about {needed / 2**30:.1f} GiB "
                    f"free; the cluster has {available / 2**30:.1f} GiB."
                )
    return blocked
