"""A Prometheus reading covers the whole seconds since the cluster's previous one, as a difference of
scrapes does: consumers sum counts and seconds across readings, and the sums must be the requests
clients sent over the wall time they span, not a 2 min rate counted as a minute every 30 s."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from apps.incidents import ingest, prometheus_readings
from apps.incidents.models import ScrapeState, SignalWindow
from integrations import prometheus
from tests.factories import ClusterFactory
from tests.unit.incidents.test_prometheus import captured, replay

NOW = 1_796_055_512.0
MODEL_RPS = 29.275657894736845  # demo/Model's rate in the captured answer
PROXY_RPS, PROXY_500_RPS = 12.5, 0.5


def vector(result: list[dict]) -> httpx.Response:
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


def answer(request: httpx.Request) -> httpx.Response:
    """The captured deployment answers, and the proxy's rates of demo (the capture has none)."""
    promql, at = request.url.params["query"], float(request.url.params.get("time", NOW))
    if "rate(ray_serve_num_http_requests_total" in promql:
        return vector([{"metric": {"application": "demo"}, "value": [at, str(PROXY_RPS)]}])
    if "rate(ray_serve_num_http_error_requests_total" in promql:
        return vector([{"metric": {"application": "demo", "error_code": "500"}, "value": [at, str(PROXY_500_RPS)]}])
    return replay(request)


@pytest.fixture
def queries(monkeypatch):
    """Every (PromQL, evaluation time) the adapter sends, answered by `answer` or a queued refusal."""
    seen: list[tuple[str, str | None]] = []
    refusals: list[dict] = []

    def handle(request):
        seen.append((request.url.params["query"], request.url.params.get("time")))
        if refusals:
            fixture = refusals.pop(0)
            return httpx.Response(fixture["status"], json=fixture["body"])
        return answer(request)

    monkeypatch.setattr(prometheus, "PinnedTransport", lambda: httpx.MockTransport(handle))
    return SimpleNamespace(seen=seen, refusals=refusals)


@pytest.fixture
def clock(monkeypatch):
    now = SimpleNamespace(at=NOW)
    monkeypatch.setattr(ingest, "time", SimpleNamespace(time=lambda: now.at))
    return now


def test_the_interval_is_the_whole_seconds_since_the_previous_reading():
    assert prometheus_readings.interval(NOW - 30, NOW) == (NOW, 30)
    # Whole seconds, ending where the next reading starts: no fraction is counted twice or lost.
    assert prometheus_readings.interval(NOW - 30.7, NOW) == (pytest.approx(NOW - 0.7), 30)
    assert prometheus_readings.interval(0, NOW) == (NOW, 120)  # the first covers the floor
    assert prometheus_readings.interval(NOW - 0.4, NOW) is None
    assert prometheus_readings.interval(NOW + 5, NOW) is None  # a clock behind the previous reading's


def test_a_reading_30_s_after_the_previous_one_counts_30_s_of_requests(queries):
    reading = prometheus_readings.read("http://prom.test:9090", 'cluster="local-demo"', end=NOW, seconds=30)
    assert reading.seconds == 30
    assert reading.deployments[("demo", "Model")].requests == pytest.approx(MODEL_RPS * 30)
    assert reading.applications["demo"].requests == pytest.approx(PROXY_RPS * 30)
    assert reading.applications["demo"].errors_by_code == {"500": pytest.approx(PROXY_500_RPS * 30)}
    # Every query evaluated at the reading's end; the range never below the floor of two samples.
    assert {at for _, at in queries.seen} == {str(NOW)}
    ranged = [q for q, _ in queries.seen if "rate(" in q]
    assert ranged and all("[120s]" in q for q in ranged)


def test_a_reading_past_the_floor_rates_over_exactly_its_interval(queries):
    reading = prometheus_readings.read("http://prom.test:9090", 'cluster="local-demo"', end=NOW, seconds=300)
    assert reading.seconds == 300
    assert reading.deployments[("demo", "Model")].requests == pytest.approx(MODEL_RPS * 300)
    ranged = [q for q, _ in queries.seen if "rate(" in q]
    assert ranged and all("[300s]" in q for q in ranged)


@pytest.fixture
def cluster(team):
    return ClusterFactory(
        name="p", team=team, prometheus_url="http://prom.test:9090", prometheus_selector='cluster="local-demo"'
    )


def model_points(cluster) -> list[dict]:
    return SignalWindow.objects.get(cluster=cluster, application_name="demo", deployment_name="Model").points


@pytest.mark.django_db
def test_readings_every_30_s_sum_to_the_requests_and_the_wall_time_they_span(cluster, queries, clock):
    ingest.collect_metrics(cluster.pk)
    first = model_points(cluster)[-1]
    # No previous reading: the 2 min before, which no other reading counts.
    assert (first["t"], first["seconds"], first["http"]) == (NOW, 120, pytest.approx(PROXY_RPS * 120))
    assert ScrapeState.objects.get(cluster=cluster).at == NOW

    clock.at = NOW + 30
    ingest.collect_metrics(cluster.pk)
    clock.at = NOW + 60.4
    ingest.collect_metrics(cluster.pk)

    later = model_points(cluster)[1:]
    assert [(p["t"], p["seconds"]) for p in later] == [(NOW + 30, 30), (NOW + 60, 30)]
    assert [p["http"] for p in later] == [pytest.approx(PROXY_RPS * 30)] * 2
    assert [p["http_errors"] for p in later] == [{"500": pytest.approx(PROXY_500_RPS * 30)}] * 2
    assert [p["rps"] for p in later] == [pytest.approx(MODEL_RPS, abs=0.001)] * 2
    assert sum(p["http"] for p in later) == pytest.approx(PROXY_RPS * 60)
    assert ScrapeState.objects.get(cluster=cluster).at == NOW + 60
    assert {at for _, at in queries.seen[-5:]} == {str(NOW + 60)}


@pytest.mark.django_db
def test_after_a_failed_reading_the_next_counts_the_whole_gap_once(cluster, queries, clock):
    ingest.collect_metrics(cluster.pk)
    clock.at = NOW + 30
    queries.refusals.append(captured("bad_query"))
    assert ingest.collect_metrics(cluster.pk) == []
    state = ScrapeState.objects.get(cluster=cluster)
    assert state.at == NOW and "unclosed left parenthesis" in state.error

    clock.at = NOW + 60
    ingest.collect_metrics(cluster.pk)
    last = model_points(cluster)[-1]
    assert (last["t"], last["seconds"], last["http"]) == (NOW + 60, 60, pytest.approx(PROXY_RPS * 60))
    assert ScrapeState.objects.get(cluster=cluster).error == ""
