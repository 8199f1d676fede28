"""The dashboard adapter's reads for calibration, against payloads captured from a real Ray 2.60
cluster: free logical resources per node, and each application's ingress deployment."""

from __future__ import annotations

import httpx
import pytest

from integrations.ray.errors import RayBadResponse
from tests.conftest import ReplayRay, ray_fixture


def dashboard(routes: dict):
    replay = ReplayRay(routes)
    return replay.dashboard(), replay


def test_resource_usage_reads_each_node_s_used_and_total_from_cluster_status():
    ray, replay = dashboard({"/api/cluster_status": "cluster_status.json"})
    usage = ray.resource_usage()
    assert list(usage) == ["192.0.2.2"]
    assert usage["192.0.2.2"]["CPU"] == (0.0, 2.0) and usage["192.0.2.2"]["memory"] == (0.0, 17339409204.0)
    assert replay.requests[-1].url.path == "/api/cluster_status"


def test_resource_usage_after_an_oom_shows_the_cpu_still_held():
    ray, _ = dashboard({"/api/cluster_status": "cluster_status_after_oom.json"})
    assert ray.resource_usage()["192.0.2.2"]["CPU"] == (0.5, 2.0)


def test_a_report_without_per_node_figures_falls_back_to_the_cluster_totals():
    status = ray_fixture("cluster_status.json")
    del status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"]
    ray, _ = dashboard({"/api/cluster_status": status})
    assert ray.resource_usage() == {
        "": {
            "objectStoreMemory": (0.0, 7431175372.0),
            "node:192.0.2.2": (0.0, 1.0),
            "memory": (0.0, 17339409204.0),
            "CPU": (0.0, 2.0),
            "node:InternalHead": (0.0, 1.0),
        }
    }


def test_a_cluster_status_that_is_not_json_is_a_bad_response():
    ray, _ = dashboard({"/api/cluster_status": httpx.Response(200, text="<html>")})
    with pytest.raises(RayBadResponse, match="did not answer JSON"):
        ray.resource_usage()


def test_serve_ingresses_names_each_application_s_ingress_deployment():
    ray, _ = dashboard({})
    assert ray.serve_ingresses() == {"demo": "Echo", "echo2": "Echo"}
