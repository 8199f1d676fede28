"""The Prometheus path against a real Prometheus (Debian's, see prometheus_server.py) scraping a
real Ray head: every query Fleetdeck sends is one Prometheus accepts, and the same traffic read
through Prometheus and through the direct scrape gives the same figures, incidents and verdicts."""

from __future__ import annotations

import contextlib
import copy
import re
import threading
import time

import httpx
import pytest

from apps.clusters.models import Cluster
from apps.fleet import metric_readings, sync
from apps.incidents import ingest, prometheus_readings
from apps.incidents.models import Incident, ScrapeState, SignalWindow
from apps.remediation import verification
from integrations import prometheus as prometheus_api
from integrations import ray_metrics
from integrations.egress import PinnedTransport
from tests.conftest import two_app_config
from tests.integration import prometheus_server
from tests.integration.prometheus_server import SELECTOR

pytestmark = [pytest.mark.ray, pytest.mark.django_db]

# The series both sources must already hold before the first reading: a Ray counter appears only at
# its first increment, and a series that first shows up inside a window has its first value
# counted by a difference of scrapes but not by rate(), which has no earlier sample.
SERIES = {
    metric_readings.REQUESTS,
    metric_readings.ERRORS,
    metric_readings.HTTP_REQUESTS,
    metric_readings.HTTP_ERRORS,
    f"{metric_readings.LATENCY}_bucket",
    f"{metric_readings.HTTP_LATENCY}_bucket",
}
COUNTERS = (
    metric_readings.REQUESTS,
    metric_readings.ERRORS,
    metric_readings.HTTP_REQUESTS,
    metric_readings.HTTP_ERRORS,
)
EXPORT_S = 10.0  # Ray's metrics_report_interval_ms


@pytest.fixture
def start_prometheus():
    """Start a Prometheus scraping a head's metrics export port; each one is stopped by its pid."""
    started: list[prometheus_server.PrometheusServer] = []

    def start(head) -> prometheus_server.PrometheusServer:
        server = prometheus_server.start(f"127.0.0.1:{head.ports['metrics-export-port']}")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def prometheus(ray_head, start_prometheus):
    return start_prometheus(ray_head)


class Recording(httpx.BaseTransport):
    """The adapter's own transport, noting each query it sends."""

    def __init__(self):
        self.inner, self.queries = PinnedTransport(), []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.queries.append(request.url.params["query"])
        return self.inner.handle_request(request)


def refusal(server, promql: str) -> str | None:
    """Why Prometheus refuses `promql`, or None when it evaluates it."""
    answer = server.api(promql)
    return None if answer.get("status") == "success" else f"{answer.get('errorType')}: {answer.get('error')}"


def test_every_promql_fleetdeck_sends_is_accepted_by_a_real_prometheus(prometheus):
    sent: set[str] = set()
    # No selector, one matcher (what the form suggests), and several matcher kinds together.
    for selector in ("", SELECTOR, f'{SELECTOR}, job=~"ra.*", instance!=""'):
        recording = Recording()
        # Raises MetricsUnavailable on the first query Prometheus refuses.
        prometheus_readings.read(prometheus.url, selector, end=time.time(), seconds=300, transport=recording)
        # The raw series a change's client figures and an OOM incident's evidence are read from.
        prometheus_api.series(prometheus.url, metric_readings.SCRAPED, selector, transport=recording)
        assert len(recording.queries) >= 16
        for promql in recording.queries:
            assert refusal(prometheus, promql) is None, promql
        sent |= set(recording.queries)
    print(f"\n{len(sent)} distinct queries accepted by Prometheus {prometheus.url}")

    # The same check fails on PromQL Prometheus rejects: a selector written after the range.
    broken = f"sum by (application) (rate(ray_serve_num_http_requests_total[2m]{{{SELECTOR}}}))"
    assert "parse error" in (refusal(prometheus, broken) or "")
    with pytest.raises(ray_metrics.MetricsUnavailable, match=r"Prometheus refused the query: .*parse error"):
        prometheus_api.query(prometheus.url, broken)


