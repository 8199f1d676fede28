"""Autoscalers of a Ray cluster's pods: HorizontalPodAutoscalers (`autoscaling/v2`) and KEDA
ScaledObjects (`keda.sh/v1alpha1`), as the adapter reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from integrations.kubernetes.fields import (
    as_dict,
    as_int,
    as_str,
    as_str_dict,
    dicts_in,
    meta_of,
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
    meta, spec, status = meta_of(raw), as_dict(raw.get("spec")), as_dict(raw.get("status"))
    return HorizontalPodAutoscaler(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        target=_target(spec.get("scaleTargetRef")),
        min_replicas=as_int(spec.get("minReplicas")),
        max_replicas=as_int(spec.get("maxReplicas")),
        current_replicas=as_int(status.get("currentReplicas")),
        desired_replicas=as_int(status.get("desiredReplicas")),
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
    meta, spec = meta_of(raw), as_dict(raw.get("spec"))
    annotations = as_str_dict(meta.get("annotations"))
    return ScaledObject(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        # KEDA defaults the target to a Deployment in the ScaledObject's namespace.
        target=_target(spec.get("scaleTargetRef"), default_kind="Deployment", default_api_version="apps/v1"),
        min_replicas=as_int(spec.get("minReplicaCount")),
        max_replicas=as_int(spec.get("maxReplicaCount")),
        triggers=tuple(as_str(t.get("type")) for t in dicts_in(spec.get("triggers"))),
        paused=annotations.get("autoscaling.keda.sh/paused") == "true"
        or "autoscaling.keda.sh/paused-replicas" in annotations,
    )


def _target(raw: Any, default_kind: str = "", default_api_version: str = "") -> ScaleTarget:
    raw = as_dict(raw)
    return ScaleTarget(
        api_version=as_str(raw.get("apiVersion")) or default_api_version,
        kind=as_str(raw.get("kind")) or default_kind,
        name=as_str(raw.get("name")),
    )
