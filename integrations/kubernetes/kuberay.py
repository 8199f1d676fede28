"""KubeRay's custom resources (`ray.io/v1`: RayCluster, RayService) as the adapter reads them,
and the RayService's serveConfigV2 parsed into a Serve config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from integrations import plainyaml
from integrations.errors import AdapterError
from integrations.kubernetes.fields import (
    as_dict,
    as_int,
    as_str,
    as_str_dict,
    dicts_in,
    meta_of,
)
from integrations.kubernetes.pods import Container, parse_container


class ServeConfigError(AdapterError, ValueError):
    """A RayService's serveConfigV2 is not a Serve config Fleetdeck can work with."""


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
    spec = as_dict(raw)
    head = spec.get("headGroupSpec")
    return ClusterSpec(
        ray_version=as_str(spec.get("rayVersion")),
        in_tree_autoscaling=spec.get("enableInTreeAutoscaling") is True,
        head=_group(as_dict(head), "head", "head") if isinstance(head, dict) else None,
        workers=tuple(_group(g, as_str(g.get("groupName")), "worker") for g in dicts_in(spec.get("workerGroupSpecs"))),
    )


def _group(raw: dict[str, Any], name: str, node_type: str) -> NodeGroup:
    pod_spec = as_dict(as_dict(raw.get("template")).get("spec"))
    return NodeGroup(
        name=name,
        node_type=node_type,
        ray_start_params=as_str_dict(raw.get("rayStartParams")),
        containers=tuple(parse_container(c, None) for c in dicts_in(pod_spec.get("containers"))),
        replicas=as_int(raw.get("replicas")),
        min_replicas=as_int(raw.get("minReplicas")),
        max_replicas=as_int(raw.get("maxReplicas")),
    )


def parse_raycluster(raw: dict[str, Any]) -> RayCluster:
    meta = meta_of(raw)
    owner = next((o for o in dicts_in(meta.get("ownerReferences")) if o.get("controller") is True), {})
    return RayCluster(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        resource_version=as_str(meta.get("resourceVersion")),
        labels=as_str_dict(meta.get("labels")),
        spec=parse_cluster_spec(raw.get("spec")),
        state=as_str(as_dict(raw.get("status")).get("state")),
        owner_kind=as_str(owner.get("kind")),
        owner_name=as_str(owner.get("name")),
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
        config = plainyaml.load(text)
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
    meta, spec, status = meta_of(raw), as_dict(raw.get("spec")), as_dict(raw.get("status"))
    text = as_str(spec.get("serveConfigV2"))
    try:
        config, error = parse_serve_config_v2(text), ""
    except ServeConfigError as exc:
        config, error = None, str(exc)
    return RayService(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        resource_version=as_str(meta.get("resourceVersion")),
        generation=as_int(meta.get("generation")),
        serve_config_yaml=text,
        serve_config=config,
        serve_config_error=error,
        cluster_spec=parse_cluster_spec(spec.get("rayClusterConfig")),
        status=RayServiceStatus(
            service_status=as_str(status.get("serviceStatus")),
            observed_generation=as_int(status.get("observedGeneration")),
            active=_service_cluster(status.get("activeServiceStatus")),
            pending=_service_cluster(status.get("pendingServiceStatus")),
            conditions=tuple(
                Condition(
                    as_str(c.get("type")), as_str(c.get("status")), as_str(c.get("reason")), as_str(c.get("message"))
                )
                for c in dicts_in(status.get("conditions"))
            ),
        ),
    )


def _service_cluster(raw: Any) -> ServiceClusterStatus:
    raw = as_dict(raw)
    apps = {}
    for name, app in sorted(as_dict(raw.get("applicationStatuses")).items()):
        app = as_dict(app)
        deployments = {
            dep_name: ServeDeploymentStatus(
                dep_name, as_str(as_dict(dep).get("status")), as_str(as_dict(dep).get("message"))
            )
            for dep_name, dep in sorted(as_dict(app.get("serveDeploymentStatuses")).items())
        }
        apps[name] = ServeAppStatus(name, as_str(app.get("status")), as_str(app.get("message")), deployments)
    return ServiceClusterStatus(cluster_name=as_str(raw.get("rayClusterName")), applications=apps)
