"""The playbook's Kubernetes checks K1-K4 as pure functions over the adapter's objects.

Each check returns findings; none reads the network or the database. Specs (RayCluster, and the
RayService's embedded cluster config) are checked where they exist, because they say what every
future pod will look like; live pods are checked only when no spec given covers them, so one
mistake is reported once, not once per replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from integrations.kubernetes.autoscalers import HorizontalPodAutoscaler, ScaledObject
from integrations.kubernetes.kuberay import RayCluster, RayService
from integrations.kubernetes.pods import Container, Pod

# Ray's own view of a node, from the dashboard: (node IP or pod name, memory total, object store).
RayNodeMemory = tuple[str, int, int]

# Ray may round what it reads from the cgroup; a hair above the limit is not a misconfiguration.
MEMORY_TOLERANCE = 0.02

# K3: how long past deletionTimestamp a pod may linger before it counts as stuck. The kubelet
# sends SIGKILL at deletionTimestamp; reporting the kill back and removing the pod normally takes
# seconds, a minute on a busy node.
TERMINATING_MARGIN_S = 120

# K4: the floor of CPU per GPU. KubeRay advertises the container's CPU (limit, else request) to
# Ray as num-cpus, and a Serve replica asks for a CPU as well as its GPU by default: below one CPU
# per GPU some GPUs can never get a replica. And the host-side work that feeds a GPU (request
# parsing, tokenization, batching, kernel launches, plus the raylet and Serve proxy on the same
# pod) throttles under a CFS quota below one core, which shows up as latency spikes (LAT-3) with
# the GPU idle. One core per GPU is a floor, not a recommendation: data-heavy models want more.
MIN_CPU_PER_GPU = 1.0


@dataclass(frozen=True)
class Finding:
    rule: str  # K1..K4
    severity: str  # "major" | "warning", as config-lint findings
    subject: str  # namespace/name[/group][/container]
    evidence: dict[str, Any]
    message: str
    cause: str = ""  # the playbook cause the finding points to (OOM-6, OOM-7, LAT-3, ...)


@dataclass(frozen=True)
class _Target:
    """One Ray container to check: from a spec's node group, or from a live pod."""

    subject: str
    container: Container
    node_type: str
    ray_start_params: dict[str, str]
    pod: Pod | None = None


def _targets(
    rayclusters: Iterable[RayCluster], rayservices: Iterable[RayService], pods: Iterable[Pod]
) -> Iterator[_Target]:
    rayclusters, rayservices = list(rayclusters), list(rayservices)
    covered_services = {(c.namespace, c.rayservice) for c in rayclusters if c.rayservice}
    specs = [(c.namespace, c.name, c.spec) for c in rayclusters]
    specs += [
        (s.namespace, s.name, s.cluster_spec) for s in rayservices if (s.namespace, s.name) not in covered_services
    ]
    for namespace, name, spec in specs:
        for group in spec.groups:
            if group.ray_container is not None:
                subject = f"{namespace}/{name}/{group.name}/{group.ray_container.name}"
                yield _Target(subject, group.ray_container, group.node_type, group.ray_start_params)
    covered_clusters = {(c.namespace, c.name) for c in rayclusters}
    for pod in pods:
        if pod.ray_container is not None and (pod.namespace, pod.ray_cluster) not in covered_clusters:
            yield _Target(
                f"{pod.namespace}/{pod.name}/{pod.ray_container.name}", pod.ray_container, pod.ray_node_type, {}, pod
            )


# --- K1: memory requests and limits, and Ray's sizes inside them ----------------------------


def check_k1(
    rayclusters: Iterable[RayCluster] = (),
    rayservices: Iterable[RayService] = (),
    pods: Iterable[Pod] = (),
    ray_nodes: Iterable[RayNodeMemory] = (),
) -> list[Finding]:
    """Every Ray container has a memory request and limit; `--memory` and `--object-store-memory`
    from rayStartParams fit inside the limit; and Ray's own view of each running pod (matched by
    pod IP or pod name) does not exceed it. Ray believing it has more memory than the container
    is OOM-6: its memory monitor never reaches its threshold before the kernel kills the pod."""
    pods = list(pods)
    findings = [finding for target in _targets(rayclusters, rayservices, pods) for finding in _k1_spec(target)]
    views = {key: (memory, store) for key, memory, store in ray_nodes}
    for pod in pods:
        container = pod.ray_container
        view = views.get(pod.pod_ip) or views.get(pod.name)
        if container is None or view is None or container.memory_limit_bytes is None:
            continue
        findings += _k1_ray_view(pod, container, container.memory_limit_bytes, *view)
    return findings


