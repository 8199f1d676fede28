"""Typed views of the Kubernetes and KubeRay objects Fleetdeck reads, and the pure functions that
build them from the API server's JSON. Parsing is lenient (a missing field becomes a default) so
one odd object cannot hide the others; the adapter rejects only what is not an object at all.

Field names follow the KubeRay v1 CRDs (`ray.io/v1`: RayCluster, RayService), core v1 (Pod,
Event), `autoscaling/v2` (HorizontalPodAutoscaler) and KEDA `keda.sh/v1alpha1` (ScaledObject).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

# KubeRay's labels on every pod it creates.
LABEL_NODE_TYPE = "ray.io/node-type"
LABEL_CLUSTER = "ray.io/cluster"
LABEL_GROUP = "ray.io/group"

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")


class ServeConfigError(ValueError):
    """A RayService's serveConfigV2 is not a Serve config Fleetdeck can work with."""


def parse_quantity(value: Any) -> float | None:
    """A Kubernetes resource quantity ('8Gi', '500m', '1e9', 2) as a number; None when unset or invalid."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
        if suffix[:1] in ("e", "E"):
            return float(amount * (Decimal(10) ** int(suffix[1:])))
        return float(amount * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]))
    except (InvalidOperation, ValueError):
        return None


def parse_time(value: Any) -> datetime | None:
    """RFC 3339 (metav1.Time and MicroTime); None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


# --- pods ----------------------------------------------------------------------------------


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
    meta, spec, status = _meta(raw), _dict(raw.get("spec")), _dict(raw.get("status"))
    statuses = {str(s.get("name")): s for s in _dicts(status.get("containerStatuses"))}
    return Pod(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid")),
        labels=_str_dict(meta.get("labels")),
        node_name=_str(spec.get("nodeName")),
        phase=_str(status.get("phase")),
        pod_ip=_str(status.get("podIP")),
        start_time=parse_time(status.get("startTime")),
        deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
        deletion_grace_period_s=_int(meta.get("deletionGracePeriodSeconds")),
        termination_grace_period_s=_int(spec.get("terminationGracePeriodSeconds")),
        finalizers=tuple(_str(f) for f in _list(meta.get("finalizers"))),
        containers=tuple(_container(c, statuses.get(_str(c.get("name")))) for c in _dicts(spec.get("containers"))),
    )


def _container(spec: dict[str, Any], status: dict[str, Any] | None) -> Container:
    resources = _dict(spec.get("resources"))
    status = status or {}
    state_name, state = next(iter(_dict(status.get("state")).items()), ("", {}))
    last = _dict(_dict(status.get("lastState")).get("terminated"))
    return Container(
        name=_str(spec.get("name")),
        image=_str(spec.get("image")),
        requests=_str_dict(resources.get("requests")),
        limits=_str_dict(resources.get("limits")),
        restart_count=_int(status.get("restartCount")) or 0,
        ready=status.get("ready") if isinstance(status.get("ready"), bool) else None,
        state=_str(state_name),
        state_reason=_str(_dict(state).get("reason")),
        terminated=_termination(_dict(state)) if state_name == "terminated" else None,
        last_terminated=_termination(last) if last else None,
    )


def _termination(raw: dict[str, Any]) -> Termination:
    return Termination(
        reason=_str(raw.get("reason")),
        exit_code=_int(raw.get("exitCode")),
        signal=_int(raw.get("signal")),
        started_at=parse_time(raw.get("startedAt")),
        finished_at=parse_time(raw.get("finishedAt")),
        message=_str(raw.get("message"))[:2000],
    )


# --- RayCluster and RayService -------------------------------------------------------------


@dataclass(frozen=True)
class NodeGroup:
    """The head group or one worker group of a RayCluster spec."""

    name: str
    node_type: str  # head | worker
    ray_start_params: dict[str, str]
    containers: tuple[Container, ...]
    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None

    @property
    def ray_container(self) -> Container | None:
        return self.containers[0] if self.containers else None


@dataclass(frozen=True)
class ClusterSpec:
    ray_version: str
    in_tree_autoscaling: bool
    head: NodeGroup | None
    workers: tuple[NodeGroup, ...]

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        return ((self.head,) if self.head else ()) + self.workers


@dataclass(frozen=True)
class RayCluster:
    namespace: str
    name: str
    uid: str
    resource_version: str
    labels: dict[str, str]
    spec: ClusterSpec
    state: str
    owner_kind: str = ""
    owner_name: str = ""

    @property
    def rayservice(self) -> str:
        """The RayService that owns this cluster (KubeRay sets itself as controller), or ''."""
        return self.owner_name if self.owner_kind == "RayService" else ""


