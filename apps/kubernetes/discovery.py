"""Discovery: the RayClusters and RayServices a connection can see in its namespaces, with the
dashboard URL each would be registered under and the Fleetdeck cluster already linked to it.

A RayCluster that a RayService owns is not offered on its own: KubeRay replaces it on every
zero-downtime upgrade, so the link goes to the RayService, which outlives its clusters."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from django.utils import timezone

from apps.kubernetes.adapters import adapter_for
from apps.kubernetes.models import KubeConnection, KubeLink
from integrations.kubernetes.errors import KubeError, KubeNotFound
from integrations.kubernetes.kuberay import RayCluster, RayService

# The port KubeRay's head service exposes the Ray dashboard on.
DASHBOARD_PORT = 8265


@dataclass(frozen=True)
class Found:
    kind: str
    namespace: str
    name: str
    dashboard_url: str
    ray_version: str
    state: str
    ray_cluster: str = ""  # for a RayService: the active RayCluster
    applications: tuple[str, ...] = ()
    serve_config_error: str = ""
    linked_cluster_id: int | None = None
    linked_cluster_name: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)


@dataclass
class Discovery:
    resources: list[Found] = field(default_factory=list)
    partial: bool = False
    warnings: list[str] = field(default_factory=list)
    error: str = ""


def head_service_url(namespace: str, name: str) -> str:
    """The dashboard behind the head Service KubeRay creates, as Fleetdeck's workers inside the
    Kubernetes cluster reach it. Every RayCluster gets `<cluster>-head-svc`; a RayService also
    gets `<rayservice>-head-svc`, which KubeRay points at whichever RayCluster is active, so a
    cluster registered through it stays reachable across zero-downtime upgrades."""
    return f"http://{name}-head-svc.{namespace}.svc:{DASHBOARD_PORT}"


def discover(connection: KubeConnection) -> Discovery:
    """List what the connection can see and record the outcome on it (last check, error, warnings)."""
    try:
        with adapter_for(connection) as kube:
            services = kube.list_rayservices(connection.namespaces)
            clusters = kube.list_rayclusters(connection.namespaces)
    except KubeError as exc:
        _record(connection, error=exc.message, warnings=[])
        return Discovery(error=exc.message)
    linked = {
        (link.kind, link.namespace, link.name): link.cluster
        for link in KubeLink.objects.filter(connection=connection).select_related("cluster")
    }
    found = [_service(s) for s in services.items]
    found += [_cluster(c) for c in clusters.items if not c.rayservice]
    found = [
        _with_link(item, linked.get(item.key)) for item in sorted(found, key=lambda f: (f.namespace, f.kind, f.name))
    ]
    warnings = list(dict.fromkeys(services.warnings + clusters.warnings))
    _record(connection, error="", warnings=warnings)
    return Discovery(resources=found, partial=services.partial or clusters.partial, warnings=warnings)


def find(connection: KubeConnection, kind: str, namespace: str, name: str) -> Found:
    """One resource, read again from the API server (a discovery page may be minutes old)."""
    if namespace not in connection.namespaces:
        raise KubeNotFound(f"Namespace {namespace} is not one of connection {connection.name}'s namespaces.")
    with adapter_for(connection) as kube:
        if kind == KubeLink.Kind.RAYSERVICE:
            return _service(kube.get_rayservice(namespace, name))
        listed = kube.list_rayclusters(namespace)
    cluster = next((c for c in listed.items if c.name == name), None)
    if cluster is None:
        raise KubeNotFound(
            f"RayCluster {namespace}/{name} does not exist"
            + (f" ({'; '.join(listed.warnings)})" if listed.warnings else ".")
        )
    if cluster.rayservice:
        raise KubeNotFound(
            f"RayCluster {namespace}/{name} belongs to RayService {cluster.rayservice}, which replaces it on upgrades: "
            "link the RayService instead."
        )
    return _cluster(cluster)


def _service(service: RayService) -> Found:
    active = service.status.active.cluster_name
    state = "Ready" if service.status.ready else (service.status.service_status or "Not ready")
    if service.status.upgrading:
        state += ", upgrading"
    return Found(
        kind=KubeLink.Kind.RAYSERVICE,
        namespace=service.namespace,
        name=service.name,
        dashboard_url=head_service_url(service.namespace, service.name),
        ray_version=service.cluster_spec.ray_version,
        state=state,
        ray_cluster=active,
        applications=tuple(app["name"] for app in (service.serve_config or {}).get("applications", [])),
        serve_config_error=service.serve_config_error,
    )


def _cluster(cluster: RayCluster) -> Found:
    return Found(
        kind=KubeLink.Kind.RAYCLUSTER,
        namespace=cluster.namespace,
        name=cluster.name,
        dashboard_url=head_service_url(cluster.namespace, cluster.name),
        ray_version=cluster.spec.ray_version,
        state=cluster.state or "unknown",
        ray_cluster=cluster.name,
    )


def _with_link(item: Found, cluster) -> Found:
    if cluster is None:
        return item
    return replace(item, linked_cluster_id=cluster.pk, linked_cluster_name=cluster.name)


def _record(connection: KubeConnection, *, error: str, warnings: list[str]) -> None:
    KubeConnection.objects.filter(pk=connection.pk).update(
        last_checked_at=timezone.now(), last_error=error, last_warnings=warnings
    )
