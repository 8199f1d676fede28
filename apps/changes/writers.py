"""Where a change's config is written. The dashboard writer PUTs through the adapter; a cluster
whose Serve config is owned by a KubeRay RayService gets its own writer with the Kubernetes
integration, and is never pushed through the dashboard (KubeRay would silently revert it)."""

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


def writer_for(cluster: Cluster) -> ConfigWriter:
    if cluster.serve_config_owner == Cluster.ConfigOwner.RAYSERVICE:
        raise WriterUnavailable(
            f"{cluster.name}'s Serve config is owned by a KubeRay RayService: a push through the dashboard "
            "would be reverted by KubeRay. Changes to it go through the RayService writer, which needs the "
            "Kubernetes integration."
        )
    return DashboardWriter(cluster)
