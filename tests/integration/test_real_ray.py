"""Fleetdeck against a real Ray 2.60 head on loopback running real Serve applications."""

from __future__ import annotations

import copy

import httpx
import pytest

from apps.clusters.models import Cluster
from apps.core import redaction
from apps.fleet import sync
from apps.fleet.models import Application, ConfigRevision, Deployment
from integrations.ray.dashboard import RayDashboard
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def ray_says(head) -> dict:
    """Ray's own answer, read without Fleetdeck's adapter."""
    return httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()


def register_and_sync(api_as, head) -> Cluster:
    response = api_as("admin").post(
        "/api/v1/clusters/",
        {"name": "local", "team": "vision", "dashboard_url": head.dashboard_url, "labels": {"env": "test"}},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["ray_version"] == "2.60.0"
    assert body["auth_mode"] == "disabled"
    outcome = sync.sync_cluster(body["id"])
    assert outcome.ok, outcome.error
    return Cluster.objects.get(pk=body["id"])


def test_what_fleetdeck_shows_matches_what_ray_reports(api_as, ray_head):
    cluster = register_and_sync(api_as, ray_head)
    truth = ray_says(ray_head)

    assert cluster.serve_running and cluster.serve_http_port == ray_head.serve_http_port
    apps = {a["name"]: a for a in api_as("viewer").get(f"/api/v1/applications/?cluster={cluster.pk}").json()["results"]}
    assert set(apps) == set(truth["applications"]) == {"demo", "echo2"}
    for name, app in truth["applications"].items():
        assert apps[name]["status"] == app["status"] == "RUNNING"
        assert apps[name]["route_prefix"] == app["route_prefix"]
        # The API shows each env var's value as a keyed placeholder; the rest is Ray's config as it is.
        assert apps[name]["deployed_app_config"] == redaction.redact_config(app["deployed_app_config"])
        for dep_name, dep in app["deployments"].items():
            row = Deployment.objects.get(application__cluster=cluster, application__name=name, name=dep_name)
            assert row.status == dep["status"]
            assert row.effective_config == dep["deployment_config"]
            assert row.max_ongoing_requests == dep["deployment_config"]["max_ongoing_requests"]
            assert row.running_replicas == sum(1 for r in dep["replicas"] if r["state"] == "RUNNING")
            assert row.target_replicas == dep["target_num_replicas"]
    model = Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")
    assert (model.max_ongoing_requests, model.max_queued_requests) == (8, 100)
    assert model.autoscaling_target_ongoing_requests == 4
    assert ConfigRevision.objects.filter(cluster=cluster).count() == 2


def test_a_config_change_on_the_cluster_becomes_a_revision_and_a_removed_app_is_marked(api_as, ray_head):
    cluster = register_and_sync(api_as, ray_head)
    changed = copy.deepcopy(two_app_config())
    model = next(d for d in changed["applications"][0]["deployments"] if d["name"] == "Model")
    model["max_ongoing_requests"] = 3
    changed["applications"] = changed["applications"][:1]  # drop echo2
    try:
        ray_head.deploy(changed)
        ray_head_wait_gone(ray_head, "echo2")
        outcome = sync.sync_cluster(cluster.pk)

        assert outcome.ok and outcome.revisions == 1
        demo = Application.objects.get(cluster=cluster, name="demo")
        assert demo.deployments.get(name="Model").max_ongoing_requests == 3
        diff = api_as("viewer").get(f"/api/v1/config-revisions/{demo.revisions.first().pk}/diff/").json()["diff"]
        assert any(line.strip() == '+      "max_ongoing_requests": 3,' for line in diff)
        assert Application.objects.get(cluster=cluster, name="echo2").removed_at is not None
    finally:
        ray_head.deploy(two_app_config())


def ray_head_wait_gone(head, name: str, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while name in ray_says(head)["applications"]:
        assert time.monotonic() < deadline, f"{name} still listed"
        time.sleep(0.5)


def test_the_adapter_reads_the_state_api_of_a_live_cluster(ray_head):
    with RayDashboard(ray_head.dashboard_url) as ray:
        replicas = ray.list_actors(filters=[("ray_namespace", "=", "serve"), ("state", "=", "ALIVE")])
        nodes = ray.list_nodes()
        version = ray.version()
        mode = ray.authentication_mode()

    names = {actor.name.split("#")[1] for actor in replicas.items if actor.name.startswith("SERVE_REPLICA::")}
    assert names == {"Echo", "Model"}
    assert any(actor.name == "SERVE_CONTROLLER_ACTOR" for actor in replicas.items)
    assert all(actor.state == "ALIVE" for actor in replicas.items)
    assert len(nodes.items) == 1 and nodes.items[0].is_head_node and nodes.items[0].resources_total["CPU"] == 2.0
    assert version.ray_version == "2.60.0" and mode == "disabled"


def test_an_unchanged_live_cluster_syncs_without_inventory_writes(api_as, ray_head):
    cluster = register_and_sync(api_as, ray_head)
    outcome = sync.sync_cluster(cluster.pk)
    assert outcome.ok and outcome.writes == 0 and outcome.revisions == 0