def _k1_spec(target: _Target) -> list[Finding]:
    container, findings = target.container, []
    limit, request = container.memory_limit_bytes, container.memory_request_bytes
    base = {"node_type": target.node_type, "requests": dict(container.requests), "limits": dict(container.limits)}
    if limit is None:
        # The request defaults to the limit, so it can only be missing when the limit is.
        missing = ["memory limit"] + (["memory request"] if request is None else [])
        scheduler = "the scheduler can place it on a node without the memory it will use, " if request is None else ""
        findings.append(
            Finding(
                "K1",
                "major",
                target.subject,
                {**base, "missing": missing},
                f"The Ray container has no {' and no '.join(missing)}: Ray sizes its object store and memory monitor "
                f"from what it sees, {scheduler}and the node's other pods decide when the kernel kills it. "
                "Set requests.memory = limits.memory.",
                "OOM-6",
            )
        )
        return findings
    params = {key: _bytes(target.ray_start_params.get(key)) for key in ("memory", "object-store-memory")}
    for key, size in params.items():
        if size is not None and size > limit * (1 + MEMORY_TOLERANCE):
            findings.append(
                Finding(
                    "K1",
                    "major",
                    target.subject,
                    {**base, f"ray_start_params.{key}": size, "memory_limit_bytes": int(limit)},
                    f"rayStartParams {key} is {_gib(size)} but the container limit is {_gib(limit)}: Ray plans with "
                    "memory the kernel will not give it. Size it below the limit.",
                    "OOM-6",
                )
            )
    if None not in params.values() and sum(params.values()) > limit * (1 + MEMORY_TOLERANCE):
        findings.append(
            Finding(
                "K1",
                "major",
                target.subject,
                {
                    **base,
                    "ray_start_params.memory": params["memory"],
                    "ray_start_params.object-store-memory": params["object-store-memory"],
                    "memory_limit_bytes": int(limit),
                },
                f"rayStartParams memory + object-store-memory is {_gib(sum(params.values()))}, more than the container "
                f"limit of {_gib(limit)}: heap and object store cannot both fill up without an OOM kill.",
                "OOM-6",
            )
        )
    return findings


def _k1_ray_view(pod: Pod, container: Container, limit: float, memory: int, store: int) -> list[Finding]:
    subject = f"{pod.namespace}/{pod.name}/{container.name}"
    evidence = {
        "memory_limit_bytes": int(limit),
        "ray_memory_total_bytes": memory,
        "ray_object_store_bytes": store,
        "node": pod.node_name,
        "pod_ip": pod.pod_ip,
    }
    findings = []
    if memory > limit * (1 + MEMORY_TOLERANCE):
        findings.append(
            Finding(
                "K1",
                "major",
                subject,
                evidence,
                f"Ray sees {_gib(memory)} of memory on this pod but the container limit is {_gib(limit)}: Ray's memory "
                "monitor will not act before the kernel OOM-kills the container. Align Ray's --memory with the limit.",
                "OOM-6",
            )
        )
    if store > limit * (1 + MEMORY_TOLERANCE):
        findings.append(
            Finding(
                "K1",
                "major",
                subject,
                evidence,
                f"Ray's object store ({_gib(store)}) is larger than the container limit ({_gib(limit)}): it was sized "
                "from the host's memory. Set --object-store-memory well inside the limit.",
                "OOM-3",
            )
        )
    return findings


# --- K2: two autoscalers on the same workers -------------------------------------------------


def check_k2(
    rayclusters: Iterable[RayCluster],
    rayservices: Iterable[RayService],
    hpas: Iterable[HorizontalPodAutoscaler] = (),
    scaled_objects: Iterable[ScaledObject] = (),
    serve_autoscaled_clusters: Iterable[str] = (),
) -> list[Finding]:
    """An HPA or KEDA ScaledObject whose scaleTargetRef is a RayCluster or RayService that Ray
    already scales: with in-tree autoscaling, two controllers write the worker replica counts and
    undo each other (and a scale-in picks pods that hold running replicas); with Serve autoscaling
    only, both react to the same load and overshoot. `serve_autoscaled_clusters` names clusters
    ("namespace/name") whose Serve config, read from the dashboard, autoscales a deployment; a
    RayService's own serveConfigV2 is read here."""
    clusters = {(c.namespace, c.name): c for c in rayclusters}
    services = {(s.namespace, s.name): s for s in rayservices}
    serve_autoscaled = set(serve_autoscaled_clusters)
    scalers: list[tuple[str, Any]] = [("HorizontalPodAutoscaler", h) for h in hpas]
    scalers += [("ScaledObject", s) for s in scaled_objects if not s.paused]
    findings = []
    for scaler_kind, scaler in scalers:
        target = scaler.target
        if target.group != "ray.io":
            continue
        key = (scaler.namespace, target.name)
        if target.kind == "RayCluster" and key in clusters:
            cluster = clusters[key]
            service = services.get((cluster.namespace, cluster.rayservice))
            in_tree = cluster.spec.in_tree_autoscaling
            serve = f"{cluster.namespace}/{cluster.name}" in serve_autoscaled or (
                service is not None and _serve_autoscales(service)
            )
        elif target.kind == "RayService" and key in services:
            service = services[key]
            in_tree = service.cluster_spec.in_tree_autoscaling
            serve = _serve_autoscales(service) or f"{service.namespace}/{service.name}" in serve_autoscaled
        else:
            continue
        if not (in_tree or serve):
            continue
        evidence = {
            "scaler": f"{scaler_kind}/{scaler.name}",
            "target": f"{target.kind}/{target.name}",
            "min_replicas": scaler.min_replicas,
            "max_replicas": scaler.max_replicas,
            "ray_in_tree_autoscaling": in_tree,
            "serve_autoscaling": serve,
        }
        if in_tree:
            message = (
                f"{scaler_kind} {scaler.name} scales {target.kind} {target.name}, whose worker groups the Ray "
                "autoscaler (enableInTreeAutoscaling) scales too: they overwrite each other's replica counts. "
                "Remove the external scaler and let Serve autoscaling drive the Ray autoscaler."
            )
        else:
            message = (
                f"{scaler_kind} {scaler.name} scales {target.kind} {target.name} while Serve autoscaling scales "
                "its replicas on the same load: both react and overshoot. Enable in-tree autoscaling and "
                "remove the external scaler."
            )
        findings.append(
            Finding(
                "K2", "major" if in_tree else "warning", f"{scaler.namespace}/{scaler.name}", evidence, message, "LAT-2"
            )
        )
    return findings