def parse_cluster_spec(raw: Any) -> ClusterSpec:
    spec = _dict(raw)
    head = spec.get("headGroupSpec")
    return ClusterSpec(
        ray_version=_str(spec.get("rayVersion")),
        in_tree_autoscaling=spec.get("enableInTreeAutoscaling") is True,
        head=_group(_dict(head), "head", "head") if isinstance(head, dict) else None,
        workers=tuple(_group(g, _str(g.get("groupName")), "worker") for g in _dicts(spec.get("workerGroupSpecs"))),
    )


def _group(raw: dict[str, Any], name: str, node_type: str) -> NodeGroup:
    pod_spec = _dict(_dict(raw.get("template")).get("spec"))
    return NodeGroup(
        name=name,
        node_type=node_type,
        ray_start_params=_str_dict(raw.get("rayStartParams")),
        containers=tuple(_container(c, None) for c in _dicts(pod_spec.get("containers"))),
        replicas=_int(raw.get("replicas")),
        min_replicas=_int(raw.get("minReplicas")),
        max_replicas=_int(raw.get("maxReplicas")),
    )


def parse_raycluster(raw: dict[str, Any]) -> RayCluster:
    meta = _meta(raw)
    owner = next((o for o in _dicts(meta.get("ownerReferences")) if o.get("controller") is True), {})
    return RayCluster(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid")),
        resource_version=_str(meta.get("resourceVersion")),
        labels=_str_dict(meta.get("labels")),
        spec=parse_cluster_spec(raw.get("spec")),
        state=_str(_dict(raw.get("status")).get("state")),
        owner_kind=_str(owner.get("kind")),
        owner_name=_str(owner.get("name")),
    )


@dataclass(frozen=True)
class ServeDeploymentStatus:
    name: str
    status: str
    message: str


@dataclass(frozen=True)
class ServeAppStatus:
    name: str
    status: str
    message: str
    deployments: dict[str, ServeDeploymentStatus]


@dataclass(frozen=True)
class ServiceClusterStatus:
    """`status.activeServiceStatus` or `status.pendingServiceStatus` of a RayService."""

    cluster_name: str
    applications: dict[str, ServeAppStatus]


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class RayServiceStatus:
    service_status: str  # the deprecated summary ('Running'); newer KubeRay reports conditions
    observed_generation: int | None
    active: ServiceClusterStatus
    pending: ServiceClusterStatus
    conditions: tuple[Condition, ...] = ()

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def ready(self) -> bool:
        ready = self.condition("Ready")
        if ready is not None:
            return ready.status == "True"
        return self.service_status == "Running"

    @property
    def upgrading(self) -> bool:
        upgrade = self.condition("UpgradeInProgress")
        if upgrade is not None:
            return upgrade.status == "True"
        return bool(self.pending.cluster_name)


@dataclass(frozen=True)
class RayService:
    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int | None
    serve_config_yaml: str
    # None with `serve_config_error` set when serveConfigV2 is empty or malformed.
    serve_config: dict[str, Any] | None
    serve_config_error: str
    cluster_spec: ClusterSpec
    status: RayServiceStatus

    @property
    def observed(self) -> bool:
        """KubeRay has reconciled the current spec (its status describes this generation)."""
        return self.generation is not None and (self.status.observed_generation or 0) >= self.generation


def parse_serve_config_v2(text: str) -> dict[str, Any]:
    """serveConfigV2 as a dict; ServeConfigError when it is not a multi-application Serve config."""
    if not text or not text.strip():
        raise ServeConfigError("serveConfigV2 is empty: the RayService deploys no Serve applications.")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        raise ServeConfigError(
            f"serveConfigV2 is not valid YAML{line}: {getattr(exc, 'problem', None) or exc}"
        ) from exc
    if not isinstance(config, dict):
        raise ServeConfigError(f"serveConfigV2 is a YAML {type(config).__name__}, not a mapping with 'applications'.")
    if not isinstance(config.get("applications"), list):
        raise ServeConfigError("serveConfigV2 has no 'applications' list (KubeRay needs the multi-application format).")
    for index, app in enumerate(config["applications"]):
        if not isinstance(app, dict) or not isinstance(app.get("name"), str) or not app.get("name"):
            raise ServeConfigError(f"serveConfigV2 application #{index + 1} has no name.")
    return config


def parse_rayservice(raw: dict[str, Any]) -> RayService:
    meta, spec, status = _meta(raw), _dict(raw.get("spec")), _dict(raw.get("status"))
    text = _str(spec.get("serveConfigV2"))
    try:
        config, error = parse_serve_config_v2(text), ""
    except ServeConfigError as exc:
        config, error = None, str(exc)
    return RayService(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid")),
        resource_version=_str(meta.get("resourceVersion")),
        generation=_int(meta.get("generation")),
        serve_config_yaml=text,
        serve_config=config,
        serve_config_error=error,
        cluster_spec=parse_cluster_spec(spec.get("rayClusterConfig")),
        status=RayServiceStatus(
            service_status=_str(status.get("serviceStatus")),
            observed_generation=_int(status.get("observedGeneration")),
            active=_service_cluster(status.get("activeServiceStatus")),
            pending=_service_cluster(status.get("pendingServiceStatus")),
            conditions=tuple(
                Condition(_str(c.get("type")), _str(c.get("status")), _str(c.get("reason")), _str(c.get("message")))
                for c in _dicts(status.get("conditions"))
            ),
        ),
    )


