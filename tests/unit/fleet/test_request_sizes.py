"""Request sizes: an application's own histogram (named by the operator) and vLLM's token histograms
read per bucket from two scrapes or from Prometheus, kept in the deployment's signal points, shown
on its page and in the API, and cut into the size classes an observed mix measures.

The scrapes are Prometheus text with the labels Ray 2.60 puts on a Serve replica's histograms (the
shape of ray_serve_deployment_processing_latency_ms in fixtures/ray/metrics_after_200_requests_filtered.prom:
application, deployment, replica, le, and the exporter's own labels)."""

from __future__ import annotations

import time

import httpx
import pytest
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent
from apps.fleet import metric_readings, request_sizes
from apps.fleet.models import Application, Deployment
from apps.incidents import ingest, prometheus_readings
from apps.incidents.causes import LatencyContext, rank_latency_causes
from apps.incidents.models import SignalWindow
from apps.incidents.request_sizes import observed
from integrations import ray_metrics
from tests.factories import ClusterFactory
from tests.llm_world import MODEL_ID, SERVER, llm_deployment

BOUNDS = (256.0, 1024.0, 4096.0, 16384.0, float("inf"))
EXPORTER = (
    'Component="core_worker",NodeAddress="192.0.2.2",SessionName="session_2026-11-30_13-01-48_260823_5882",'
    'Version="2.60.0",otel_scope_name="ray._private.telemetry.open_telemetry_metric_recorder",'
    'otel_scope_schema_url="",otel_scope_version=""'
)


def histogram(name: str, labels: str, counts: dict[float, int]) -> list[str]:
    """A histogram's series as Ray exports them: cumulative buckets, then count and sum."""
    lines, cumulative = [f"# TYPE {name} histogram"], 0
    for bound in BOUNDS:
        cumulative += counts.get(bound, 0)
        le = "+Inf" if bound == float("inf") else repr(bound)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(cumulative)}')
    lines += [f"{name}_count{{{labels}}} {float(cumulative)}", f"{name}_sum{{{labels}}} {100.0 * cumulative}"]
    return lines


def replica(app: str, deployment: str, replica_id: str) -> str:
    return f'{EXPORTER},WorkerId="w{replica_id}",application="{app}",deployment="{deployment}",replica="{replica_id}"'


def scrape(at: float, *histograms: list[str], names=frozenset()) -> ray_metrics.Scrape:
    text = "\n".join(line for h in histograms for line in h) + "\n"
    return metric_readings.relevant(ray_metrics.parse(text, at=at), names)


NAMED = {("shop", "Api"): "ray_shop_request_bytes"}
SERIES = metric_readings.size_series(NAMED)


def test_a_named_histogram_is_read_per_bucket_over_the_replicas_of_its_deployment():
    before = scrape(
        0.0,
        histogram("ray_shop_request_bytes", replica("shop", "Api", "r1"), {256.0: 10, 1024.0: 4}),
        histogram("ray_shop_request_bytes", replica("shop", "Api", "r2"), {256.0: 2}),
        names=SERIES,
    )
    after = scrape(
        30.0,
        histogram("ray_shop_request_bytes", replica("shop", "Api", "r1"), {256.0: 16, 1024.0: 4, 16384.0: 1}),
        histogram("ray_shop_request_bytes", replica("shop", "Api", "r2"), {256.0: 5, 4096.0: 2}),
        # The same metric on a deployment that did not name it is not its sizes.
        histogram("ray_shop_request_bytes", replica("shop", "Other", "r3"), {256.0: 50}),
        names=SERIES,
    )
    reading = metric_readings.read(before, after, NAMED)
    # Each bucket's own count in the interval, summed over both replicas: 6 + 3 small, 2 mid, 1 large.
    assert reading.deployments[("shop", "Api")].sizes == {
        "256": 9.0,
        "1024": 0.0,
        "4096": 2.0,
        "16384": 1.0,
        "+Inf": 0.0,
    }
    assert ("shop", "Other") not in reading.deployments
    point = metric_readings.point(30.0, 30.0, reading.deployments[("shop", "Api")])
    assert point["size_in"]["256"] == 9.0 and "size_out" not in point
    # Not named, not scraped: a busy endpoint's other histograms stay out of the kept samples.
    assert metric_readings.read(before, after).deployments == {}
    assert not metric_readings.relevant(
        ray_metrics.parse(
            "\n".join(histogram("ray_shop_request_bytes", replica("shop", "Api", "r1"), {256.0: 1})) + "\n"
        )
    ).samples


