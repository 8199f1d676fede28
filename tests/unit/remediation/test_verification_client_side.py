"""What clients saw at the Serve proxy, from the readings to the wizard's verdict: a replica that
never errs can sit behind a proxy that sheds most requests with 503, and replica processing time
leaves out the queue. Readings use the payloads of a real Ray 2.60 cluster; the proxy counts
added to them (503s, slow answers) are synthetic, in the shapes Ray exports."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from apps.fleet import metric_readings
from apps.incidents import ingest, prometheus_readings
from apps.incidents.models import OomKillRecord, SignalWindow
from apps.remediation import presentation, verification
from apps.remediation.models import Wizard, WizardStep
from integrations import ray_metrics
from tests.conftest import FIXTURES
from tests.factories import ClusterFactory, IncidentFactory

OOM = "metrics_after_oom_kills_filtered.prom"
HEALTHY = "metrics_after_200_requests_filtered.prom"


def metrics(name: str, at: float = 100.0) -> ray_metrics.Scrape:
    return ray_metrics.parse((FIXTURES / name).read_text(), at=at)


def proxy_answers(
    scrape: ray_metrics.Scrape, at: float, by_code: dict[str, int], bucket_ms: float, app: str = "demo"
) -> ray_metrics.Scrape:
    """`scrape` plus answers of the proxy for /demo, `by_code` status -> count, all in the latency
    bucket ending at `bucket_ms`, the way Ray labels them (status_code on the requests counter and
    the histogram, error_code on the error counter)."""
    samples = list(scrape.samples)
    base = {"application": app, "method": "GET", "route": f"/{app}"}
    bounds = sorted(
        {float(s.labels["le"]) for s in scrape.samples if s.name == f"{metric_readings.HTTP_LATENCY}_bucket"}
    )

    def add(name, labels, n):
        for i, s in enumerate(samples):
            if s.name == name and s.labels == labels:
                samples[i] = ray_metrics.Sample(name, labels, s.value + n)
                return
        samples.append(ray_metrics.Sample(name, labels, float(n)))

    for code, n in by_code.items():
        add(metric_readings.HTTP_REQUESTS, base | {"status_code": code}, n)
        if code != "200":
            add(metric_readings.HTTP_ERRORS, base | {"error_code": code}, n)
        for bound in bounds:
            le = "+Inf" if bound == float("inf") else str(bound)
            add(
                f"{metric_readings.HTTP_LATENCY}_bucket",
                base | {"status_code": code, "le": le},
                n if bound >= bucket_ms else 0,
            )
    return ray_metrics.Scrape(at=at, samples=samples)


# --- readings ------------------------------------------------------------------------------


def test_a_scrape_after_oom_kills_gives_each_application_its_answers_and_500s():
    reading = metric_readings.read(ray_metrics.Scrape(at=0), metrics(OOM))
    modelonly, demo = reading.applications["modelonly"], reading.applications["demo"]
    assert (modelonly.requests, modelonly.errors_by_code) == (550, {"500": 11})
    assert (demo.requests, demo.errors_by_code) == (548, {"500": 1})
    assert modelonly.p50_ms < modelonly.p99_ms and demo.p99_ms is not None


def test_the_proxys_own_routes_are_no_application():
    # /-/healthz, /-/routes and a 404 carry application="": they are nobody's clients.
    reading = metric_readings.read(ray_metrics.Scrape(at=0), metrics(HEALTHY))
    assert set(reading.applications) == {"demo"} and reading.applications["demo"].errors_by_code == {}


def test_client_figures_come_from_the_difference_of_two_scrapes():
    before = metrics(HEALTHY, at=1000)
    after = proxy_answers(before, 1060, {"200": 44, "503": 690, "500": 4}, bucket_ms=5000.0)
    reading = metric_readings.read(before, after)
    demo = reading.applications["demo"]
    assert demo.requests == 738 and demo.errors_by_code == {"503": 690, "500": 4}
    assert 2000 < demo.p99_ms <= 5000 and demo.p99_between_ms == (2000.0, 5000.0)
    # The replicas saw none of it: their counters did not move.
    assert reading.deployments[("demo", "Model")].requests == 0 and reading.deployments[("demo", "Model")].errors == 0


def test_the_compact_scrape_keeps_the_proxy_series():
    scrape = metrics(OOM)
    kept = metric_readings.relevant(scrape)
    for name in (metric_readings.HTTP_REQUESTS, metric_readings.HTTP_ERRORS, f"{metric_readings.HTTP_LATENCY}_bucket"):
        assert len(kept.named(name)) == len(scrape.named(name)) > 0
    assert (
        metric_readings.read(ray_metrics.Scrape(at=0), kept).applications
        == metric_readings.read(ray_metrics.Scrape(at=0), scrape).applications
    )


def test_points_carry_the_applications_client_figures_and_keep_their_own_keys():
    before = metrics(HEALTHY, at=1000)
    reading = metric_readings.read(before, proxy_answers(before, 1060, {"200": 50, "503": 10}, bucket_ms=100.0))
    point = metric_readings.point(
        1060, reading.seconds, reading.deployments[("demo", "Model")], reading.applications["demo"]
    )
    assert {"t", "p50", "p95", "p99", "rps", "errors", "ongoing", "queued", "starts"} <= set(point)
    assert point["seconds"] == 60 and point["http"] == 60 and point["http_errors"] == {"503": 10}
    assert 50 < point["http_p99"] <= 100 and point["http_p50"] <= point["http_p95"] <= point["http_p99"]
    # No proxy series: the keys are absent, which is not "no errors".
    assert "http" not in metric_readings.point(1060, reading.seconds, reading.deployments[("demo", "Model")])


def test_compact_sums_client_counts_per_code_and_keeps_the_worst_latency():
    points = [
        {
            "t": float(t),
            "rps": 1.0,
            "errors": 0,
            "seconds": 30,
            "http": 10,
            "http_errors": {"503": 2} if t % 60 else {"500": 1},
            "http_p50": 10.0,
            "http_p99": float(t % 7),
        }
        for t in range(0, 600, 30)
    ]
    [summary] = [
        p for p in metric_readings.compact(points, now=900, raw_s=300, bucket_s=600, retention_s=1200) if "summary" in p
    ]
    assert summary["summary"] == 20 and summary["http"] == 200 and summary["seconds"] == 600
    assert (
        summary["http_errors"] == {"500": 10, "503": 20} and summary["http_p99"] == 6.0 and summary["http_p50"] == 10.0
    )


def test_prometheus_gives_the_same_client_figures():
    def answer(request):
        promql = request.url.params["query"]
        result = []
        if "ray_serve_num_http_requests_total" in promql:
            result = [
                {"metric": {"application": "demo"}, "value": [0, "12.3"]},
                {"metric": {"application": ""}, "value": [0, "0.1"]},
            ]
        elif "ray_serve_num_http_error_requests_total" in promql:
            result = [{"metric": {"application": "demo", "error_code": "503"}, "value": [0, "11.5"]}]
        elif (
            "histogram_quantile(0.99, sum by (application, le) (rate(ray_serve_http_request_latency_ms_bucket" in promql
        ):
            result = [{"metric": {"application": "demo"}, "value": [0, "8125"]}]
        elif "ray_serve_http_request_latency_ms_bucket" in promql:
            result = [{"metric": {"application": "demo"}, "value": [0, "NaN"]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    reading = prometheus_readings.read("http://prom.test:9090", 'cluster="c"', transport=httpx.MockTransport(answer))
    demo = reading.applications["demo"]
    assert set(reading.applications) == {"demo"}
    assert demo.requests == pytest.approx(12.3 * reading.seconds) and demo.errors_by_code == {
        "503": pytest.approx(11.5 * reading.seconds)
    }
    assert demo.p99_ms == 8125 and demo.p50_ms is None


@pytest.fixture
def cluster(team):
    return ClusterFactory(name="gpu-prod", team=team, metrics_url="http://ray.test:8080/metrics")


@pytest.mark.django_db
def test_collected_points_of_every_deployment_carry_what_the_applications_clients_saw(cluster, monkeypatch):
    base = metrics(HEALTHY, at=1000)
    scrapes = iter([base, proxy_answers(base, 1030, {"200": 44, "503": 690, "500": 4}, bucket_ms=5000.0)])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    ingest.collect_metrics(cluster.pk)
    ingest.collect_metrics(cluster.pk)
    for dep in ("Model", "Echo"):
        point = SignalWindow.objects.get(cluster=cluster, application_name="demo", deployment_name=dep).points[-1]
        assert point["http"] == 738 and point["http_errors"] == {"503": 690, "500": 4} and point["errors"] == 0


# --- verification --------------------------------------------------------------------------


def window(*, http=None, codes=None, p99=400.0, http_p99=900.0, rps=4.0, ongoing=2, n=5, t0=0.0) -> list[dict]:
    """`n` readings 30 s apart; `http`/`codes` are the totals over the window, spread evenly."""
    points = []
    for i in range(n):
        p = {
            "t": t0 + 30 * (i + 1),
            "seconds": 30,
            "p50": 120.0,
            "p99": p99,
            "rps": rps,
            "errors": 0,
            "ongoing": ongoing,
            "queued": 0,
        }
        if http is not None:
            p |= {
                "http": http / n,
                "http_errors": {c: k / n for c, k in (codes or {}).items()},
                "http_p50": 200.0,
                "http_p99": http_p99,
            }
        points.append(p)
    return points


def summary(points, kills=0) -> dict:
    return {"oom_kills": kills, **verification.summarize(points)}


def test_the_issues_case_503s_at_the_proxy_fail_verification_while_replicas_report_no_error():
    before = summary(window(http=600, codes={"500": 400}, ongoing=6), kills=3)
    after = summary(window(http=738, codes={"503": 690, "500": 4}))
    assert after["errors"] == 0 and after["error_rate"] == 0  # what the replica side alone said
    assert (after["client_requests"], after["client_failed"], after["client_failed_share"]) == (738, 694, 0.9404)
    assert after["client_failed_by_code"] == {"503": 690, "500": 4}
    assert after["goodput_rps"] == pytest.approx(44 / 150, abs=0.001)
    result, why = verification.verdict("oom_kill", before, after, window_over=True)
    assert result == "failed"
    assert why.startswith("Clients: 694 of 738 requests failed (94.0 %; 503 ×690, 500 ×4), above the 5 % objective.")


def test_a_proxy_p99_above_the_objective_fails_although_replicas_process_fast():
    before = summary(window(http=600, http_p99=30_000.0, p99=500.0))
    after = summary(window(http=600, http_p99=14_000.0, p99=90.0))
    result, why = verification.verdict("latency_spike", before, after, window_over=True, latency_objective_ms=10_000)
    assert result == "failed" and "Clients: p99 14000 ms end to end, above the 10000 ms objective." in why
    assert "processing p99 90 ms" in why


def test_a_p99_interpolated_below_the_objective_in_a_bucket_that_spans_it_does_not_pass():
    # Ray's proxy buckets jump from 10 s to 60 s: every answer took 10-60 s, interpolation says 15 s.
    slow = [p | {"http_p99": 15_000.0, "http_p99_between": [10_000.0, 60_000.0]} for p in window(http=600)]
    after = summary(slow)
    result, why = verification.verdict(
        "oom_kill", summary(window(http=600), kills=2), after, window_over=True, latency_objective_ms=20_000
    )
    assert result == "failed"
    assert "p99 15000 ms interpolated, between 10000 and 60000 ms (the proxy's histogram bucket) end to end" in why
    assert "cannot be shown to be met" in why and "RAY_SERVE_REQUEST_LATENCY_BUCKETS_MS" in why
    rows = {label: a for section in presentation.comparison({}, after) for label, _, a in section["rows"]}
    assert rows["p99 end to end"] == "15\xa0s, somewhere in 10\xa0s–60\xa0s (the proxy's histogram bucket)"
    # Interpolated above the objective in the same bucket proves no more: it is not called "above".
    high = summary([p | {"http_p99": 55_000.0, "http_p99_between": [10_000.0, 60_000.0]} for p in window(http=600)])
    result, why = verification.verdict("oom_kill", {}, high, window_over=True, latency_objective_ms=20_000)
    assert result == "failed" and "cannot be shown to be met" in why and "above the 20000 ms objective" not in why
    # At a bucket boundary the objective is decided: answers all within 5-10 s meet a 10 s objective.
    bounded = summary([p | {"http_p99": 9_000.0, "http_p99_between": [5_000.0, 10_000.0]} for p in window(http=600)])
    assert verification.verdict("oom_kill", {}, bounded, window_over=True, latency_objective_ms=10_000)[0] == "passed"
    beyond = summary([p | {"http_p99": 600_000.0, "http_p99_between": [600_000.0, None]} for p in window(http=600)])
    assert (
        "above 600000 ms (the proxy's last bucket)" in verification.verdict("oom_kill", {}, beyond, window_over=True)[1]
    )


def test_a_clean_client_side_passes_and_says_both_sides_with_units():
    before = summary(window(http=600, codes={"500": 300}), kills=2)
    after = summary(window(http=600, codes={"404": 3}, http_p99=900.0))
    assert after["client_failed"] == 0  # a 404 is the client's own mistake
    result, why = verification.verdict("oom_kill", before, after, window_over=True)
    assert result == "passed"
    assert (
        "Clients: 600 requests, none failed; goodput 4.00 req/s; p50 200 ms, p99 900 ms end to end "
        "(before the fix: 600 requests, 300 failed (50.0 %; 500 ×300);"
    ) in why
    assert "Replicas: 600 requests, 0 errors; processing p99 400 ms; queue peak 0 (before the fix:" in why


def test_without_proxy_counters_it_says_so_and_never_passes_a_latency_fix_on_replica_figures():
    before, after = summary(window(p99=3000.0)), summary(window(p99=300.0))
    assert after["client_requests"] is None and after["goodput_rps"] is None
    result, why = verification.verdict("latency_spike", before, after, window_over=True)
    assert result == "inconclusive" and "no proxy counters" in why
    result, why = verification.verdict("oom_kill", before, after, window_over=True)
    assert result == "passed" and "no proxy counters" in why


def test_requests_admitted_but_never_answered_fail():
    after = summary(window(http=0, rps=0.0, ongoing=4))
    result, why = verification.verdict("oom_kill", summary([]), after, window_over=True)
    assert result == "failed" and "Replicas: up to 4 request(s) in flight and none completed." in why
    assert "Clients: no request completed at the proxy" in why


@pytest.fixture
def wizard(cluster):
    now = timezone.now()
    incident = IncidentFactory(cluster=cluster, title="OOM", started_at=now - timedelta(minutes=5), last_signal_at=now)
    wizard = Wizard.objects.create(cluster=cluster, application_name="demo", deployment_name="Model", incident=incident)
    for position, kind in enumerate(("verification", "outcome"), start=1):
        WizardStep.objects.create(wizard=wizard, position=position, kind=kind, title=kind)
    return wizard


@pytest.mark.django_db
def test_the_before_window_with_kills_and_500s_is_reported_failing_with_its_failed_share(wizard, cluster):
    now = timezone.now()
    OomKillRecord.objects.create(incident=wizard.incident, actor_id="a1", replica="r1", message="killed")
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=window(http=500, codes={"500": 400}, t0=now.timestamp() - 300),
    )
    before = verification.measure(wizard, now - timedelta(minutes=10), now + timedelta(seconds=1))
    assert before["healthy"] is False and before["errors"] == 0 and before["client_failed_share"] == 0.8
    assert (
        before["why"]
        == "1 OOM kill(s). Clients: 400 of 500 requests failed (80.0 %; 500 ×400), above the 5 % objective."
    )
    rows = {row[0]: row[1] for section in presentation.comparison(before, {}) for row in section["rows"]}
    assert (
        rows["Failed share"] == "80\xa0%"
        and rows["Failed by code"] == "500 ×400"
        and rows["Window"].startswith("failing: 1 OOM kill(s).")
    )


@pytest.mark.django_db
def test_a_reading_that_began_before_the_fix_counts_in_neither_window(wizard, cluster):
    # As read on a real cluster: no reading while the fix was calibrated and applied, so the first
    # one after the verification began spanned the kill's last seconds and carried its 30 500s;
    # the clients of the fixed deployment got only 200s.
    started = timezone.now() - timedelta(seconds=60)
    change_at = started - timedelta(seconds=5)
    t = started.timestamp()
    straddling = {"t": round(t + 0.05, 1), "seconds": 18.7, "rps": 0.5, "errors": 0, "ongoing": 0, "http": 35.0}
    straddling["http_errors"] = {"500": 30.0}
    after = [
        {"t": round(t + 3.2 * i, 1), "seconds": 3.2, "rps": 2.3, "errors": 0, "ongoing": 4, "http": 10.0}
        for i in range(1, 15)
    ]
    points = [straddling, *after]
    SignalWindow.objects.create(cluster=cluster, application_name="demo", deployment_name="Model", points=points)

    measured = verification.measure(wizard, started, started + timedelta(seconds=45))
    assert measured["client_requests"] == 140 and measured["client_failed"] == 0 and measured["healthy"]
    assert measured["points"] == 14
    # Nor is it the incident's: it ran into the change, whose own transition it may hold.
    before = verification.measure(wizard, started - timedelta(minutes=15), change_at)
    assert before["points"] == 0
    # Where a window starts on a reading's start, that reading counts (time and interval are rounded).
    exact = verification.measure(wizard, started - timedelta(seconds=18.7), started + timedelta(seconds=45))
    assert exact["points"] == 15 and exact["client_failed"] == 30


@pytest.mark.django_db
def test_a_window_no_reading_lies_inside_is_inconclusive_where_the_cluster_has_metrics(wizard, cluster):
    # Readings every 30 s and a 30 s window that starts mid-interval: none lies wholly inside.
    now = timezone.now()
    start = now - timedelta(seconds=30)
    points = [{"t": start.timestamp() + dt, "seconds": 30, "rps": 2.0, "http": 60.0} for dt in (10, 40)]
    SignalWindow.objects.create(cluster=cluster, application_name="demo", deployment_name="Model", points=points)
    Wizard.objects.filter(pk=wizard.pk).update(state="verifying", verify_started_at=start, verify_ends_at=now)
    assert verification.evaluate(wizard.pk, now=now) == "inconclusive"
    wizard.refresh_from_db()
    assert wizard.state == "open"
    assert (
        "No metrics reading lies wholly inside the window" in wizard.steps.get(kind="verification").check_result["why"]
    )
    # Without a metrics source, no kill in the window is all there is to judge, as before.
    result, why = verification.verdict("oom_kill", {}, {"oom_kills": 0, "points": 0}, window_over=True)
    assert result == "passed" and "reports no metrics" in why


@pytest.mark.django_db
def test_the_failure_objective_is_the_wizards(wizard, cluster, client, people):
    now = timezone.now()
    start = now - timedelta(minutes=5)
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=window(http=1000, codes={"503": 100}, t0=start.timestamp()),
    )
    Wizard.objects.filter(pk=wizard.pk).update(
        state="verifying", verify_started_at=start, verify_ends_at=now, failure_objective=0.05
    )
    assert verification.evaluate(wizard.pk, now=now) == "failed"
    wizard.refresh_from_db()
    assert (
        wizard.state == "not_resolved"
        and "100 of 1000 requests failed (10.0 %; 503 ×100), above the 5 % objective" in wizard.outcome
    )

    tolerant = Wizard.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        incident=wizard.incident,
        state="verifying",
        verify_started_at=start,
        verify_ends_at=now,
        failure_objective=0.15,
    )
    for position, kind in enumerate(("verification", "outcome"), start=1):
        WizardStep.objects.create(wizard=tolerant, position=position, kind=kind, title=kind)
    assert verification.evaluate(tolerant.pk, now=now) == "passed"
    tolerant.refresh_from_db()
    assert (
        tolerant.state == "resolved"
        and tolerant.after["client_failed_share"] == 0.1
        and tolerant.after["healthy"] is True
    )

    client.force_login(people["viewer"])
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": 1}).content.decode()
    assert "Clients, at the Serve proxy" in page and "Replicas" in page and "10.0 %" in page and "503 ×100" in page
    assert "failed requests: at most 5 %" in page


@pytest.mark.parametrize(
    ("p50_ms", "result", "said"),
    [
        (9, "inconclusive", "cached answers or much smaller requests"),  # the reference app's cache
        (60, "inconclusive", "cached answers or much smaller requests"),
        (2_000, "inconclusive", "much heavier than that request"),
        (260, "passed", ""),  # the sized request under load
    ],
)
def test_the_window_is_judged_on_the_traffic_that_was_sized(p50_ms, result, said):
    after = verification.summarize(
        [
            {
                "t": 10.0 * i,
                "seconds": 10.0,
                "p50": p50_ms,
                "p99": 2 * p50_ms,
                "rps": 1.5,
                "errors": 0,
                "http": 15,
                "http_errors": {},
                "http_p50": p50_ms + 5,
                "http_p99": 900,
            }
            for i in range(1, 13)
        ]
    ) | {"oom_kills": 0}
    got, why = verification.verdict("oom_kill", {}, after, window_over=True, sized_service_s=0.23)
    assert got == result and said in why
    # Without a calibrated service time there is nothing to compare with.
    assert verification.verdict("oom_kill", {}, after, window_over=True)[0] == "passed"