def _service_cluster(raw: Any) -> ServiceClusterStatus:
    raw = _dict(raw)
    apps = {}
    for name, app in sorted(_dict(raw.get("applicationStatuses")).items()):
        app = _dict(app)
        deployments = {
            dep_name: ServeDeploymentStatus(dep_name, _str(_dict(dep).get("status")), _str(_dict(dep).get("message")))
            for dep_name, dep in sorted(_dict(app.get("serveDeploymentStatuses")).items())
        }
        apps[name] = ServeAppStatus(name, _str(app.get("status")), _str(app.get("message")), deployments)
    return ServiceClusterStatus(cluster_name=_str(raw.get("rayClusterName")), applications=apps)


# --- events and autoscalers ----------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    namespace: str
    name: str
    type: str  # Normal | Warning
    reason: str
    message: str
    involved_kind: str
    involved_name: str
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    source: str


def parse_event(raw: dict[str, Any]) -> Event:
    meta, involved = _meta(raw), _dict(raw.get("involvedObject"))
    series = _dict(raw.get("series"))
    first = parse_time(raw.get("firstTimestamp")) or parse_time(raw.get("eventTime"))
    last = parse_time(raw.get("lastTimestamp")) or parse_time(series.get("lastObservedTime")) or first
    source = _dict(raw.get("source"))
    return Event(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        type=_str(raw.get("type")),
        reason=_str(raw.get("reason")),
        message=_str(raw.get("message"))[:2000],
        involved_kind=_str(involved.get("kind")),
        involved_name=_str(involved.get("name")),
        count=_int(raw.get("count")) or _int(series.get("count")) or 1,
        first_seen=first,
        last_seen=last,
        source=_str(source.get("component")) or _str(raw.get("reportingComponent")),
    )


@dataclass(frozen=True)
class ScaleTarget:
    api_version: str
    kind: str
    name: str

    @property
    def group(self) -> str:
        return self.api_version.split("/", 1)[0] if "/" in self.api_version else ""


@dataclass(frozen=True)
class HorizontalPodAutoscaler:
    namespace: str
    name: str
    target: ScaleTarget
    min_replicas: int | None
    max_replicas: int | None
    current_replicas: int | None
    desired_replicas: int | None


def parse_hpa(raw: dict[str, Any]) -> HorizontalPodAutoscaler:
    meta, spec, status = _meta(raw), _dict(raw.get("spec")), _dict(raw.get("status"))
    return HorizontalPodAutoscaler(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        target=_target(spec.get("scaleTargetRef")),
        min_replicas=_int(spec.get("minReplicas")),
        max_replicas=_int(spec.get("maxReplicas")),
        current_replicas=_int(status.get("currentReplicas")),
        desired_replicas=_int(status.get("desiredReplicas")),
    )


@dataclass(frozen=True)
class ScaledObject:
    namespace: str
    name: str
    target: ScaleTarget
    min_replicas: int | None
    max_replicas: int | None
    triggers: tuple[str, ...]
    paused: bool


def parse_scaled_object(raw: dict[str, Any]) -> ScaledObject:
    meta, spec = _meta(raw), _dict(raw.get("spec"))
    annotations = _str_dict(meta.get("annotations"))
    return ScaledObject(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        # KEDA defaults the target to a Deployment in the ScaledObject's namespace.
        target=_target(spec.get("scaleTargetRef"), default_kind="Deployment", default_api_version="apps/v1"),
        min_replicas=_int(spec.get("minReplicaCount")),
        max_replicas=_int(spec.get("maxReplicaCount")),
        triggers=tuple(_str(t.get("type")) for t in _dicts(spec.get("triggers"))),
        paused=annotations.get("autoscaling.keda.sh/paused") == "true"
        or "autoscaling.keda.sh/paused-replicas" in annotations,
    )


def _target(raw: Any, default_kind: str = "", default_api_version: str = "") -> ScaleTarget:
    raw = _dict(raw)
    return ScaleTarget(
        api_version=_str(raw.get("apiVersion")) or default_api_version,
        kind=_str(raw.get("kind")) or default_kind,
        name=_str(raw.get("name")),
    )


# --- lenient accessors ---------------------------------------------------------------------


def _meta(raw: dict[str, Any]) -> dict[str, Any]:
    return _dict(raw.get("metadata"))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in _list(value) if isinstance(item, dict)]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _str_dict(value: Any) -> dict[str, str]:
    return {str(k): _str(v) for k, v in _dict(value).items()}


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
