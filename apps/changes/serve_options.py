"""Deployment option names across Ray versions, and which options Serve knows at all.

Serve drops unknown fields without a word (a legacy `max_concurrent_queries` on Ray >= 2.10
leaves the default of 5 in force), so a plan never sends a name the cluster's Ray ignores."""

from __future__ import annotations

from functools import lru_cache
from typing import get_args

# Renamed in Ray 2.10: (new name, old name, where it lives).
RENAMES = [
    ("max_ongoing_requests", "max_concurrent_queries", "deployment"),
    ("target_ongoing_requests", "target_num_ongoing_requests_per_replica", "autoscaling_config"),
]
RENAMED_IN = (2, 10)
# Options whose value Serve replaces wholesale: a patch must carry the other keys over.
DICT_OPTIONS = ("ray_actor_options", "autoscaling_config", "user_config")
# Nulls Serve 2.60 takes but does not keep: it runs a default of its own in their place, so the
# effective config could never hold the null a change asked for.
NULL_REPLACED = {
    ("deployment", "num_replicas"): "its default replica count",
    ("ray_actor_options", "num_cpus"): "1 CPU",
}
# Options Ray's effective config leaves out, rather than reporting null, when they are null.
OMITTED_WHEN_NULL = frozenset({"autoscaling_config", "gang_scheduling_config", "deployment_actors"})


class FieldError(ValueError):
    pass


def parse_version(version: str) -> tuple[int, int]:
    try:
        major, minor, *_ = version.split(".")
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return (99, 0)  # unknown versions are treated as current


@lru_cache(maxsize=1)
def known_options() -> dict[str, frozenset[str]]:
    """Field names of Serve's own schema, imported lazily: `ray` is heavy and stays off the
    request path until something needs validating."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import DeploymentSchema

    return {
        "deployment": frozenset(DeploymentSchema.model_fields),
        "autoscaling_config": frozenset(AutoscalingConfig.model_fields),
    }


@lru_cache(maxsize=1)
def null_kept() -> dict[str, frozenset[str]]:
    """Per place, the options whose null Serve's schema accepts and Serve keeps as the value."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import DeploymentSchema, RayActorOptionsSchema

    def nullable(model, where: str) -> frozenset[str]:
        return frozenset(
            name
            for name, info in model.model_fields.items()
            if type(None) in get_args(info.annotation) and (where, name) not in NULL_REPLACED
        )

    return {
        "deployment": nullable(DeploymentSchema, "deployment"),
        "autoscaling_config": nullable(AutoscalingConfig, "autoscaling_config"),
        "ray_actor_options": nullable(RayActorOptionsSchema, "ray_actor_options"),
    }


def unknown_fields(options: dict) -> list[str]:
    """Paths of options Serve 2.60 would drop silently; legacy names are reported as such."""
    known = known_options()
    problems = []
    for key, value in options.items():
        if key not in known["deployment"]:
            problems.append(_explain(key, "deployment"))
        elif key == "autoscaling_config" and isinstance(value, dict):
            for inner in value:
                if inner not in known["autoscaling_config"]:
                    problems.append(_explain(inner, "autoscaling_config"))
    return problems


def without_unknown(options: dict) -> dict:
    """`options` less the names Serve does not know (at the top and inside autoscaling_config):
    Serve drops them, so its effective config never reports them back."""
    known = known_options()
    out = {}
    for key, value in options.items():
        if key not in known["deployment"]:
            continue
        if key == "autoscaling_config" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k in known["autoscaling_config"]}
        out[key] = value
    return out


def unknown_nulls(options: dict) -> list[str]:
    """Paths of names Serve does not know set to null: the one null that removes a key, since
    there is no value of an ignored option to keep (a legacy max_concurrent_queries, say)."""
    known = known_options()
    paths = []
    for key, value in options.items():
        if key not in known["deployment"]:
            if value is None:
                paths.append(key)
        elif key == "autoscaling_config" and isinstance(value, dict):
            paths += [
                f"{key}.{inner}" for inner, v in value.items() if v is None and inner not in known["autoscaling_config"]
            ]
    return paths


def _explain(key: str, where: str) -> str:
    path = key if where == "deployment" else f"{where}.{key}"
    for new, old, home in RENAMES:
        if key == old and where == home:
            return f"{path}: the name before Ray 2.10; use {new!r} (Fleetdeck maps it for older clusters)."
    if where == "autoscaling_config" and key in known_options()["deployment"]:
        return f"{path}: Serve ignores {key!r} inside autoscaling_config; set it on the deployment."
    return f"{path}: not a Serve deployment option; Serve would drop it silently."


def for_version(options: dict, ray_version: str) -> dict:
    """Rename options for a cluster whose Ray predates the 2.10 renames."""
    if parse_version(ray_version) >= RENAMED_IN:
        return options
    mapped = dict(options)
    for new, old, home in RENAMES:
        if home == "deployment" and new in mapped:
            mapped[old] = mapped.pop(new)
        elif home == "autoscaling_config" and isinstance(mapped.get(home), dict) and new in mapped[home]:
            inner = dict(mapped[home])
            inner[old] = inner.pop(new)
            mapped[home] = inner
    return mapped


@lru_cache(maxsize=1)
def autoscaling_defaults() -> dict:
    """Serve's own defaults for autoscaling_config, as the effective config reports them."""
    from ray.serve.config import AutoscalingConfig

    return AutoscalingConfig().model_dump(mode="json")


# Deployment options Serve applies to the running replicas: every DeploymentConfig field whose
# update_type is not HeavyWeight in Ray 2.60 (ray/serve/_private/config.py; a test reads it there).
# Anything else a config entry can change (ray_actor_options, placement groups, max_replicas_per_node)
# starts new replicas, and so does any change of the application's code or runtime_env.
IN_PLACE_OPTIONS = frozenset(
    {
        "num_replicas",
        "max_ongoing_requests",
        "max_queued_requests",
        "backpressure_config",
        "user_config",
        "graceful_shutdown_timeout_s",
        "graceful_shutdown_wait_loop_s",
        "health_check_period_s",
        "health_check_timeout_s",
        "autoscaling_config",
        "request_router_config",
        "logging_config",
        "max_constructor_retry_count",
        "rolling_update_percentage",
        "max_surge_percent",
    }
)
# Application keys that do not touch its replicas when they change.
APP_IN_PLACE = frozenset({"name", "route_prefix", "deployments", "external_scaler_enabled"})


def replaces_replicas(before: dict | None, after: dict | None, application: str) -> bool:
    """Whether going from config `before` to `after` starts new replicas of `application`: a
    changed key outside the options Serve reconfigures in place, on the application or one of its
    deployments. An application that is new or removed, or a config that cannot be read, counts as
    replaced (the cautious answer)."""
    old, new = _application(before, application), _application(after, application)
    if old is None or new is None:
        return True
    if any(old.get(k) != new.get(k) for k in (set(old) | set(new)) - APP_IN_PLACE):
        return True
    old_deployments = {d.get("name"): d for d in old.get("deployments") or []}
    for deployment in new.get("deployments") or []:
        previous = old_deployments.get(deployment.get("name"), {})
        keys = (set(previous) | set(deployment)) - IN_PLACE_OPTIONS - {"name"}
        if any(previous.get(k) != deployment.get(k) for k in keys):
            return True
    return False


def _application(config: dict | None, name: str) -> dict | None:
    if not isinstance(config, dict):
        return None
    return next((a for a in config.get("applications") or [] if isinstance(a, dict) and a.get("name") == name), None)
