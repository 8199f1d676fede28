"""OOM kills as Kubernetes records them. Ray's memory monitor kills a worker process and the Serve
API never shows it (see `apps.incidents.oom`); when the kernel's OOM killer acts first, the
container dies with reason OOMKilled and exit code 137, and Ray's state API may show nothing at
all. A kernel kill of a Ray container is the signature of OOM-6 (the container limit is below what
Ray thinks it has). Pure functions over the adapter's pods."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from integrations.kubernetes.pods import Container, Pod, Termination

OOM_REASON = "OOMKilled"


@dataclass(frozen=True)
class ContainerKill:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    node: str
    reason: str
    exit_code: int | None
    finished_at: datetime | None
    restart_count: int
    ray_node_type: str  # head | worker | '' (not a KubeRay pod)
    ray_cluster: str
    ray_group: str
    kernel_oom: bool  # the kernel killed it, not Ray's memory monitor

    @property
    def suspected_cause(self) -> str:
        return "OOM-6" if self.kernel_oom else ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Identifies one kill across repeated reads of the same pod."""
        return (self.pod_uid, self.container, self.finished_at.isoformat() if self.finished_at else "")


def oomkilled(pods: Iterable[Pod]) -> list[ContainerKill]:
    """Every container, in any pod, whose current or last termination is OOMKilled."""
    kills: dict[tuple[str, str, str], ContainerKill] = {}
    for pod in pods:
        for container in pod.containers:
            for termination in _terminations(container):
                if termination.reason == OOM_REASON:
                    kill = _kill(pod, container, termination)
                    kills.setdefault(kill.key, kill)
    return list(kills.values())


def ray_restarts(pods: Iterable[Pod]) -> list[ContainerKill]:
    """The last termination of every restarted Ray container, whatever its reason, so OOM kills
    can be read next to the other restarts of the same cluster (liveness failures, crashes)."""
    restarts = []
    for pod in pods:
        container = pod.ray_container
        if container is not None and container.restart_count > 0 and container.last_terminated is not None:
            restarts.append(_kill(pod, container, container.last_terminated))
    return restarts


def _terminations(container: Container) -> list[Termination]:
    return [t for t in (container.terminated, container.last_terminated) if t is not None]


def _kill(pod: Pod, container: Container, termination: Termination) -> ContainerKill:
    return ContainerKill(
        namespace=pod.namespace,
        pod=pod.name,
        pod_uid=pod.uid,
        container=container.name,
        node=pod.node_name,
        reason=termination.reason,
        exit_code=termination.exit_code,
        finished_at=termination.finished_at,
        restart_count=container.restart_count,
        ray_node_type=pod.ray_node_type,
        ray_cluster=pod.ray_cluster,
        ray_group=pod.ray_group,
        kernel_oom=termination.reason == OOM_REASON,
    )
