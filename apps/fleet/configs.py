"""Pure functions over Serve config payloads: hashing, key settings, readable diffs."""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def key_settings(effective: dict[str, Any]) -> dict[str, Any]:
    """The settings an operator scans first, flattened from an effective deployment config."""
    autoscaling = effective.get("autoscaling_config") or None
    actor_options = effective.get("ray_actor_options") or {}
    return {
        "max_ongoing_requests": _num(effective.get("max_ongoing_requests"), int),
        "max_queued_requests": _num(effective.get("max_queued_requests"), int),
        "autoscaling_min_replicas": _num(autoscaling.get("min_replicas"), int) if autoscaling else None,
        "autoscaling_max_replicas": _num(autoscaling.get("max_replicas"), int) if autoscaling else None,
        "autoscaling_target_ongoing_requests": (
            _num(autoscaling.get("target_ongoing_requests"), float) if autoscaling else None
        ),
        "num_cpus": _num(actor_options.get("num_cpus"), float),
        "num_gpus": _num(actor_options.get("num_gpus"), float),
    }


def submitted_deployment(deployed_app_config: dict[str, Any] | None, name: str) -> dict[str, Any]:
    for deployment in (deployed_app_config or {}).get("deployments") or []:
        if isinstance(deployment, dict) and deployment.get("name") == name:
            return deployment
    return {}


def application_revision(deployed_app_config: dict[str, Any] | None, effective: dict[str, dict]) -> dict[str, Any]:
    """What a config revision stores: the submitted app config and each deployment's effective config."""
    return {"submitted": deployed_app_config or {}, "effective": dict(sorted(effective.items()))}


def pretty(value: Any) -> list[str]:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def unified_diff(old: Any, new: Any, *, old_label: str = "before", new_label: str = "after") -> list[str]:
    return list(difflib.unified_diff(pretty(old), pretty(new), fromfile=old_label, tofile=new_label, lineterm="", n=3))


def _num(value: Any, kind):
    if value is None or isinstance(value, bool):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None
