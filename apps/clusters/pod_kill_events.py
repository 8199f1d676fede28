"""The kernel's OOM kills of a cluster's Ray containers, as the Kubernetes app sees them and the
incidents app records them. The two are siblings and import neither the other: the Kubernetes
inspection sends `ray_pods_oom_killed`, which the incidents app subscribes to."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.dispatch import Signal

# Sent with `cluster`, `kills` (a list of PodKill, the kills seen in this inspection, recorded or
# not) and `restarts` (every restart of the cluster's Ray containers, whatever the reason, as dicts).
ray_pods_oom_killed = Signal()


@dataclass(frozen=True)
class PodKill:
    key: str
    namespace: str
    pod: str
    pod_ip: str
    container: str
    node: str
    ray_node_type: str
    ray_group: str
    exit_code: int | None
    finished_at: datetime | None
    restart_count: int
    memory_limit_bytes: float | None
    ray_memory_bytes: int | None
    ray_memory_source: str

    @property
    def node_key(self) -> str:
        # A restarted container keeps its pod and IP; a pod without an IP still names a node.
        return self.pod_ip or self.pod[:64]
