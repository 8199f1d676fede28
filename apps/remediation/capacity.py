"""What the cluster can hold right now, read live through the Ray dashboard adapter when a wizard
computes its values: the alive nodes' resources and memory. A cluster that cannot be read gives
an empty reading, and the sizing says it could not check against it."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError

from apps.clusters.services import dashboard_for
from integrations.ray.errors import RayError
from integrations.ray.payloads import NodeMemory


@dataclass(frozen=True)
class Capacity:
    node_resources: list[dict[str, float]] | None  # resources_total of each alive node
    node_memory: list[NodeMemory] | None
    error: str = ""


def read(cluster) -> Capacity:
    try:
        with dashboard_for(cluster) as ray:
            nodes = [n.resources_total for n in ray.list_nodes().items if n.state == "ALIVE"]
            memory = ray.node_memory()
    except (RayError, ValidationError) as exc:
        return Capacity(None, None, getattr(exc, "message", None) or " ".join(getattr(exc, "messages", [str(exc)])))
    return Capacity(nodes or None, memory or None)
