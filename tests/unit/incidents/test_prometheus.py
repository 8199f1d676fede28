"""The Prometheus source, replaying answers captured from a real Prometheus scraping Ray."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from apps.clusters.models import Cluster
from apps.incidents import ingest, prometheus_readings
from apps.incidents.models import SignalWindow
from integrations import prometheus, ray_metrics
from tests.factories import ClusterFactory

CAPTURED = Path(__file__).resolve().parents[2] / "fixtures" / "prometheus"


def captured(name: str) -> dict:
    return json.loads((CAPTURED / f"{name}.json").read_text())


EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


def replay(request: httpx.Request) -> httpx.Response:
    """Answer each PromQL the adapter sends with the capture of the same metric, or an empty
    vector (what Prometheus answers for a series that does not exist)."""
    promql = request.url.params["query"]
    if "ray_serve_http_" in promql or "ray_serve_num_http_" in promql:
        return httpx.Response(200, json=EMPTY)  # the capture has no proxy series
    for marker, name in (
        ("histogram_quantile(0.99", "latency_p99"),
        ("ray_serve_deployment_request_counter_total", "requests_rate"),
        ("ray_serve_replica_processing_queries", "ongoing"),
        ("ray_node_mem_used", "node_memory"),
    ):
        if marker in promql:
            fixture = captured(name)
            return httpx.Response(fixture["status"], json=fixture["body"])
    if "ray_node_mem_total" in promql:
        body = json.loads(json.dumps(captured("node_memory")["body"]))
        for item in body["data"]["result"]:
            item["value"][1] = "1"
        return httpx.Response(200, json=body)
    return httpx.Response(200, json=EMPTY)


def test_a_reading_from_prometheus_has_latency_rates_and_nodes():
    reading = prometheus_readings.read(
        "http://prom.test:9090", 'cluster="local-demo"', transport=httpx.MockTransport(replay)
    )
    model = reading.deployments[("demo", "Model")]
    assert round(model.p99_ms, 1) == 99.6 and model.p50_ms is None
    assert round(model.requests / reading.seconds, 2) == 29.28
    assert reading.deployments[("demo", "Echo")].ongoing == 4
    node = reading.nodes["192.0.2.2"]
    assert 0 < node.mem_fraction < 1 and reading.warnings == []
    assert reading.applications == {}  # no proxy series: no client figures, rather than zeros


def test_every_query_carries_the_clusters_selector():
    seen = []

    def record(request):
        seen.append(request.url.params["query"])
        return replay(request)

    prometheus_readings.read("http://prom.test:9090", 'cluster="local-demo"', transport=httpx.MockTransport(record))
    assert seen and all('{cluster="local-demo"}' in q for q in seen)


def test_prometheus_refusing_a_query_says_why():
    fixture = captured("bad_query")
    with pytest.raises(ray_metrics.MetricsUnavailable, match="unclosed left parenthesis") as caught:
        prometheus.query(
            "http://prom.test:9090",
            "sum by (",
            transport=httpx.MockTransport(lambda r: httpx.Response(fixture["status"], json=fixture["body"])),
        )
    assert not caught.value.transient


def test_prometheus_down_or_not_prometheus():
    def refuse(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(ray_metrics.MetricsUnavailable) as caught:
        prometheus.query("http://prom.test:9090", "up", transport=httpx.MockTransport(refuse))
    assert caught.value.transient
    with pytest.raises(ray_metrics.MetricsUnavailable, match="did not answer Prometheus JSON"):
        prometheus.query(
            "http://prom.test:9090", "up", transport=httpx.MockTransport(lambda r: httpx.Response(200, text="<html>"))
        )


def test_prometheus_timing_out_or_answering_part_of_the_result_says_which():
    def slow(request):
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ray_metrics.MetricsUnavailable, match="did not answer in time") as caught:
        prometheus.query("http://prom.test:9090", "up", transport=httpx.MockTransport(slow))
    assert caught.value.transient
    # Thanos's answer when a store is down and partial responses are allowed: data, and a warning.
    partial = {**captured("requests_rate")["body"], "warnings": ["No StoreAPIs matched for this query"]}
    with pytest.raises(ray_metrics.MetricsUnavailable, match=r"partial result \(No StoreAPIs matched") as caught:
        prometheus_readings.read(
            "http://prom.test:9090",
            'cluster="local-demo"',
            transport=httpx.MockTransport(lambda r: httpx.Response(200, json=partial)),
        )
    assert caught.value.transient


def test_a_selector_that_matches_nothing_is_a_visible_warning():
    reading = prometheus_readings.read(
        "http://prom.test:9090",
        'cluster="typo"',
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=EMPTY)),
    )
    assert reading.deployments == {} and "check it matches" in reading.warnings[0]


@pytest.mark.django_db
def test_a_cluster_with_prometheus_reads_it_instead_of_scraping(team, monkeypatch):
    cluster = ClusterFactory(
        name="p", team=team, prometheus_url="http://prom.test:9090", prometheus_selector='cluster="local-demo"'
    )
    real_read = prometheus_readings.read
    monkeypatch.setattr(
        ingest.prometheus_readings,
        "read",
        lambda url, selector, **kwargs: real_read(url, selector, **kwargs, transport=httpx.MockTransport(replay)),
    )
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda *a, **k: pytest.fail("must not scrape"))

    assert ingest.collect_metrics(cluster.pk) == []

    window = SignalWindow.objects.get(cluster=cluster, application_name="demo", deployment_name="Model")
    assert window.points[-1]["rps"] == pytest.approx(29.276, abs=0.01)


@pytest.mark.django_db
def test_a_malformed_selector_is_refused():
    from django.core.exceptions import ValidationError

    field = Cluster._meta.get_field("prometheus_selector")
    with pytest.raises(ValidationError):
        field.run_validators('cluster="x"}')
    field.run_validators('cluster="x", env=~"prod|staging"')