def slow_config() -> dict:
    """The latency test's scenario: the Model holds each request 1.5 s, one replica, 8 in flight."""
    config = copy.deepcopy(two_app_config())
    model = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")
    model["user_config"] = {"alloc_mb": 0, "hold_s": 1.5}
    model["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 4}
    return config


def wait_quiet(metrics_url: str, *, timeout_s: float = 60.0) -> None:
    """Until the request and error counters of every series in SERIES have not moved for an export
    interval: every request answered so far is in them, on both sources."""
    deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
    while True:
        scrape = ray_metrics.scrape(metrics_url, timeout_s=5)
        names = {s.name for s in scrape.samples}
        totals = tuple(sum(s.value for s in scrape.named(name)) for name in COUNTERS)
        if totals != last:
            last, since = totals, time.monotonic()
        elif names >= SERIES and time.monotonic() - since > EXPORT_S + 1:
            return
        assert time.monotonic() < deadline, f"Ray's counters never settled; missing series {SERIES - names}"
        time.sleep(1)


def stored_scrape(cluster: Cluster) -> ray_metrics.Scrape:
    state = ScrapeState.objects.get(cluster=cluster)
    return ray_metrics.Scrape(at=state.at, samples=[ray_metrics.Sample(n, lab, v) for n, lab, v in state.samples])


def near(a: float, b: float, rel: float, slack: float = 0.0) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + slack


def test_the_same_traffic_through_prometheus_and_the_scrape(ray_head, start_prometheus, team):
    """Two clusters on one head, one scraped, one read through Prometheus; 24 clients against the
    slow Model (a latency spike) and a client whose requests fail with 500."""
    metrics_url = f"http://127.0.0.1:{ray_head.ports['metrics-export-port']}/metrics"
    ray_head.deploy(slow_config())
    stop = threading.Event()
    workers: list[threading.Thread] = []
    try:
        with httpx.Client(timeout=30) as client:
            for path in ("/demo?text=warm", "/demo?fail=1", "/echo2"):
                client.get(f"{ray_head.serve_url}{path}")
        wait_quiet(metrics_url)
        # Started after the counters settled, so its window and the scrape difference hold the same requests.
        prom = start_prometheus(ray_head)
        time.sleep(2.5)  # rate() needs two samples
        scraped = Cluster.objects.create(
            name="scraped",
            team=team,
            dashboard_url=ray_head.dashboard_url,
            ray_version="2.60.0",
            metrics_url=metrics_url,
        )
        via_prom = Cluster.objects.create(
            name="via-prometheus",
            team=team,
            dashboard_url=ray_head.dashboard_url,
            ray_version="2.60.0",
            prometheus_url=prom.url,
            prometheus_selector=SELECTOR,
        )
        for cluster in (scraped, via_prom):
            assert sync.sync_cluster(cluster.pk).ok
            ingest.collect_metrics(cluster.pk)  # the scrape's base; Prometheus's quiet first reading
        base = stored_scrape(scraped)

        def load(path: str, pause_s: float) -> None:
            with httpx.Client(timeout=60) as client:
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError):
                        client.get(f"{ray_head.serve_url}{path}")
                    time.sleep(pause_s)

        workers = [threading.Thread(target=load, args=("/demo?text=slow", 0), daemon=True) for _ in range(24)]
        workers.append(threading.Thread(target=load, args=("/demo?fail=1", 0.5), daemon=True))
        for worker in workers:
            worker.start()
        spikes: dict[str, set[int]] = {"scraped": set(), "via-prometheus": set()}
        deadline = time.monotonic() + 90
        while not all(
            Incident.objects.filter(pk__in=ids, deployment_name="Model", kind=Incident.Kind.LATENCY_SPIKE).exists()
            for ids in spikes.values()
        ):
            assert time.monotonic() < deadline, f"a source saw no latency spike of Model: {spikes}"
            time.sleep(11)
            for cluster in (scraped, via_prom):
                spikes[cluster.name].update(ingest.collect_metrics(cluster.pk))
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)

    try:
        wait_quiet(metrics_url)
        # Past MIN_RANGE_S since the base, a Prometheus reading of the span since the base rates over
        # exactly that span, as the scrape differences it.
        time.sleep(max(base.at + prometheus_readings.MIN_RANGE_S + 1 - time.time(), 0))
        ingest.collect_metrics(scraped.pk)
        ingest.collect_metrics(via_prom.pk)
        last = stored_scrape(scraped)
        whole = metric_readings.read(base, last)
        span = prometheus_readings.read(prom.url, SELECTOR, end=last.at, seconds=int(whole.seconds))
        now = time.time()

        for name, ids in spikes.items():
            model = Incident.objects.get(pk__in=ids, deployment_name="Model", kind=Incident.Kind.LATENCY_SPIKE)
            print(f"\n{name}: {model.title}: {model.evidence['summary']} causes {[c['id'] for c in model.causes]}")
            assert model.evidence["peak_p99_ms"] > 1500
            assert "LAT-2" in [c["id"] for c in model.causes]

        # Counts. The scrape differences the counters over its interval: every request since the base.
        # The Prometheus reading of the same seconds is the increase between the first and last
        # samples of its range, extrapolated by at most ~1.5 s of the >120 s they span (<2 %), and
        # reports it as a count of those seconds. Both hold the same settled counters. Latency
        # quantiles interpolate the same bucket counts, so they agree closely.
        assert span.seconds == int(whole.seconds)
        figures = []
        for dep in ("Echo", "Model"):
            direct, via = whole.deployments[("demo", dep)], span.deployments[("demo", dep)]
            figures.append(
                f"{dep}: requests {direct.requests:.0f} / {via.requests:.1f}, p99 {direct.p99_ms} / {via.p99_ms} ms, "
                f"errors {direct.errors:.0f} / {via.errors:.1f}"
            )
            assert direct.requests > 50 and near(direct.requests, via.requests, 0.05, 1), figures[-1]
            assert near(direct.p99_ms, via.p99_ms, 0.05), figures[-1]
            # Errors on the same scale as requests: a window's error rate is the same ratio.
            assert near(direct.errors / direct.requests, via.errors / via.requests, 0.05, 0.005), figures[-1]
        print("\n" + "\n".join(figures))
        echo = whole.deployments[("demo", "Echo")]
        assert echo.errors > 10  # the failing client's ValueErrors

        # What clients saw at the proxy: the same requests, the same 500s, the same latency.
        app, via_app = whole.applications["demo"], span.applications["demo"]
        print(
            f"clients: {app.requests:.0f} / {via_app.requests:.1f}, "
            f"500s {app.errors_by_code} / {via_app.errors_by_code}, "
            f"p99 {app.p99_ms:.0f} / {via_app.p99_ms} ms"
        )
        assert near(app.requests, via_app.requests, 0.05, 1)
        assert near(app.errors_by_code["500"], via_app.errors_by_code["500"], 0.05, 1)
        assert near(app.p99_ms, via_app.p99_ms, 0.05)

        # The wizard's memory readings: replicas and their resident memory, both gauges read at once.
        for dep in ("Echo", "Model"):
            direct = SignalWindow.objects.get(cluster=scraped, application_name="demo", deployment_name=dep).points[-1]
            via = SignalWindow.objects.get(cluster=via_prom, application_name="demo", deployment_name=dep).points[-1]
            print(
                f"{dep} memory: {direct.get('replicas')} replica(s) {direct.get('rss_mb')} MB / "
                f"{via.get('replicas')} replica(s) {via.get('rss_mb')} MB"
            )
            assert direct["replicas"] == via["replicas"] == 1
            assert near(direct["rss_mb"], via["rss_mb"], 0.1)

        # Client-side verification: the readings a wizard's window opened at the base would hold,
        # summarised and judged as verification.measure and verdict do, for both sources.
        verdicts = {}
        for cluster in (scraped, via_prom):
            points = [
                p
                for p in SignalWindow.objects.get(
                    cluster=cluster, application_name="demo", deployment_name="Model"
                ).points
                if verification._within(p, base.at, now + 1)
            ]
            summary = {"oom_kills": 0, **verification.summarize(points)}
            status, why = verification.verdict(
                "oom_kill", {"oom_kills": 0}, summary, window_over=True, metrics_expected=True
            )
            verdicts[cluster.name] = (status, summary["client_failed_share"], summary["client_requests"], why)
            print(f"{cluster.name}: {len(points)} reading(s): {status}: {why}")
        (status, share, answered, why), (p_status, p_share, p_answered, p_why) = verdicts.values()
        assert status == p_status == "failed" and answered and p_answered
        assert near(share, p_share, 0.05, 0.01) and share > 0.05
        assert "requests failed" in why and "requests failed" in p_why

        # Every metric Fleetdeck queries is one this Ray exports under that name: no GPU here, and no
        # serve.llm engine to count prompt and generation tokens.
        recording = Recording()
        prometheus_readings.read(prom.url, SELECTOR, transport=recording)
        queried = {m for q in recording.queries for m in re.findall(r"\b(ray_[a-z_]+)\{", q)}
        present = {r["metric"]["__name__"] for r in prom.api(f"group by (__name__) ({{{SELECTOR}}})")["data"]["result"]}
        print(f"queried but absent: {sorted(queried - present)}")
        assert queried - present <= {
            "ray_node_gram_used",
            "ray_node_gram_available",
            "ray_vllm_request_prompt_tokens_bucket",
            "ray_vllm_request_generation_tokens_bucket",
        }
    finally:
        ray_head.deploy(two_app_config())
