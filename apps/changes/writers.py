"""Where a change's config is written. The dashboard writer PUTs through the adapter; a cluster
whose Serve config is owned by a KubeRay RayService gets the RayService writer of its Kubernetes
link (`apps.kubernetes_link.writer`), and is never pushed through the dashboard (KubeRay would
silently revert it)."""

from __future__ import annotations

from typing import Protocol

from apps.clusters.models import Cluster
from apps.clusters.services import dashboard_for


class WriterUnavailable(Exception):
    pass


class ConfigWriter(Protocol):
    def push(self, config: dict) -> None: ...


class DashboardWriter:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def push(self, config: dict) -> None:
        with dashboard_for(self.cluster) as ray:
            ray.put_serve_applications(config)


def writer_for(cluster: Cluster, *, planned_base: dict | None = None) -> ConfigWriter:
    """`planned_base`, for a forward push, is the config the change was planned against: the
    RayService writer checks serveConfigV2 still holds it (the dashboard writer relies on the
    protocol's drift check, since the dashboard is then the source of truth)."""
    if cluster.serve_config_owner == Cluster.ConfigOwner.RAYSERVICE:
        from apps.kubernetes_link.writer import rayservice_writer

        return rayservice_writer(cluster, planned_base=planned_base)
    return DashboardWriter(cluster)


def owner_waiting_for(cluster: Cluster, applications: list[str]) -> list[str]:
    """What the config's owner still reports as not done, beyond the dashboard: for a RayService,
    KubeRay must have reconciled the new generation and report the applications healthy."""
    if cluster.serve_config_owner != Cluster.ConfigOwner.RAYSERVICE:
        return []
    from apps.kubernetes_link.writer import waiting_for

    return waiting_for(cluster, applications)
