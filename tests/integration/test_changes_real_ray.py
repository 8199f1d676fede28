"""The push protocol against a real Ray 2.60 cluster running two applications."""

from __future__ import annotations

import copy

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState, Preset
from apps.clusters.models import Cluster
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
MODEL = [{"application": "demo", "deployment": "Model"}]


@pytest.fixture
def cluster(ray_head, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 90
    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    yield Cluster.objects.create(name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0")
    # Leave the shared cluster as the other tests expect it.
    ray_head.deploy(two_app_config())


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"], via="api")


def ray_apps(head) -> dict:
    return httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()["applications"]


def replica_ids(head, app: str) -> set[str]:
    return {r["actor_id"] for dep in ray_apps(head)[app]["deployments"].values() for r in dep["replicas"]}


def steps(change: Change) -> str:
    return "\n".join(step.message for step in change.steps.all())


def test_the_heavy_preset_changes_one_deployment_and_leaves_the_other_application_alone(cluster, operator, ray_head):
    echo2_before = replica_ids(ray_head, "echo2")
    echo_before = {r["actor_id"] for r in ray_apps(ray_head)["demo"]["deployments"]["Echo"]["replicas"]}
    change = protocol.plan_change(
        operator,
        cluster,
        targets=MODEL,
        preset=Preset.objects.get(slug="heavy-gpu-model"),
        reason="OOM kills under bursts",
    )
    protocol.request_apply(operator, change)

    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, steps(change)
    effective = ray_apps(ray_head)["demo"]["deployments"]["Model"]["deployment_config"]
    assert effective["max_ongoing_requests"] == 2 and effective["max_queued_requests"] == 16
    auto = effective["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"], auto["target_ongoing_requests"]) == (2, 8, 1)
    assert (auto["upscale_delay_s"], auto["downscale_delay_s"]) == (5, 90)
    # Carried over, not lost: the dict options were merged into the effective ones.
    assert effective["user_config"] == {"alloc_mb": 0, "hold_s": 0.05}
    assert effective["ray_actor_options"]["num_cpus"] == 0.2
    assert replica_ids(ray_head, "echo2") == echo2_before
    assert {r["actor_id"] for r in ray_apps(ray_head)["demo"]["deployments"]["Echo"]["replicas"]} == echo_before


def test_drift_between_plan_and_apply_stops_the_change_and_shows_it(cluster, operator, ray_head):
    change = protocol.plan_change(operator, cluster, targets=MODEL, options={"max_ongoing_requests": 6}, reason="tune")
    drifted = copy.deepcopy(two_app_config())
    drifted["applications"][1]["deployments"][0]["user_config"] = {"greeting": "changed behind Fleetdeck's back"}
    ray_head.deploy(drifted)
    protocol.request_apply(operator, change)

    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.DRIFTED
    assert any("changed behind Fleetdeck's back" in line for line in change.drift)
    assert ray_apps(ray_head)["demo"]["deployments"]["Model"]["deployment_config"]["max_ongoing_requests"] == 8


def test_a_change_that_fails_the_deploy_is_rolled_back_automatically(cluster, operator, ray_head):
    change = protocol.plan_change(
        operator, cluster, targets=MODEL, options={"user_config": {"alloc_mb": "lots"}}, reason="break it on purpose"
    )
    protocol.request_apply(operator, change)

    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.ROLLED_BACK, steps(change)
    assert "Rolling back" in steps(change)
    demo = ray_apps(ray_head)["demo"]
    assert demo["status"] == "RUNNING"
    assert demo["deployments"]["Model"]["deployment_config"]["user_config"] == {"alloc_mb": 0, "hold_s": 0.05}


def test_a_second_change_on_the_same_cluster_is_refused_while_one_is_active(cluster, operator):
    first = protocol.plan_change(operator, cluster, targets=MODEL, options={"max_ongoing_requests": 6}, reason="one")
    second = protocol.plan_change(operator, cluster, targets=MODEL, options={"max_ongoing_requests": 5}, reason="two")
    protocol.request_apply(operator, first)

    with pytest.raises(protocol.ChangeBusy, match="already in progress"):
        protocol.request_apply(operator, second)

    second.refresh_from_db()
    assert second.state == ChangeState.PLANNED
