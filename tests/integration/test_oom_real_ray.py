"""A real OOM kill on a dedicated Ray cluster whose memory monitor is set to trip just above the
machine's current usage, becoming an incident with the kill evidence and ranked causes: on a
cluster whose metrics Fleetdeck scrapes, and on one it reads through a real Prometheus."""

from __future__ import annotations

import copy
import threading
import time

import httpx
import pytest

from apps.clusters.models import Cluster
from apps.demo.local_ray import LocalRayHead, memory_monitor_env, threshold_for_headroom
from apps.fleet import sync
from apps.incidents import services
from apps.incidents.models import Incident
from tests.conftest import two_app_config
from tests.integration import prometheus_server

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


@pytest.fixture(scope="module")
def oom_head():
    # Room for the cluster itself and the demo (~1.5 GiB), then a request that fills 4 GiB trips it.
    head = LocalRayHead.start(extra_env=memory_monitor_env(threshold_for_headroom(2.5)))
    try:
        head.wait_ready()
        config = copy.deepcopy(two_app_config())
        config["applications"] = config["applications"][:1]
        model = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")
        model["user_config"] = {"alloc_mb": 4096, "hold_s": 20}
        head.deploy(config)
        yield head
    finally:
        head.stop()


def test_a_real_oom_kill_becomes_an_incident_with_its_evidence(oom_head, team):
    metrics_port = oom_head.ports["metrics-export-port"]
    cluster = Cluster.objects.create(
        name="oom-lab",
        team=team,
        dashboard_url=oom_head.dashboard_url,
        ray_version="2.60.0",
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
    )
    prom = prometheus_server.start(f"127.0.0.1:{metrics_port}")
    via_prom = Cluster.objects.create(
        name="oom-lab-prometheus",
        team=team,
        dashboard_url=oom_head.dashboard_url,
        ray_version="2.60.0",
        prometheus_url=prom.url,
        prometheus_selector=prometheus_server.SELECTOR,
    )
    try:
        incidents = _kill_and_detect(oom_head, cluster, via_prom)
    finally:
        prom.stop()

    for incident in incidents:
        print(
            f"\n{incident.cluster.name}: {incident.title}; causes {[c['id'] for c in incident.causes]}; "
            f"evidence {sorted(incident.evidence)}: nodes {incident.evidence.get('nodes')}"
        )
        assert incident.kind == "oom_kill"
        assert (incident.application_name, incident.deployment_name) == ("demo", "Model")
        kill = incident.oom_kills.first()
        assert kill.used_bytes > kill.threshold_bytes and "low on memory" in kill.message
        assert incident.causes[0]["id"] == "OOM-2"  # max_ongoing_requests 8 on the Model
        assert incident.evidence["settings_at_detection"]["max_ongoing_requests"] == 8
        # The nodes' memory, from the cluster's own source: its endpoint, or the Prometheus.
        assert "metrics_warning" not in incident.evidence, incident.evidence["metrics_warning"]
        [node] = incident.evidence["nodes"]
        assert node["ip"] == "127.0.0.1" and 0 < node["memory_used_fraction"] < 1
    scraped, read_through_prometheus = incidents
    assert [c["id"] for c in scraped.causes] == [c["id"] for c in read_through_prometheus.causes]


def _kill_and_detect(head, *clusters: Cluster) -> list[Incident]:
    """Send the request that fills 4 GiB and sync and detect until every cluster has the Model's OOM incident."""
    for cluster in clusters:
        assert sync.sync_cluster(cluster.pk).ok
    statuses = []

    def hog():
        try:
            statuses.append(httpx.get(f"{head.serve_url}/demo?text=big", timeout=60).status_code)
        except httpx.HTTPError as exc:
            statuses.append(type(exc).__name__)

    threading.Thread(target=hog, daemon=True).start()
    deadline = time.monotonic() + 90
    found: dict[int, Incident] = {}
    while len(found) < len(clusters):
        assert time.monotonic() < deadline, f"no OOM kill of the Model seen on every cluster; client got {statuses}"
        time.sleep(2)
        for cluster in clusters:
            if cluster.pk in found:
                continue
            sync.sync_cluster(cluster.pk)
            # Ray's monitor may kill the Echo replica first (it picks by its own policy, not by who grew);
            # the node stays over the threshold while the Model holds its 4 GiB, so the Model's kill follows.
            touched = services.detect(cluster.pk)
            model = Incident.objects.filter(pk__in=touched, deployment_name="Model").first()
            if model:
                found[cluster.pk] = model
    print(f"\nthe client saw {statuses}")
    return [found[cluster.pk] for cluster in clusters]
