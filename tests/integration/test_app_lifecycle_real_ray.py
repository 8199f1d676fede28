"""Deploying and deleting whole applications through the push protocol, on a real Ray 2.60 head
running two applications: the others' replicas are never restarted (same replica ids)."""

from __future__ import annotations

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from apps.demo.local_ray import DEMO_APP_DIR
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


@pytest.fixture
def cluster(ray_head, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 60
    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    yield Cluster.objects.create(name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0")


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"], via="api")


def ray_apps(head) -> dict:
    return httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()["applications"]


def replica_ids(head) -> dict[str, set[str]]:
    """{application: the replica ids of all its deployments}."""
    return {
        name: {r["replica_id"] for dep in app["deployments"].values() for r in dep["replicas"]}
        for name, app in ray_apps(head).items()
    }


def steps(change: Change) -> str:
    return "\n".join(step.message for step in change.steps.all())


def new_app(import_path: str) -> dict:
    return {
        "name": "echo3",
        "route_prefix": "/echo3",
        "import_path": import_path,
        "runtime_env": {"env_vars": {"PYTHONPATH": str(DEMO_APP_DIR), "DEPLOYED_BY": "fleetdeck"}},
        "deployments": [
            {"name": "Echo", "num_replicas": 1, "max_ongoing_requests": 7, "user_config": {"greeting": "hello"}}
        ],
    }


def run(operator, change: Change, confirm: str | None = None) -> Change:
    protocol.request_apply(operator, change, confirm=confirm)
    protocol.run(change.pk)
    change.refresh_from_db()
    return change


def test_deploy_then_delete_an_application_leaves_the_others_replicas_alone(cluster, operator, ray_head):
    before = replica_ids(ray_head)
    assert set(before) == {"demo", "echo2"} and all(before.values())

    created = run(
        operator, protocol.plan_create_app(operator, cluster, app=new_app("demo_app:echo_only"), reason="new route")
    )

    assert created.state == ChangeState.SUCCEEDED, steps(created)
    apps = ray_apps(ray_head)
    assert apps["echo3"]["status"] == "RUNNING"
    effective = apps["echo3"]["deployments"]["Echo"]["deployment_config"]
    assert (effective["max_ongoing_requests"], effective["user_config"]) == (7, {"greeting": "hello"})
    after_create = replica_ids(ray_head)
    assert {name: after_create[name] for name in before} == before

    delete = protocol.plan_delete_app(operator, cluster, application="echo3", reason="route retired")
    with pytest.raises(protocol.ConfirmationMismatch):
        protocol.request_apply(operator, delete, confirm="echo2")
    deleted = run(operator, delete, confirm="echo3")

    assert deleted.state == ChangeState.SUCCEEDED, steps(deleted)
    assert "echo3" not in ray_apps(ray_head)
    assert replica_ids(ray_head) == before


def test_an_import_path_that_does_not_import_is_rolled_back_with_rays_message(cluster, operator, ray_head):
    before = replica_ids(ray_head)

    change = run(
        operator,
        protocol.plan_create_app(operator, cluster, app=new_app("no_such_module_xyz:app"), reason="typo"),
    )

    assert change.state == ChangeState.ROLLED_BACK, steps(change)
    assert "echo3 is DEPLOY_FAILED" in change.error
    assert "No module named 'no_such_module_xyz'" in change.error
    assert "echo3 was removed" in steps(change)
    assert "echo3" not in ray_apps(ray_head)
    assert replica_ids(ray_head) == before
    assert {app["name"] for app in two_app_config()["applications"]} == set(ray_apps(ray_head))
