"""The writer of a Serve config the Ray dashboard owns: one PUT of the whole config."""

from __future__ import annotations

from apps.clusters.models import Cluster
from apps.clusters.services import dashboard_for


class DashboardWriter:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def push(self, config: dict) -> None:
        with dashboard_for(self.cluster) as ray:
            ray.put_serve_applications(config)
