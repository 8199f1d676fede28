"""What the Ray dashboard reports, as plain frozen dataclasses (the Serve REST API, the state API,
the node summary and the Jobs API)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

JOB_FINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


@dataclass(frozen=True)
class VersionInfo:
    ray_version: str
    ray_commit: str
    session_name: str


@dataclass(frozen=True)
class Replica:
    replica_id: str
    state: str
    actor_name: str
    node_ip: str
    pid: int | None
    start_time_s: float | None


@dataclass(frozen=True)
class ScalingDecision:
    timestamp_s: float
    reason: str
    prev_num_replicas: int
    curr_num_replicas: int
    policy: str = ""


@dataclass(frozen=True)
class AutoscalingDetail:
    """Serve's `autoscaling_detail` of a deployment (alpha in 2.60: its schema exists, but the
    controller of the 2.60.0 wheel never fills it, so the dashboard leaves the key out)."""

    scaling_status: str  # UPSCALING, DOWNSCALING, STABLE
    decisions: list[ScalingDecision]
    metrics_health: str  # healthy, delayed, unavailable
    errors: list[str]


@dataclass(frozen=True)
class DeploymentStatus:
    name: str
    status: str
    status_trigger: str
    message: str
    deployment_config: dict[str, Any]
    target_num_replicas: int | None
    replicas: list[Replica]
    recent_dead_replicas: list[Replica]
    # What Ray reserves per replica (its `resource_dict`: CPU, GPU, memory, custom resources).
    required_resources: dict[str, float] = field(default_factory=dict)
    autoscaling_detail: AutoscalingDetail | None = None

    @property
    def replica_states(self) -> dict[str, int]:
        return dict(sorted(Counter(replica.state for replica in self.replicas).items()))


@dataclass(frozen=True)
class ApplicationStatus:
    name: str
    status: str
    message: str
    route_prefix: str | None
    last_deployed_time_s: float | None
    deployed_app_config: dict[str, Any] | None
    source: str
    deployments: dict[str, DeploymentStatus]
    # Other applications this one's replicas hold handles to, as Serve's deployment topology reports
    # them: handles passed in at bind time and those the replicas created when they started.
    calls: tuple[str, ...] = ()
    # Whether an outside scaler sets the replica counts (Ray 2.60's ApplicationDetails); None
    # where the dashboard does not report it (an older Ray).
    external_scaler_enabled: bool | None = None


@dataclass(frozen=True)
class ServeStatus:
    """What `GET /api/serve/applications/` reports. `running` is False when Serve is not started."""

    running: bool
    controller_actor_id: str
    controller_start_time: float | None
    http_port: int | None
    applications: dict[str, ApplicationStatus] = field(default_factory=dict)
    target_capacity: float | None = None


@dataclass(frozen=True)
class Actor:
    actor_id: str
    class_name: str
    name: str
    state: str
    pid: int | None
    node_id: str
    num_restarts: int
    death_cause: dict[str, Any] | None
    ray_namespace: str


@dataclass(frozen=True)
class Node:
    node_id: str
    node_ip: str
    is_head_node: bool
    state: str
    resources_total: dict[str, float]


@dataclass(frozen=True)
class NodeMemory:
    node_ip: str
    total_bytes: int
    available_bytes: int


@dataclass(frozen=True)
class JobInfo:
    """One submitted job, as `GET /api/jobs/{id}` reports it. Times are Ray's: milliseconds since
    the epoch, None until the job starts or ends."""

    submission_id: str
    status: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    message: str
    start_time: int | None
    end_time: int | None
    entrypoint: str
    error_type: str = ""
    driver_exit_code: int | None = None

    @property
    def is_final(self) -> bool:
        return self.status in JOB_FINAL_STATUSES


@dataclass(frozen=True)
class StatePage:
    total: int  # entities matching the filters among those Ray looked at
    truncated: bool  # Ray stopped at the limit: more may exist
    items: list
