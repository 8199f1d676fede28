"""A cluster configured with only a Prometheus (the setup recommended for large fleets) gets what
one with a metrics URL gets: the clients' figures of a change and the metrics evidence of an OOM
incident, read as raw series through the Prometheus adapter and differenced like two scrapes."""

from __future__ import annotations

import re

import httpx
import pytest

from apps.fleet import client_impact, sync
from apps.incidents import services
from apps.incidents.models import Incident
from integrations import prometheus, ray_metrics
from integrations.ray_metrics import Scrape
from tests.factories import ClusterFactory
from tests.unit.changes.test_client_impact import proxy
from tests.unit.incidents.test_incidents import DEAD, metrics

SELECTOR = 'cluster="gpu-prod"'
# The labels a Prometheus adds to every series it scrapes from Ray's export port.
TARGET = {"cluster": "gpu-prod", "instance": "10.0.0.5:8080", "job": "ray"}


def number(value: float) -> str:
    """A sample value as Prometheus writes it (Go's FormatFloat 'f', -1): 423, not 423.0."""
    return str(int(value)) if value.is_integer() else repr(value)


def answer_from(scrape: Scrape, request: httpx.Request) -> httpx.Response:
    """Prometheus's answer to `{__name__=~"a|b", cluster="gpu-prod"}`: the latest sample of every
    matching series, each with its name and the target's labels."""
    promql = request.url.params["query"]
    names = set(re.search(r'__name__=~"([^"]*)"', promql).group(1).split("|"))
    at = float(request.url.params["time"])
    result = [
        {"metric": {"__name__": s.name, **s.labels, **TARGET}, "value": [at, number(s.value)]}
        for s in scrape.samples
        if s.name in names
    ]
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture
def prom(monkeypatch):
    """The Prometheus adapter's answers: the queued scrapes' series in order, then connection refused."""
    queued: list[Scrape] = []
    seen: list[str] = []

    def handle(request):
        seen.append(request.url.params["query"])
        if not queued:
            raise httpx.ConnectError("connection refused")
        return answer_from(queued.pop(0), request)

    monkeypatch.setattr(prometheus, "PinnedTransport", lambda: httpx.MockTransport(handle))
    monkeypatch.setattr(ray_metrics, "scrape", lambda *a, **k: pytest.fail("must not scrape Ray's endpoint"))
    return queued, seen


@pytest.mark.django_db
def test_a_change_on_a_prometheus_only_cluster_measures_its_clients(team, prom):
    queued, seen = prom
    cluster = ClusterFactory(name="c", team=team, prometheus_url="http://prom.test:9090", prometheus_selector=SELECTOR)
    queued[:] = [proxy(100.0, ok=500), proxy(140.0, ok=780, failed={"500": 3})]

    opened = client_impact.opening(cluster)
    impact = client_impact.closing(cluster, opened, settle_s=0)

    assert opened["source"] == "prometheus"
    assert impact["measured"] and (impact["requests"], impact["failed"]) == (283, 3)
    assert impact["by_application"]["demo"]["by_code"] == {"500": 3}
    assert (
        seen
        == [
            '{__name__=~"ray_serve_num_http_error_requests_total|ray_serve_num_http_requests_total", '
            'cluster="gpu-prod"}'
        ]
        * 2
    )


@pytest.mark.django_db
def test_a_prometheus_that_fails_is_named_as_the_source_that_failed(team, prom):
    cluster = ClusterFactory(name="c", team=team, prometheus_url="http://prom.test:9090", prometheus_selector=SELECTOR)
    opened = client_impact.opening(cluster)
    assert opened["why"].startswith("Prometheus: Cannot reach Prometheus at http://prom.test:9090")
    assert client_impact.closing(cluster, opened, settle_s=0)["why"] == opened["why"]


@pytest.mark.django_db
def test_counters_of_two_sources_are_not_compared(team, prom):
    queued, _ = prom
    cluster = ClusterFactory(name="c", team=team, prometheus_url="http://prom.test:9090", prometheus_selector=SELECTOR)
    queued[:] = [proxy(100.0, ok=500)]
    opened = client_impact.opening(cluster)
    cluster.prometheus_url, cluster.metrics_url = "", "http://ray.test:8080/metrics"
    impact = client_impact.closing(cluster, opened, settle_s=0)
    assert impact == {
        "measured": False,
        "why": "the cluster's metrics source changed meanwhile; its counters cannot be compared.",
    }


@pytest.mark.django_db
def test_an_oom_incident_on_a_prometheus_only_cluster_has_its_metrics_evidence(team, use_replay, prom):
    queued, seen = prom
    use_replay.routes["/api/serve/applications/"] = "serve_applications_oom_t1_modelonly_after_recovery.json"
    use_replay.routes["/api/v0/actors"] = DEAD
    cluster = ClusterFactory(
        name="gpu-prod", team=team, prometheus_url="http://prom.test:9090", prometheus_selector=SELECTOR
    )
    assert sync.sync_cluster(cluster.pk).ok
    queued.append(metrics("metrics_after_oom_kills_filtered.prom"))

    [incident_id] = services.detect(cluster.pk)

    evidence = Incident.objects.get(pk=incident_id).evidence
    # The same figures as the direct scrape of the same series (test_incidents.py).
    assert evidence["out_of_memory_errors"] == {"demo/Echo": 1.0}
    [node] = evidence["nodes"]
    assert node["ip"] == "192.0.2.2" and 0 < node["memory_used_fraction"] < 1
    assert node["memory_monitor_kills"]["SERVE_CONTROLLER_ACTOR:ServeController.__init__"] == 2
    assert "metrics_warning" not in evidence
    assert len(seen) == 1 and seen[0].endswith(f", {SELECTOR}}}")


@pytest.mark.django_db
def test_an_unreachable_prometheus_leaves_a_warning_naming_it(team, use_replay, prom):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_oom_t1_modelonly_after_recovery.json"
    use_replay.routes["/api/v0/actors"] = DEAD
    cluster = ClusterFactory(
        name="gpu-prod", team=team, prometheus_url="http://prom.test:9090", prometheus_selector=SELECTOR
    )
    assert sync.sync_cluster(cluster.pk).ok
    [incident_id] = services.detect(cluster.pk)
    warning = Incident.objects.get(pk=incident_id).evidence["metrics_warning"]
    assert warning.startswith("Prometheus: Cannot reach Prometheus at http://prom.test:9090")