def test_summaries_of_old_points_add_the_buckets_up():
    points = [{"t": 10.0 * i, "seconds": 10.0, "size_in": {"256": 2.0, "+Inf": 1.0}} for i in range(12)]
    summarised = metric_readings.compact(points, now=4000.0, raw_s=60, bucket_s=300)
    assert summarised[0]["size_in"] == {"256": 24.0, "+Inf": 12.0}
    assert request_sizes.merged(summarised) == request_sizes.merged(points) == [(256.0, 24.0), (float("inf"), 12.0)]


@pytest.mark.django_db
def test_vllm_token_histograms_reach_the_serve_llm_deployment_without_any_setup(team, monkeypatch):
    cluster = ClusterFactory(team=team, metrics_url="http://llm.test:8080/metrics")
    deployment = llm_deployment(cluster)
    labels = f'model_name="{MODEL_ID}",engine="0",WorkerId="w1",ReplicaId="",Component="core_worker"'

    def vllm(at, prompts, generations):
        return scrape(
            at,
            histogram("ray_vllm_request_prompt_tokens", labels, prompts),
            histogram("ray_vllm_request_generation_tokens", labels, generations),
        )

    scrapes = iter([vllm(100.0, {}, {}), vllm(130.0, {1024.0: 30, 16384.0: 3}, {256.0: 33})])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    ingest.collect_metrics(cluster.pk)
    ingest.collect_metrics(cluster.pk)

    point = SignalWindow.objects.get(cluster=cluster, deployment_name=SERVER).points[-1]
    assert point["size_in"] == {"256": 0.0, "1024": 30.0, "4096": 0.0, "16384": 3.0, "+Inf": 0.0}
    assert point["size_out"]["256"] == 33.0
    sizes = observed(deployment, now=140.0)
    assert sizes["source"] == {"metric": "vLLM's prompt tokens", "unit": "tokens", "output": "generated tokens"}
    assert sizes["input"]["quantiles"]["requests"] == 33
    assert 256 < sizes["input"]["quantiles"]["p50"] <= 1024 < sizes["input"]["quantiles"]["p99"] <= 16384
    assert sizes["output"]["quantiles"]["p99"] <= 256
    assert [p["requests"] for p in sizes["input"]["over_time"]] == [33]


