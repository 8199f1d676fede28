"""Pods, as the adapter reads them (core v1), with the labels KubeRay puts on the pods it creates."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from integrations.kubernetes.fields import (
    as_dict,
    as_int,
    as_list,
    as_str,
    as_str_dict,
    dicts_in,
    meta_of,
    parse_quantity,
    parse_time,
)

# KubeRay's labels on every pod it creates.
LABEL_NODE_TYPE = "ray.io/node-type"
LABEL_CLUSTER = "ray.io/cluster"
LABEL_GROUP = "ray.io/group"

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


@dataclass(frozen=True)
class Termination:
    reason: str
    exit_code: int | None
    signal: int | None
    started_at: datetime | None
    finished_at: datetime | None
    message: str


@dataclass(frozen=True)
class Container:
    """A container of a pod, or of a pod template (then the status fields keep their defaults).
    Resources keep the API's own strings; the properties give numbers (bytes, cores, devices)."""

    name: str
    image: str
    requests: dict[str, str]
    limits: dict[str, str]
    restart_count: int = 0
    ready: bool | None = None
    state: str = ""  # running | waiting | terminated
    state_reason: str = ""  # CrashLoopBackOff, OOMKilled, ...
    terminated: Termination | None = None  # the current state, when it is terminated
    last_terminated: Termination | None = None

    @property
    def memory_request_bytes(self) -> float | None:
        # As for CPU: the API server defaults a missing request to the limit when it creates the pod.
        return parse_quantity(self.requests.get("memory", self.limits.get("memory")))

    @property
    def memory_limit_bytes(self) -> float | None:
        return parse_quantity(self.limits.get("memory"))

    @property
    def cpu_request_cores(self) -> float | None:
        # The API server defaults a missing request to the limit when it creates the pod.
        return parse_quantity(self.requests.get("cpu", self.limits.get("cpu")))

    @property
    def gpu_limit(self) -> float:
        return sum(parse_quantity(self.limits.get(name)) or 0.0 for name in GPU_RESOURCES)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    labels: dict[str, str]
    node_name: str
    phase: str
    pod_ip: str
    start_time: datetime | None
    # Set by the API server to the request time plus the grace period: SIGKILL is due at this time.
    deletion_timestamp: datetime | None
    deletion_grace_period_s: int | None
    termination_grace_period_s: int | None
    finalizers: tuple[str, ...]
    containers: tuple[Container, ...]

    @property
    def ray_node_type(self) -> str:
        return self.labels.get(LABEL_NODE_TYPE, "")

    @property
    def ray_cluster(self) -> str:
        return self.labels.get(LABEL_CLUSTER, "")

    @property
    def ray_group(self) -> str:
        return self.labels.get(LABEL_GROUP, "")

    @property
    def is_ray_node(self) -> bool:
        return self.ray_node_type in ("head", "worker")

    @property
    def ray_container(self) -> Container | None:
        # KubeRay runs Ray in the first container of the template; the rest are sidecars.
        return self.containers[0] if self.is_ray_node and self.containers else None


def parse_pod(raw: dict[str, Any]) -> Pod:
    meta, spec, status = meta_of(raw), as_dict(raw.get("spec")), as_dict(raw.get("status"))
    statuses = {str(s.get("name")): s for s in dicts_in(status.get("containerStatuses"))}
    return Pod(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        labels=as_str_dict(meta.get("labels")),
        node_name=as_str(spec.get("nodeName")),
        phase=as_str(status.get("phase")),
        pod_ip=as_str(status.get("podIP")),
        start_time=parse_time(status.get("startTime")),
        deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
        deletion_grace_period_s=as_int(meta.get("deletionGracePeriodSeconds")),
        termination_grace_period_s=as_int(spec.get("terminationGracePeriodSeconds")),
        finalizers=tuple(as_str(f) for f in as_list(meta.get("finalizers"))),
        containers=tuple(
            parse_container(c, statuses.get(as_str(c.get("name")))) for c in dicts_in(spec.get("containers"))
        ),
    )


def parse_container(spec: dict[str, Any], status: dict[str, Any] | None) -> Container:
    resources = as_dict(spec.get("resources"))
    status = status or {}
    state_name, state = next(iter(as_dict(status.get("state")).items()), ("", {}))
    last = as_dict(as_dict(status.get("lastState")).get("terminated"))
    return Container(
        name=as_str(spec.get("name")),
        image=as_str(spec.get("image")),
        requests=as_str_dict(resources.get("requests")),
        limits=as_str_dict(resources.get("limits")),
        restart_count=as_int(status.get("restartCount")) or 0,
        ready=status.get("ready") if isinstance(status.get("ready"), bool) else None,
        state=as_str(state_name),
        state_reason=as_str(as_dict(state).get("reason")),
        terminated=parse_termination(as_dict(state)) if state_name == "terminated" else None,
        last_terminated=parse_termination(last) if last else None,
    )


def parse_termination(raw: dict[str, Any]) -> Termination:
    return Termination(
        reason=as_str(raw.get("reason")),
        exit_code=as_int(raw.get("exitCode")),
        signal=as_int(raw.get("signal")),
        started_at=parse_time(raw.get("startedAt")),
        finished_at=parse_time(raw.get("finishedAt")),
        message=as_str(raw.get("message"))[:2000],
    )
