"""OOM kills that only Kubernetes saw. When the kernel kills a Ray container at its memory limit,
Ray's state API may record nothing: the pod's `lastState.terminated.reason` OOMKilled is the
evidence. Each killed Ray pod gets one open incident (keyed by the Ray node's IP, which is the
pod's IP), and each kill is recorded once however often the pod is read again."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import transaction

from apps.clusters.models import Cluster
from apps.clusters.pod_kill_events import PodKill
from apps.incidents.causes import KernelOomContext, rank_kernel_oom_causes, severity
from apps.incidents.models import Incident, PodKillRecord
from apps.incidents.services import open_or_extend


def record_pod_kills(cluster: Cluster, kills: list[PodKill], *, restarts: list[dict]) -> list[int]:
    """Open or extend an incident per killed Ray pod for kills not recorded before. `restarts`
    (every restart of the cluster's Ray containers, whatever the reason) goes into the evidence,
    so an OOM kill is read next to liveness failures and crashes. Returns incident ids touched."""
    if not kills:
        return []
    known = set(
        PodKillRecord.objects.filter(incident__cluster=cluster, kill_key__in=[k.key for k in kills]).values_list(
            "kill_key", flat=True
        )
    )
    by_pod: dict[str, list[PodKill]] = defaultdict(list)
    for kill in kills:
        if kill.key not in known:
            by_pod[kill.node_key].append(kill)
    return [_record(cluster, node_key, pod_kills, restarts) for node_key, pod_kills in sorted(by_pod.items())]


def on_ray_pods_oom_killed(sender, *, cluster: Cluster, kills: list[PodKill], restarts: list[dict], **kwargs) -> None:
    record_pod_kills(cluster, kills, restarts=restarts)


def _record(cluster: Cluster, node_key: str, kills: list[PodKill], restarts: list[dict]) -> int:
    latest = max(kills, key=lambda k: (k.finished_at is not None, k.finished_at or datetime.min))
    where = f"{latest.namespace}/{latest.pod}"
    head = latest.ray_node_type == "head"

    def build():
        ctx = KernelOomContext(
            pod=where,
            container=latest.container,
            limit_bytes=latest.memory_limit_bytes,
            ray_memory_bytes=latest.ray_memory_bytes,
            ray_memory_source=latest.ray_memory_source,
        )
        evidence = {
            "source": "kubernetes",
            "pod": where,
            "container": latest.container,
            "kubernetes_node": latest.node,
            "ray_node_type": latest.ray_node_type,
            "ray_group": latest.ray_group,
            "memory_limit_bytes": int(latest.memory_limit_bytes) if latest.memory_limit_bytes is not None else None,
            "ray_memory_bytes": latest.ray_memory_bytes,
            "ray_memory_source": latest.ray_memory_source,
            "ray_pod_restarts": restarts,
        }
        return rank_kernel_oom_causes(ctx), evidence

    with transaction.atomic():
        incident = open_or_extend(
            cluster,
            "",
            "",
            Incident.Kind.OOM_KILL,
            node_ip=node_key,
            count=len(kills),
            build=build,
            # The head's kill takes the GCS and the Serve controller down with it: every application notices.
            severity_for=lambda total: "critical" if head else severity(total, False),
            detected=(
                f"The kernel OOM-killed {latest.container} in pod {where} ({len(kills)} kill(s) reported by "
                "Kubernetes)."
            ),
            extended=f"{len(kills)} more kernel OOM kill(s) of pod {where}.",
        )
        PodKillRecord.objects.bulk_create(
            [
                PodKillRecord(
                    incident=incident,
                    kill_key=k.key,
                    namespace=k.namespace,
                    pod=k.pod,
                    container=k.container,
                    node=k.node,
                    exit_code=k.exit_code,
                    finished_at=k.finished_at,
                    restart_count=k.restart_count,
                    memory_limit_bytes=int(k.memory_limit_bytes) if k.memory_limit_bytes is not None else None,
                    ray_memory_bytes=k.ray_memory_bytes,
                )
                for k in kills
            ],
            ignore_conflicts=True,
        )
    return incident.pk
