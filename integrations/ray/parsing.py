"""The Ray dashboard's JSON to payload dataclasses. Pure and lenient (a missing field becomes a
default); tested against captured payloads."""

from __future__ import annotations

from typing import Any

from integrations.ray.payloads import (
    Actor,
    ApplicationStatus,
    AutoscalingDetail,
    DeploymentStatus,
    JobInfo,
    Node,
    Replica,
    ScalingDecision,
    ServeStatus,
)


def parse_serve_status(body: dict[str, Any]) -> ServeStatus:
    controller = body.get("controller_info") or {}
    health = body.get("controller_health_metrics") or {}
    http = body.get("http_options") or {}
    applications = {
        name: _parse_application(name, raw) for name, raw in sorted((body.get("applications") or {}).items())
    }
    return ServeStatus(
        running=bool(controller.get("actor_id")),
        controller_actor_id=str(controller.get("actor_id") or ""),
        controller_start_time=to_float(health.get("controller_start_time")),
        http_port=to_int(http.get("port"), None),
        applications=applications,
        target_capacity=to_float(body.get("target_capacity")),
    )


def _parse_application(name: str, raw: dict[str, Any]) -> ApplicationStatus:
    deployments = {
        dep_name: _parse_deployment(dep_name, dep) for dep_name, dep in sorted((raw.get("deployments") or {}).items())
    }
    config = raw.get("deployed_app_config")
    return ApplicationStatus(
        name=str(raw.get("name") or name),
        status=str(raw.get("status") or "UNKNOWN"),
        message=str(raw.get("message") or ""),
        route_prefix=raw.get("route_prefix"),
        last_deployed_time_s=to_float(raw.get("last_deployed_time_s")),
        deployed_app_config=config if isinstance(config, dict) else None,
        source=str(raw.get("source") or ""),
        deployments=deployments,
        calls=_called_applications(name, raw.get("deployment_topology")),
        external_scaler_enabled=external if isinstance(external := raw.get("external_scaler_enabled"), bool) else None,
    )


def _called_applications(name: str, topology: Any) -> tuple[str, ...]:
    nodes = topology.get("nodes") if isinstance(topology, dict) else None
    called = {
        str(outbound.get("app_name"))
        for node in (nodes or {}).values()
        if isinstance(node, dict)
        for outbound in node.get("outbound_deployments") or []
        if isinstance(outbound, dict) and outbound.get("app_name")
    }
    return tuple(sorted(called - {name}))


def _parse_deployment(name: str, raw: dict[str, Any]) -> DeploymentStatus:
    return DeploymentStatus(
        name=str(raw.get("name") or name),
        status=str(raw.get("status") or "UNKNOWN"),
        status_trigger=str(raw.get("status_trigger") or ""),
        message=str(raw.get("message") or ""),
        deployment_config=raw.get("deployment_config") or {},
        target_num_replicas=to_int(raw.get("target_num_replicas"), None),
        replicas=[_parse_replica(replica) for replica in raw.get("replicas") or []],
        recent_dead_replicas=[_parse_replica(replica) for replica in raw.get("recent_dead_replicas") or []],
        required_resources=_amounts(raw.get("required_resources")),
        autoscaling_detail=_parse_autoscaling(raw.get("autoscaling_detail")),
    )


def _amounts(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    amounts = {str(name): to_float(value) for name, value in raw.items()}
    return {name: value for name, value in sorted(amounts.items()) if value is not None}


def _parse_autoscaling(raw: Any) -> AutoscalingDetail | None:
    if not isinstance(raw, dict):
        return None
    decisions = []
    for item in raw.get("decisions") or []:
        at = to_float(item.get("timestamp_s")) if isinstance(item, dict) else None
        if at is None:
            continue
        decisions.append(
            ScalingDecision(
                timestamp_s=at,
                reason=str(item.get("reason") or ""),
                prev_num_replicas=to_int(item.get("prev_num_replicas"), 0),
                curr_num_replicas=to_int(item.get("curr_num_replicas"), 0),
                policy=str(item.get("policy") or ""),
            )
        )
    return AutoscalingDetail(
        scaling_status=str(raw.get("scaling_status") or "STABLE"),
        decisions=decisions,
        metrics_health=str(raw.get("metrics_health") or "healthy"),
        errors=[str(error) for error in raw.get("errors") or []],
    )


def _parse_replica(raw: dict[str, Any]) -> Replica:
    return Replica(
        replica_id=str(raw.get("replica_id") or ""),
        state=str(raw.get("state") or "UNKNOWN"),
        actor_name=str(raw.get("actor_name") or ""),
        node_ip=str(raw.get("node_ip") or ""),
        pid=to_int(raw.get("pid"), None),
        start_time_s=to_float(raw.get("start_time_s")),
    )


def parse_actor(raw: dict[str, Any]) -> Actor:
    return Actor(
        actor_id=str(raw.get("actor_id") or ""),
        class_name=str(raw.get("class_name") or ""),
        name=str(raw.get("name") or ""),
        state=str(raw.get("state") or "UNKNOWN"),
        pid=to_int(raw.get("pid"), None),
        node_id=str(raw.get("node_id") or ""),
        num_restarts=to_int(raw.get("num_restarts"), 0),
        death_cause=raw.get("death_cause") or None,
        ray_namespace=str(raw.get("ray_namespace") or ""),
    )


def parse_node(raw: dict[str, Any]) -> Node:
    return Node(
        node_id=str(raw.get("node_id") or ""),
        node_ip=str(raw.get("node_ip") or ""),
        is_head_node=bool(raw.get("is_head_node")),
        state=str(raw.get("state") or "UNKNOWN"),
        resources_total={key: float(value) for key, value in (raw.get("resources_total") or {}).items()},
    )


def parse_job(raw: dict[str, Any]) -> JobInfo:
    return JobInfo(
        submission_id=str(raw.get("submission_id") or raw.get("job_id") or ""),
        status=str(raw.get("status") or "UNKNOWN"),
        message=str(raw.get("message") or ""),
        start_time=to_int(raw.get("start_time"), None),
        end_time=to_int(raw.get("end_time"), None),
        entrypoint=str(raw.get("entrypoint") or ""),
        error_type=str(raw.get("error_type") or ""),
        driver_exit_code=to_int(raw.get("driver_exit_code"), None),
    )


def to_int(value: Any, default):
    # The state API sends 64-bit integers as strings.
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def to_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