@pytest.mark.django_db
def test_prometheus_answers_the_same_buckets(team):
    asked = []

    def answer(request: httpx.Request) -> httpx.Response:
        promql = request.url.params["query"]
        asked.append(promql)
        result = []
        if "ray_shop_request_bytes_bucket" in promql:
            # Rates per second over the reading; cumulative by le, as histogram buckets are.
            result = [
                {"metric": {"application": "shop", "deployment": "Api", "le": le}, "value": [1.0, rate]}
                for le, rate in (("256", "0.3"), ("1024", "0.3"), ("4096", "0.4"), ("+Inf", "0.4"))
            ]
        elif "ray_vllm_request_prompt_tokens_bucket" in promql:
            result = [{"metric": {"model_name": MODEL_ID, "le": "+Inf"}, "value": [1.0, "0.1"]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    reading = prometheus_readings.read(
        "http://prom.test:9090", seconds=120, transport=httpx.MockTransport(answer), size_metrics=NAMED
    )
    assert reading.deployments[("shop", "Api")].sizes == {"256": 36.0, "1024": 0.0, "4096": 12.0, "+Inf": 0.0}
    assert reading.model_sizes == {MODEL_ID: ({"+Inf": 12.0}, {})}
    assert any("sum by (application, deployment, le) (rate(ray_shop_request_bytes_bucket[120s]))" in q for q in asked)


def test_size_classes_keep_the_heavy_tail_and_never_understate_a_class():
    buckets = [(256.0, 500), (1024.0, 300), (4096.0, 150), (16384.0, 40), (65536.0, 10), (float("inf"), 0)]
    # Room for all five: one class per bucket, each at its bound.
    assert [(c["size"], c["share"]) for c in request_sizes.classes(buckets, 8)] == [
        (256, 50.0),
        (1024, 30.0),
        (4096, 15.0),
        (16384, 4.0),
        (65536, 1.0),
    ]
    # Three: the lightest neighbours merge, each class at its heaviest bucket's bound; the tail keeps its own.
    three = request_sizes.classes(buckets, 3)
    assert [(c["size"], c["share"]) for c in three] == [(256, 50.0), (1024, 30.0), (65536, 20.0)]
    assert sum(c["share"] for c in request_sizes.classes(buckets, 2)) == 100.0
    # Requests above the last bound are counted at it, and flagged.
    above = request_sizes.classes([(1024.0, 9), (float("inf"), 1)], 4)
    assert above == [
        {"size": 1024, "share": 90.0, "above": False},
        {"size": 1024, "share": 10.0, "above": True},
    ]
    assert request_sizes.classes([(float("inf"), 5)], 4) == []
    assert request_sizes.classes([], 4) == []


@pytest.mark.django_db
def test_naming_a_histogram_is_checked_audited_and_can_be_undone(team, people):
    cluster = ClusterFactory(team=team)
    app = Application.objects.create(cluster=cluster, name="shop", status="RUNNING")
    deployment = Deployment.objects.create(application=app, name="Api", status="HEALTHY")
    actor = Actor(user=people["operator"], via="test")
    with pytest.raises(ValueError, match="not a Prometheus metric name"):
        request_sizes.set_size_metric(actor, deployment, metric="request bytes", unit="bytes")
    with pytest.raises(ValueError, match="The unit is one of tokens, bytes, items"):
        request_sizes.set_size_metric(actor, deployment, metric="ray_shop_request_bytes", unit="MB")
    request_sizes.set_size_metric(actor, deployment, metric="ray_shop_request_bytes_count", unit="bytes")
    assert request_sizes.named_metrics(cluster.pk) == NAMED
    event = AuditEvent.objects.filter(action="deployment.size_metric").latest("id")
    assert event.changes == {"size_metric": "ray_shop_request_bytes", "size_unit": "bytes"}
    request_sizes.set_size_metric(actor, deployment, metric="", unit="bytes")
    assert (deployment.size_metric, deployment.size_unit) == ("", "")
    assert request_sizes.named_metrics(cluster.pk) == {}


@pytest.mark.django_db
def test_the_api_names_the_histogram_and_answers_the_distribution(team, api_as):
    cluster = ClusterFactory(team=team)
    app = Application.objects.create(cluster=cluster, name="shop", status="RUNNING")
    deployment = Deployment.objects.create(application=app, name="Api", status="HEALTHY")
    url = f"/api/v1/deployments/{deployment.pk}/"

    bad = api_as("operator").post(url + "size-metric/", {"metric": "9lives", "unit": "bytes"}, format="json")
    assert bad.status_code == 400 and "not a Prometheus metric name" in bad.json()["metric"][0]
    assert (
        api_as("operator").post(url + "size-metric/", {"metric": "x", "unit": "MB"}, format="json").status_code == 400
    )
    named = api_as("operator").post(
        url + "size-metric/", {"metric": "ray_shop_request_bytes", "unit": "bytes"}, format="json"
    )
    assert named.status_code == 200 and (named.json()["size_metric"], named.json()["size_unit"]) == (
        "ray_shop_request_bytes",
        "bytes",
    )

    empty = api_as("viewer").get(url + "request-sizes/").json()
    assert empty["source"]["metric"] == "ray_shop_request_bytes" and empty["input"] is None
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="shop",
        deployment_name="Api",
        points=[
            {"t": time.time() - 7200, "seconds": 30, "size_in": {"256": 50.0}},
            {"t": time.time() - 60, "seconds": 30, "size_in": {"256": 3.0, "1024": 1.0}},
        ],
    )
    day = api_as("viewer").get(url + "request-sizes/").json()["input"]
    assert day["quantiles"]["requests"] == 54 and [b["requests"] for b in day["buckets"]] == [53.0, 1.0]
    hour = api_as("viewer").get(url + "request-sizes/?hours=1").json()["input"]
    assert hour["quantiles"]["requests"] == 4 and hour["buckets"][0]["share"] == 0.75
    for hours in ("0", "25", "many"):
        answer = api_as("viewer").get(url + f"request-sizes/?hours={hours}")
        assert answer.status_code == 400 and "1 to 24 hours" in answer.json()["hours"][0]


@pytest.mark.django_db
def test_the_page_shows_the_distribution_and_the_empty_state(team, people, client):
    cluster = ClusterFactory(team=team)
    app = Application.objects.create(cluster=cluster, name="shop", status="RUNNING")
    deployment = Deployment.objects.create(application=app, name="Api", status="HEALTHY")
    page = reverse("fleet:deployment", args=[deployment.pk])
    client.force_login(people["operator"])
    html = client.get(page).content.decode()
    assert "Nothing counts this deployment's request sizes yet" in html and "Name the histogram" in html

    response = client.post(
        reverse("fleet:size_metric", args=[deployment.pk]), {"metric": "ray_shop_request_bytes", "unit": "bytes"}
    )
    assert response.status_code == 302
    now = time.time()
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="shop",
        deployment_name="Api",
        points=[
            {"t": now - 60, "seconds": 30, "size_in": {"256": 30.0, "4096": 0.0}},
            {"t": now - 30, "seconds": 30, "size_in": {"256": 6.0, "4096": 4.0}},
        ],
    )
    html = client.get(page).content.decode()
    assert "ray_shop_request_bytes" in html and 'id="request-sizes-chart"' in html
    assert "≤ 256" in html and "90\xa0%" in html  # 36 of 40 requests
    client.force_login(people["viewer"])
    assert "Name the histogram" not in client.get(page).content.decode()
    assert client.post(reverse("fleet:size_metric", args=[deployment.pk]), {"metric": ""}).status_code == 403


