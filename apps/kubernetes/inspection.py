"""After each sync of a linked cluster: read its KubeRay resource, its pods, the autoscalers and
Warning events around it; run the playbook's K1-K4 checks into findings (for the remediation app,
`signals.kube_findings_checked`); report the kernel's OOM kills of Ray containers (for the incidents
app, `ray_pods_oom_killed`); keep a snapshot for the cluster page.

Kubernetes is read even when the Ray dashboard is down: a head pod the kernel keeps killing is
exactly when the dashboard does not answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from apps.clusters.models import Cluster, Reachability
from apps.clusters.pod_kill_events import PodKill, ray_pods_oom_killed
from apps.clusters.services import dashboard_for
from apps.core.secrets import SecretUnreadable
from apps.fleet.models import Deployment
from apps.kubernetes import checks
from apps.kubernetes.adapters import adapter_for
from apps.kubernetes.models import KubeLink
from apps.kubernetes.oomkilled import ContainerKill, oomkilled, ray_restarts
from apps.kubernetes.signals import kube_findings_checked
from integrations.kubernetes.adapter import KubeAdapter, ListResult
from integrations.kubernetes.errors import KubeError, KubeNotFound
from integrations.kubernetes.events import Event
from integrations.kubernetes.kuberay import RayCluster, RayService
from integrations.kubernetes.pods import LABEL_CLUSTER, Container, Pod, Termination
from integrations.ray.errors import RayError

# The cluster page lists pods from the snapshot; a huge cluster keeps the first ones and a count.
MAX_SNAPSHOT_PODS = 200
MAX_EVENTS = 20


@dataclass
class Observation:
    rayclusters: list[RayCluster]
    rayservices: list[RayService]
    pods: list[Pod] = field(default_factory=list)
    hpas: list = field(default_factory=list)
    scaled_objects: list = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    partial: bool = False
    warnings: list[str] = field(default_factory=list)

    def add(self, result: ListResult) -> list:
        # Only results that are not the whole truth warn; "KEDA is not installed" is not a gap.
        if result.partial:
            self.partial = True
            self.warnings += [w for w in result.warnings if w not in self.warnings]
        return result.items


def inspect(cluster_id: int) -> KubeLink | None:
    link = KubeLink.objects.select_related("cluster__team", "connection").filter(cluster_id=cluster_id).first()
    if link is None:
        return None
    now = timezone.now()
    try:
        with adapter_for(link.connection) as kube:
            seen = observe(kube, link)
    except KubeError as exc:
        # The last snapshot and findings stay: an unreachable API server says nothing about the pods.
        KubeLink.objects.filter(pk=link.pk).update(inspected_at=now, last_error=exc.message)
        link.inspected_at, link.last_error = now, exc.message
        return link
    ray_nodes, ray_warning = _ray_view(link.cluster)
    warnings = seen.warnings + ([ray_warning] if ray_warning else [])
    found = run_checks(link.cluster, seen, ray_nodes, now=now)
    # Without Ray's view K1 cannot repeat what it found from it: resolving those would only flap.
    kube_findings_checked.send(
        KubeLink, cluster=link.cluster, findings=found, complete=not seen.partial and not ray_warning
    )
    memory = _ray_memory(seen, ray_nodes)
    ray_pods_oom_killed.send(
        KubeLink,
        cluster=link.cluster,
        kills=_ray_kills(seen, memory),
        restarts=[_restart(r) for r in ray_restarts(seen.pods)],
    )
    link.snapshot = snapshot(link, seen, memory)
    link.inspected_at, link.last_error, link.partial, link.warnings = now, "", seen.partial, warnings
    link.save(update_fields=["snapshot", "inspected_at", "last_error", "partial", "warnings"])
    return link


def observe(kube: KubeAdapter, link: KubeLink) -> Observation:
    namespace = link.namespace
    listed = kube.list_rayclusters(namespace)
    if link.kind == KubeLink.Kind.RAYSERVICE:
        service = kube.get_rayservice(namespace, link.name)
        seen = Observation([c for c in listed.items if c.rayservice == link.name], [service])
        names = {c.name for c in seen.rayclusters} | {
            n for n in (service.status.active.cluster_name, service.status.pending.cluster_name) if n
        }
    else:
        seen = Observation([c for c in listed.items if c.name == link.name], [])
        if not seen.rayclusters and not listed.partial:
            raise KubeNotFound(f"RayCluster {namespace}/{link.name} does not exist any more.")
        names = {link.name}
    seen.add(listed)
    seen.pods = seen.add(kube.list_pods(namespace, label_selector=f"{LABEL_CLUSTER} in ({','.join(sorted(names))})"))
    seen.hpas = seen.add(kube.list_hpas(namespace))
    seen.scaled_objects = seen.add(kube.list_scaled_objects(namespace))
    pods = {pod.name for pod in seen.pods}
    events = seen.add(kube.list_events(namespace, field_selector="involvedObject.kind=Pod,type=Warning"))
    seen.events = sorted((e for e in events if e.involved_name in pods), key=_event_time, reverse=True)[:MAX_EVENTS]
    return seen


def run_checks(
    cluster: Cluster, seen: Observation, ray_nodes: list[checks.RayNodeMemory], *, now: datetime
) -> list[checks.Finding]:
    autoscaled = Deployment.objects.filter(
        application__cluster=cluster,
        application__removed_at__isnull=True,
        removed_at__isnull=True,
        autoscaling_max_replicas__isnull=False,
    ).exists()
    # Serve autoscaling as the dashboard reports it, for K2: it scales the linked resource's workers.
    serve_autoscaled = [f"{r.namespace}/{r.name}" for r in [*seen.rayclusters, *seen.rayservices]] if autoscaled else []
    return [
        *checks.check_k1(seen.rayclusters, seen.rayservices, seen.pods, ray_nodes),
        *checks.check_k2(seen.rayclusters, seen.rayservices, seen.hpas, seen.scaled_objects, serve_autoscaled),
        *checks.check_k3(seen.pods, now=now),
        *checks.check_k4(seen.rayclusters, seen.rayservices, seen.pods),
    ]


def _ray_view(cluster: Cluster) -> tuple[list[checks.RayNodeMemory], str]:
    """Ray's own view of each node's memory, keyed by node IP (a pod's IP under KubeRay)."""
    if cluster.reachability != Reachability.OK:
        return (
            [],
            "The Ray dashboard did not answer the last sync: K1 compares the specs and pods only, not Ray's view of "
            "each node.",
        )
    try:
        with dashboard_for(cluster) as ray:
            memory = ray.node_memory()
            nodes = ray.list_nodes().items
    except (RayError, SecretUnreadable) as exc:
        return (
            [],
            f"Ray's view of node memory is unavailable ({getattr(exc, 'message', exc)}): K1 compares the specs and "
            "pods only.",
        )
    resources = {node.node_ip: node.resources_total for node in nodes}
    view = []
    for node in memory:
        total = resources.get(node.node_ip, {})
        # What the memory monitor measures (the node's memory as Ray reads it) or what the scheduler
        # plans with (`--memory`), whichever is larger: either above the container limit is OOM-6.
        planned = max(node.total_bytes, int(total.get("memory") or 0))
        view.append((node.node_ip, planned, int(total.get("object_store_memory") or 0)))
    return view, ""


def _ray_memory(seen: Observation, ray_nodes: list[checks.RayNodeMemory]) -> dict[str, tuple[int, str]]:
    """Per pod name: the memory Ray plans with and where that figure comes from."""
    by_ip = {ip: memory for ip, memory, _ in ray_nodes}
    specs = {c.name: c.spec for c in seen.rayclusters}
    out = {}
    for pod in seen.pods:
        if pod.pod_ip in by_ip:
            out[pod.name] = (by_ip[pod.pod_ip], "Ray's dashboard")
            continue
        spec = specs.get(pod.ray_cluster)
        group = (
            (
                spec.head
                if pod.ray_node_type == "head"
                else next((g for g in spec.workers if g.name == pod.ray_group), None)
            )
            if spec
            else None
        )
        declared = (group.ray_start_params.get("memory") or "") if group else ""
        if declared.isdigit():
            out[pod.name] = (int(declared), "rayStartParams memory")
    return out


def _ray_kills(seen: Observation, memory: dict[str, tuple[int, str]]) -> list[PodKill]:
    pods = {(pod.namespace, pod.name): pod for pod in seen.pods}
    kills = []
    for kill in oomkilled(seen.pods):
        pod = pods[(kill.namespace, kill.pod)]
        # Only Ray's own container: a sidecar killed at its limit says nothing about Ray's memory.
        if pod.ray_container is not None and pod.ray_container.name == kill.container:
            kills.append(_pod_kill(kill, pod, memory))
    return kills


def _pod_kill(kill: ContainerKill, pod: Pod, memory: dict[str, tuple[int, str]]) -> PodKill:
    ray_memory, source = memory.get(pod.name, (None, ""))
    return PodKill(
        key="/".join(kill.key),
        namespace=kill.namespace,
        pod=kill.pod,
        pod_ip=pod.pod_ip,
        container=kill.container,
        node=kill.node,
        ray_node_type=kill.ray_node_type,
        ray_group=kill.ray_group,
        exit_code=kill.exit_code,
        finished_at=kill.finished_at,
        restart_count=kill.restart_count,
        memory_limit_bytes=pod.ray_container.memory_limit_bytes,
        ray_memory_bytes=ray_memory,
        ray_memory_source=source,
    )


def _restart(kill: ContainerKill) -> dict:
    return {
        "pod": f"{kill.namespace}/{kill.pod}",
        "container": kill.container,
        "reason": kill.reason,
        "exit_code": kill.exit_code,
        "finished_at": kill.finished_at.isoformat() if kill.finished_at else None,
        "restart_count": kill.restart_count,
    }


# --- what the cluster page shows -------------------------------------------------------------


def snapshot(link: KubeLink, seen: Observation, memory: dict[str, tuple[int, str]]) -> dict:
    kills = sorted(oomkilled(seen.pods), key=lambda k: k.finished_at.isoformat() if k.finished_at else "", reverse=True)
    return {
        "resource": _resource(link, seen),
        "pods": [_pod(pod, memory.get(pod.name)) for pod in sorted(seen.pods, key=_pod_order)[:MAX_SNAPSHOT_PODS]],
        "pod_count": len(seen.pods),
        "last_oomkilled": _kill(kills[0]) if kills else None,
        "events": [_event(event) for event in seen.events],
    }


def _resource(link: KubeLink, seen: Observation) -> dict:
    out = {
        "kind": link.kind,
        "namespace": link.namespace,
        "name": link.name,
        "ray_clusters": [
            {"name": c.name, "state": c.state, "ray_version": c.spec.ray_version} for c in seen.rayclusters
        ],
    }
    if seen.rayservices:
        service = seen.rayservices[0]
        out.update(
            ready=service.status.ready,
            upgrading=service.status.upgrading,
            service_status=service.status.service_status,
            active_cluster=service.status.active.cluster_name,
            serve_config_error=service.serve_config_error,
        )
    return out


def _pod_order(pod: Pod) -> tuple:
    return (pod.ray_node_type != "head", pod.ray_group, pod.name)


def _pod(pod: Pod, ray_memory: tuple[int, str] | None) -> dict:
    container = pod.ray_container or (pod.containers[0] if pod.containers else Container("", "", {}, {}))
    return {
        "name": pod.name,
        "node_type": pod.ray_node_type,
        "group": pod.ray_group,
        "phase": pod.phase,
        "node": pod.node_name,
        "ip": pod.pod_ip,
        "container": container.name,
        "memory_request": container.requests.get("memory", container.limits.get("memory", "")),
        "memory_limit": container.limits.get("memory", ""),
        "cpu_request": container.requests.get("cpu", container.limits.get("cpu", "")),
        "gpus": container.gpu_limit,
        "restarts": container.restart_count,
        "last_termination": _termination(container.last_terminated),
        "terminating": pod.deletion_timestamp is not None,
        "ray_memory_bytes": ray_memory[0] if ray_memory else None,
    }


def _termination(termination: Termination | None) -> dict | None:
    if termination is None:
        return None
    return {
        "reason": termination.reason,
        "exit_code": termination.exit_code,
        "finished_at": termination.finished_at.isoformat() if termination.finished_at else None,
    }


def _kill(kill: ContainerKill) -> dict:
    return {
        "pod": kill.pod,
        "container": kill.container,
        "node": kill.node,
        "exit_code": kill.exit_code,
        "finished_at": kill.finished_at.isoformat() if kill.finished_at else None,
        "restart_count": kill.restart_count,
    }


def _event(event: Event) -> dict:
    return {
        "reason": event.reason,
        "message": event.message,
        "object": event.involved_name,
        "count": event.count,
        "last_seen": event.last_seen.isoformat() if event.last_seen else None,
    }


def _event_time(event: Event) -> str:
    return event.last_seen.isoformat() if event.last_seen else ""
