"""A real OOM kill on a dedicated Ray cluster whose memory monitor is set to trip just above the
machine's current usage, becoming an incident with the kill evidence and ranked causes."""

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
    cluster = Cluster.objects.create(
        name="oom-lab",
        team=team,
        dashboard_url=oom_head.dashboard_url,
        ray_version="2.60.0",
        metrics_url=f"http://127.0.0.1:{oom_head.ports['metrics-export-port']}/metrics",
    )
    assert sync.sync_cluster(cluster.pk).ok
    statuses = []

    def hog():
        try:
            statuses.append(httpx.get(f"{oom_head.serve_url}/demo?text=big", timeout=60).status_code)
        except httpx.HTTPError as exc:
            statuses.append(type(exc).__name__)

    threading.Thread(target=hog, daemon=True).start()
    deadline = time.monotonic() + 90
    incident_ids: list[int] = []
    while not incident_ids:
        assert time.monotonic() < deadline, f"no OOM kill of the Model seen; client got {statuses}"
        time.sleep(2)
        sync.sync_cluster(cluster.pk)
        # Ray's monitor may kill the Echo replica first (it picks by its own policy, not by who grew);
        # the node stays over the threshold while the Model holds its 4 GiB, so the Model's kill follows.
        touched = services.detect(cluster.pk)
        incident_ids = list(
            Incident.objects.filter(pk__in=touched, deployment_name="Model").values_list("pk", flat=True)
        )

    incident = Incident.objects.get(pk=incident_ids[0])
    print(
        f"\nOOM incident: {incident.title}; causes {[c['id'] for c in incident.causes]}; client saw {statuses}; "
        f"evidence {sorted(incident.evidence)}"
    )
    assert incident.kind == "oom_kill" and (incident.application_name, incident.deployment_name) == ("demo", "Model")
    kill = incident.oom_kills.first()
    assert kill.used_bytes > kill.threshold_bytes and "low on memory" in kill.message
    assert incident.causes[0]["id"] == "OOM-2"  # max_ongoing_requests 8 on the Model
    assert incident.evidence["nodes"] and incident.evidence["settings_at_detection"]["max_ongoing_requests"] == 8
