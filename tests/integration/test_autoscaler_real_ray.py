"""A replica no node can place, on a real Ray 2.60 head: Serve leaves it STARTING, the sync reads
the node's free resources, and the finding names the missing CPU. Prints how long it took from the
replica's start (Ray's own start_time_s) to the finding."""

from __future__ import annotations

import time

import pytest

from apps.demo.local_ray import DEMO_APP_DIR, OWN_HEAD, LocalRayHead
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.remediation.models import Finding
from integrations.ray.dashboard import RayDashboard

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

WAITING_S = 5


@pytest.fixture(scope="module")
def bare_head():
    head = LocalRayHead.start(num_cpus=2)
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()


def test_a_replica_asking_for_more_cpus_than_the_node_has_becomes_a_finding(bare_head, api_as, settings):
    settings.FLEETDECK_WAITING_REPLICA_S = WAITING_S
    registered = api_as("admin").post(
        "/api/v1/clusters/",
        {"name": "small", "team": "vision", "dashboard_url": bare_head.dashboard_url},
        format="json",
    )
    assert registered.status_code == 201, registered.content
    cluster_id = registered.json()["id"]
    config = {
        "http_options": {"host": "127.0.0.1", "port": bare_head.serve_http_port},
        "applications": [
            {
                "name": "huge",
                "route_prefix": "/huge",
                "import_path": "demo_app:echo_only",
                "runtime_env": {"env_vars": {"PYTHONPATH": str(DEMO_APP_DIR)}},
                "deployments": [{"name": "Echo", "num_replicas": 1, "ray_actor_options": {"num_cpus": 4}}],
            }
        ],
    }
    pushed_at = time.time()
    with RayDashboard(bare_head.dashboard_url, timeout_s=10, policy=OWN_HEAD) as ray:
        ray.put_serve_applications(config)

    finding = None
    deadline = time.monotonic() + 90
    while finding is None and time.monotonic() < deadline:
        assert sync.sync_and_announce([cluster_id])[0].ok
        finding = Finding.objects.filter(cluster_id=cluster_id, rule="replicas-unschedulable").first()
        if finding is None:
            time.sleep(1)
    assert finding is not None, "no finding within 90 s of the push"
    found_at = time.time()

    dep = Deployment.objects.get(application__cluster_id=cluster_id, application__name="huge", name="Echo")
    assert dep.waiting_replicas == 1 and dep.running_replicas == 0 and dep.target_replicas == 1
    assert dep.required_resources == {"CPU": 4.0}
    assert finding.evidence["missing"]["CPU"] >= 2.0  # the node has 2 CPUs at most
    assert "A replica asks for 4 CPU" in finding.message and "CPU short" in finding.message
    waited = found_at - dep.waiting_since_s
    print(
        f"\nreplica STARTING to finding: {waited:.1f} s (threshold {WAITING_S} s, syncs 1 s apart); "
        f"push to finding: {found_at - pushed_at:.1f} s"
    )
    assert WAITING_S <= waited < WAITING_S + 30
