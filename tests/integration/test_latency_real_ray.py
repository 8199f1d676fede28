"""A real latency spike: a slow handler under a burst on a live cluster becomes a latency
incident from Ray's own metrics (read every ~10 s, Ray's export interval)."""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import httpx
import pytest

from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents import ingest
from apps.incidents.models import Incident
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


def test_a_slow_handler_under_a_burst_becomes_a_latency_incident(ray_head, team):
    config = copy.deepcopy(two_app_config())
    model = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")
    model["user_config"] = {"alloc_mb": 0, "hold_s": 1.5}
    model["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 4}
    ray_head.deploy(config)
    cluster = Cluster.objects.create(
        name="slow",
        team=team,
        dashboard_url=ray_head.dashboard_url,
        ray_version="2.60.0",
        metrics_url=f"http://127.0.0.1:{ray_head.ports['metrics-export-port']}/metrics",
    )
    stop = threading.Event()

    def burst():
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.get(f"{ray_head.serve_url}/demo?text=slow")

    workers = [threading.Thread(target=burst, daemon=True) for _ in range(24)]
    try:
        sync.sync_cluster(cluster.pk)
        ingest.collect_metrics(cluster.pk)  # the base reading
        for worker in workers:
            worker.start()
        # Each replica exports its histograms on its own ~10 s clock, so the ingress can cross the
        # limit a reading before the model behind it does: read until the model's spike is recorded.
        deadline, incident_ids = time.monotonic() + 120, set()
        while not Incident.objects.filter(
            pk__in=incident_ids, deployment_name="Model", kind=Incident.Kind.LATENCY_SPIKE
        ).exists():
            seen = list(Incident.objects.filter(pk__in=incident_ids).values_list("deployment_name", "kind"))
            assert time.monotonic() < deadline, f"no latency incident for Model; recorded: {seen}"
            time.sleep(11)
            sync.sync_cluster(cluster.pk)
            incident_ids.update(ingest.collect_metrics(cluster.pk))
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
        ray_head.deploy(two_app_config())

    incidents = {
        i.deployment_name: i for i in Incident.objects.filter(pk__in=incident_ids, kind=Incident.Kind.LATENCY_SPIKE)
    }
    for incident in incidents.values():
        last = incident.evidence["series"][-1]
        print(
            f"\n{incident.title}: {incident.evidence['summary']} causes {[c['id'] for c in incident.causes]} "
            f"(in flight {last['ongoing']}, queued {last['queued']}, starts {last['starts']})"
        )
    model = incidents["Model"]
    assert model.evidence["peak_p99_ms"] > 1500
    # One replica capped at 8 in flight under 24 clients: the queue, or the replica start that the
    # redeploy caused just before, comes first.
    assert model.causes[0]["id"] in ("LAT-2", "LAT-1")
    assert "LAT-2" in [c["id"] for c in model.causes]