def test_requests_that_grew_during_a_spike_rank_payloads_among_the_first_causes():
    calm = [{"t": 30.0 * i, "size_in": {"256": 20.0, "4096": 1.0}} for i in range(10)]
    spike = [{"t": 300.0 + 30 * i, "size_in": {"256": 2.0, "4096": 8.0}} for i in range(3)]
    during, before = request_sizes.growth(calm + spike, 3)
    assert 2048 < during <= 4096 and before <= 256
    # Too few requests on a side to call a p90: no evidence either way.
    assert request_sizes.growth(calm[:0] + spike, 3) is None

    def ranked(sizes_p90):
        ctx = LatencyContext(
            cold_start=False,
            queue_building=False,
            ongoing=2,
            queued=0,
            max_ongoing_requests=8,
            running_replicas=1,
            at_max_replicas=False,
            memory_pressure=False,
            sizes_p90=sizes_p90,
            size_unit="bytes",
        )
        return rank_latency_causes(ctx)

    grew = ranked((during, before))
    assert grew[0]["id"] == "LAT-4"
    assert "p90 3,616 bytes during the spike against 242 before" in grew[0]["reason"]
    steady = ranked((260.0, 250.0))
    assert steady[-1]["id"] == "LAT-4" and steady[-1]["reason"].startswith("Request sizes did not grow")
    assert ranked(None)[-1]["reason"].startswith("If large payloads arrived")
