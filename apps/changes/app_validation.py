"""Validation of a new Serve application's config, before it is planned: Fleetdeck's own checks
first, each with a message that says what to change, then Serve's schema on the whole config.

Some mistakes Serve's PUT accepts with a 200 and only reports seconds later as DEPLOY_FAILED (a
route prefix without its leading slash, an import path that does not import); the first is
caught here, the second cannot be (the code lives on the cluster, not here) and is left to
verification, which rolls the new application back with Ray's message."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

from django.core.exceptions import ValidationError

from apps.changes.validation import schema_errors, validate_options

# Every key a Serve application config may carry: Serve drops any other without a word.
APPLICATION_KEYS = frozenset(
    {
        "name",
        "route_prefix",
        "import_path",
        "runtime_env",
        "args",
        "deployments",
        "logging_config",
        "autoscaling_policy",
        "external_scaler_enabled",
    }
)
# Serve takes a local path in working_dir and py_modules only as a URI ("local://" for a directory on
# every node): a plain path is refused by its schema with a pydantic message, explained here instead.
URI_FIELDS = ("working_dir",)
MAX_NAME = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def validate_application(app: Any) -> dict:
    """The application config as it will be pushed, or a ValidationError listing every problem."""
    if not isinstance(app, dict):
        raise ValidationError("The application must be a mapping: name, route_prefix, import_path, ….")
    problems = [
        f"{key}: Serve does not know this application field and would drop it silently."
        for key in sorted(set(app) - APPLICATION_KEYS)
    ]
    problems += _name_problems(app.get("name"))
    if not isinstance(app.get("import_path"), str) or not app["import_path"].strip():
        problems.append("import_path: give the module and attribute of the application, e.g. 'my_app.main:app'.")
    problems += route_prefix_problems(app.get("route_prefix", "/"))
    problems += _runtime_env_problems(app.get("runtime_env", {}))
    if not isinstance(app.get("args", {}), dict):
        problems.append("args: give a mapping of argument: value, passed to the application's builder.")
    problems += _deployment_problems(app.get("deployments", []))
    if problems:
        raise ValidationError(problems)
    problems = serve_application_errors(app)
    if problems:
        raise ValidationError(problems)
    return app


def _name_problems(name: Any) -> list[str]:
    if not isinstance(name, str) or not name:
        return ["name: every application needs a name."]
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        return [
            f"name: {name!r} is not an application name Fleetdeck manages: up to {MAX_NAME} letters, digits, "
            "'_', '-' or '.', starting with a letter or digit."
        ]
    return []


def route_prefix_problems(prefix: Any) -> list[str]:
    """Serve's own rules for a route prefix, which its PUT does not check (the application then
    goes DEPLOY_FAILED); None means the application takes no HTTP traffic."""
    if prefix is None:
        return []
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        return [f"route_prefix: {prefix!r} must start with '/', e.g. '/{str(prefix).lstrip('/')}'."]
    if prefix != "/" and prefix.endswith("/"):
        return [f"route_prefix: {prefix!r} must not end with '/' (only '/' itself may)."]
    if "{" in prefix or "}" in prefix:
        return [f"route_prefix: {prefix!r} may not contain '{{' or '}}'."]
    return []


def _runtime_env_problems(env: Any) -> list[str]:
    if not isinstance(env, dict):
        return ["runtime_env: give a mapping (working_dir, pip, env_vars, …)."]
    problems = []
    for key in URI_FIELDS:
        value = env.get(key)
        if value is not None and not (isinstance(value, str) and urlparse(value).scheme):
            problems.append(
                f"runtime_env.{key}: {value!r} is not a URI. Serve's config takes a remote URI (s3://, gs://, "
                "https://….zip) or local:// for a directory that exists on every node, never a plain path."
            )
    env_vars = env.get("env_vars", {})
    if not isinstance(env_vars, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
    ):
        problems.append("runtime_env.env_vars: give a mapping of names to strings (quote numbers: '1').")
    pip = env.get("pip")
    if pip is not None and not (
        (isinstance(pip, list) and all(isinstance(p, str) for p in pip)) or isinstance(pip, (dict, str))
    ):
        problems.append("runtime_env.pip: give a list of requirements, e.g. ['requests==2.32.3'].")
    return problems


def _deployment_problems(deployments: Any) -> list[str]:
    if not isinstance(deployments, list):
        return ["deployments: give a list of {name, options…}, one per deployment whose options you set."]
    problems, seen = [], set()
    for index, entry in enumerate(deployments):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            problems.append(f"deployments[{index}]: each entry needs the deployment's name.")
            continue
        if name in seen:
            problems.append(f"deployments[{index}]: {name} is listed twice.")
        seen.add(name)
        options = {k: v for k, v in entry.items() if k != "name"}
        if options:
            try:
                validate_options(options)
            except ValidationError as exc:
                problems += [f"deployments.{name}: {message}" for message in exc.messages]
    return problems


def serve_application_errors(app: dict) -> list[str]:
    from ray.serve.schema import ServeApplicationSchema

    return schema_errors(ServeApplicationSchema, **app)
