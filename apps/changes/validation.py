"""Validation of deployment options, shared by presets, plans, forms and serializers."""

from __future__ import annotations

from typing import Any

import yaml
from django.core.exceptions import ValidationError

from apps.changes.serve_options import NULL_REPLACED, known_options, null_kept, unknown_fields, unknown_nulls
from apps.core import yamltext

MAX_PATCH_CHARS = 64_000


def preset_or_options(preset, options):
    """The options a change or rollout applies: a preset's or the given ones, never both, so
    what is recorded as applied is what runs. Empty options count as none: nothing to change."""
    if preset is not None and options:
        raise ValidationError("Give a preset or options, not both.", code="preset_or_options")
    if preset is None and not options:
        raise ValidationError(
            "Give a preset or the options to change (e.g. max_ongoing_requests: 4): there is nothing to apply.",
            code="preset_or_options",
        )
    return dict(preset.options) if preset is not None else options


def parse_options_text(text: str) -> dict:
    """Options typed as YAML or JSON (JSON is YAML)."""
    value = _load_yaml(text, "options")
    if not isinstance(value, dict):
        raise ValidationError("The options must be a mapping of option: value, e.g. 'max_ongoing_requests: 2'.")
    return value


def parse_yaml_text(text: str, kind: type, what: str):
    """A value of `kind` (a mapping or a list) typed as YAML or JSON."""
    value = _load_yaml(text, what)
    if not isinstance(value, kind):
        raise ValidationError(f"The {what} must be a {'mapping' if kind is dict else 'list'}.")
    return value


def _load_yaml(text: str, what: str):
    if len(text or "") > MAX_PATCH_CHARS:
        raise ValidationError(f"The {what} are longer than {MAX_PATCH_CHARS} characters.")
    try:
        return yamltext.load(text or "")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = (getattr(exc, "problem", None) or str(exc)).rstrip(".")
        raise ValidationError(f"Invalid YAML/JSON{where}: {problem}.") from exc


def validate_options(options: Any) -> dict:
    """Refuse anything Serve would refuse or silently drop, with one message per problem."""
    if not isinstance(options, dict) or not options:
        raise ValidationError("Give at least one deployment option as a mapping.")
    if "name" in options:
        raise ValidationError("'name' is not an option: the targets say which deployments change.")
    removals = unknown_nulls(options)
    problems = [p for p in unknown_fields(options) if p.split(":", 1)[0] not in removals]
    nulls = null_problems(options)
    problems += nulls
    # A refused null is explained once, above, not again in pydantic's words.
    problems += serve_schema_errors(_without_nulls(options) if nulls else options)
    problems += conflicts(options)
    if problems:
        raise ValidationError(problems)
    return options


def null_problems(options: dict) -> list[str]:
    """Nulls a change could not do: a null is sent as null (never as a removal), so it must be one
    Serve accepts and keeps, which its effective config then reports back. user_config reaches the
    deployment verbatim, so any null inside it is the deployment's business. Names Serve does not
    know are left to `unknown_fields`."""
    kept, known = null_kept(), known_options()
    problems = []
    for key, value in options.items():
        if value is None and key in known["deployment"] and key not in kept["deployment"]:
            problems.append(_null_refused(key, "deployment", key))
        elif isinstance(value, dict) and key in ("autoscaling_config", "ray_actor_options"):
            for inner, inner_value in value.items():
                path = f"{key}.{inner}"
                unknown = key == "autoscaling_config" and inner not in known["autoscaling_config"]
                if inner_value is None and inner not in kept[key] and not unknown:
                    problems.append(_null_refused(path, key, inner))
                elif isinstance(inner_value, dict) and _has_null(inner_value):
                    problems.append(
                        f"{path}: Serve takes no null inside it. A null is sent as null, never as a removal."
                    )
    return problems


def _null_refused(path: str, where: str, name: str) -> str:
    replaced = NULL_REPLACED.get((where, name))
    why = f"Serve runs {replaced} in place of a null" if replaced else "Serve refuses null here"
    return f"{path}: {why}. A null is sent as null, never as a removal: give a value."


def _has_null(value: dict) -> bool:
    return any(v is None or (isinstance(v, dict) and _has_null(v)) for v in value.values())


def _without_nulls(options: dict) -> dict:
    return {
        key: (_without_nulls(value) if isinstance(value, dict) and key != "user_config" else value)
        for key, value in options.items()
        if value is not None
    }


def serve_schema_errors(options: dict) -> list[str]:
    from ray.serve.schema import DeploymentSchema

    return schema_errors(DeploymentSchema, name="fleetdeck-validation", **options)


def schema_errors(schema, **fields) -> list[str]:
    """What one of Serve's own pydantic schemas says of `fields`, one line per error, at its path."""
    from pydantic import ValidationError as PydanticError

    try:
        schema(**fields)
    except PydanticError as exc:
        return [
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" if error["loc"] else error["msg"]
            for error in exc.errors()
        ]
    except (TypeError, ValueError) as exc:
        return [str(exc)]
    return []


def conflicts(options: dict) -> list[str]:
    found = []
    autoscaling = options.get("autoscaling_config")
    replicas = options.get("num_replicas")
    if isinstance(autoscaling, dict) and isinstance(replicas, int):
        found.append(
            "num_replicas and autoscaling_config exclude each other: Serve refuses a fixed count with autoscaling."
        )
    if isinstance(autoscaling, dict):
        target = autoscaling.get("target_ongoing_requests")
        cap = options.get("max_ongoing_requests")
        if _number(target) and _number(cap) and cap < target:
            found.append(
                f"max_ongoing_requests ({cap}) is below autoscaling_config.target_ongoing_requests ({target}): "
                "replicas can never reach the load the autoscaler waits for, so it never scales up."
            )
        low, high = autoscaling.get("min_replicas"), autoscaling.get("max_replicas")
        if _number(low) and _number(high) and low > high:
            found.append(f"autoscaling_config.min_replicas ({low}) is above max_replicas ({high}).")
    return found


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