def _serve_autoscales(service: RayService) -> bool:
    for app in (service.serve_config or {}).get("applications") or []:
        for deployment in (app.get("deployments") or []) if isinstance(app, dict) else []:
            if isinstance(deployment, dict) and (
                isinstance(deployment.get("autoscaling_config"), dict) or deployment.get("num_replicas") == "auto"
            ):
                return True
    return False


# --- K3: pods stuck Terminating --------------------------------------------------------------


def check_k3(pods: Iterable[Pod], *, now: datetime, margin_s: int = TERMINATING_MARGIN_S) -> list[Finding]:
    """Pods still present `margin_s` after their deletionTimestamp. The API server sets that
    timestamp to the deletion request plus the grace period, so the grace period is already in it:
    adding terminationGracePeriodSeconds again would let a stuck pod hide for twice as long. A
    lingering Ray pod keeps its memory and GPU while its replacement starts (OOM-7)."""
    findings = []
    for pod in pods:
        if pod.deletion_timestamp is None:
            continue
        overdue = now - pod.deletion_timestamp
        if overdue <= timedelta(seconds=margin_s):
            continue
        why = (
            f"finalizers {', '.join(pod.finalizers)} have not been removed"
            if pod.finalizers
            else f"the kubelet on {pod.node_name or 'its node'} has not confirmed the kill "
            "(node down or kubelet stuck?)"
        )
        findings.append(
            Finding(
                "K3",
                "warning",
                f"{pod.namespace}/{pod.name}",
                {
                    "deletion_timestamp": pod.deletion_timestamp.isoformat(),
                    "overdue_s": int(overdue.total_seconds()),
                    "deletion_grace_period_s": pod.deletion_grace_period_s,
                    "termination_grace_period_s": pod.termination_grace_period_s,
                    "finalizers": list(pod.finalizers),
                    "node": pod.node_name,
                    "ray_node_type": pod.ray_node_type,
                    "ray_cluster": pod.ray_cluster,
                },
                f"Pod {pod.name} has been Terminating {int(overdue.total_seconds())} s past its deadline: {why}. "
                "Its memory is not freed for the pods that replace it.",
                "OOM-7",
            )
        )
    return findings


# --- K4: GPU pods starved of CPU -------------------------------------------------------------


def check_k4(
    rayclusters: Iterable[RayCluster] = (),
    rayservices: Iterable[RayService] = (),
    pods: Iterable[Pod] = (),
    *,
    min_cpu_per_gpu: float = MIN_CPU_PER_GPU,
) -> list[Finding]:
    """Containers with a GPU limit whose CPU request is missing or below `min_cpu_per_gpu` per GPU
    (see MIN_CPU_PER_GPU for why one core per GPU is the floor)."""
    findings = []
    for target in _targets(rayclusters, rayservices, pods):
        gpus, cpu = target.container.gpu_limit, target.container.cpu_request_cores
        if gpus <= 0 or (cpu is not None and cpu / gpus >= min_cpu_per_gpu):
            continue
        evidence = {
            "gpus": gpus,
            "cpu_request_cores": cpu,
            "min_cpu_per_gpu": min_cpu_per_gpu,
            "requests": dict(target.container.requests),
            "limits": dict(target.container.limits),
        }
        if cpu is None:
            message = (
                f"The container has {gpus:g} GPU(s) and no CPU request: the scheduler gives it no CPU share and "
                f"Ray sees no CPUs for replicas. Request at least {min_cpu_per_gpu * gpus:g} CPU."
            )
        else:
            message = (
                f"The container has {gpus:g} GPU(s) but requests {cpu:g} CPU ({cpu / gpus:.2f} per GPU): GPUs "
                f"wait on throttled host-side work. Request at least {min_cpu_per_gpu * gpus:g} CPU."
            )
        findings.append(
            Finding("K4", "major" if cpu is None else "warning", target.subject, evidence, message, "LAT-3")
        )
    return findings


def _bytes(value: str | None) -> int | None:
    # Ray's CLI takes plain byte counts; anything else is not a size Ray would accept.
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"
