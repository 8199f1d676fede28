"""What the planner tests share: the live cluster as `parse_serve_status` of a captured payload,
targets, and readers of a planned config."""

from __future__ import annotations

import json

from integrations.ray.parsing import parse_serve_status
from tests.conftest import ray_fixture

CURRENT = "2.60.0"
OLD_RAY = "2.9.3"


def payload(name: str = "serve_applications_two_apps.json") -> dict:
    return ray_fixture(name)


def live(name: str = "serve_applications_two_apps.json"):
    return parse_serve_status(payload(name))


def target(application: str, deployment: str) -> list[dict]:
    return [{"application": application, "deployment": deployment}]


def submitted_entry(raw: dict, application: str, deployment: str) -> dict:
    """The deployment entry of a raw payload's deployed_app_config (for editing a copy)."""
    entries = raw["applications"][application]["deployed_app_config"]["deployments"]
    return next(entry for entry in entries if entry["name"] == deployment)


def planned_entry(config: dict, application: str, deployment: str) -> dict:
    app = next(app for app in config["applications"] if app["name"] == application)
    return next(entry for entry in app["deployments"] if entry["name"] == deployment)


def planned_app(config: dict, application: str) -> dict:
    return next(app for app in config["applications"] if app["name"] == application)


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True)


def before_push(serve):
    """Deploy stamps from before a push: older than what the cluster now reports."""
    return {name: stamp - 10 for name, stamp in deploy_times(serve).items()}


def deploy_times(serve) -> dict[str, float | None]:
    return {name: app.last_deployed_time_s for name, app in serve.applications.items()}
