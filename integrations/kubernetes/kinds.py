"""The resource types the adapter reads and writes, and the RBAC its calls need."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """A resource type as the API names it, with what to say when it is not served."""

    group: str
    version: str
    plural: str
    kind: str
    missing: str = ""  # message when the CRD is not installed; empty for built-in types

    @property
    def label(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


KUBERAY_MISSING = "KubeRay CRDs are not installed on this cluster"
RAYCLUSTERS = Kind("ray.io", "v1", "rayclusters", "RayCluster", KUBERAY_MISSING)
RAYSERVICES = Kind("ray.io", "v1", "rayservices", "RayService", KUBERAY_MISSING)
SCALEDOBJECTS = Kind("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", "KEDA is not installed on this cluster")
PODS = Kind("", "v1", "pods", "Pod")
EVENTS = Kind("", "v1", "events", "Event")
HPAS = Kind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")

# The RBAC the adapter's calls need, by (API group, resource), and nothing more: deploy/k8s/rbac.yaml
# grants exactly READS cluster-wide, deploy/k8s/optional/rayservice-writer exactly WRITES per namespace.
READS = {
    (RAYCLUSTERS.group, RAYCLUSTERS.plural): ("list",),
    (RAYSERVICES.group, RAYSERVICES.plural): ("get", "list"),
    (PODS.group, PODS.plural): ("list",),
    (EVENTS.group, EVENTS.plural): ("list",),
    (HPAS.group, HPAS.plural): ("list",),
    (SCALEDOBJECTS.group, SCALEDOBJECTS.plural): ("list",),
}
WRITES = {(RAYSERVICES.group, RAYSERVICES.plural): ("patch",)}
