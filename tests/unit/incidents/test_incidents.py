"""OOM incidents from Ray's state API, with metrics evidence and ranked causes."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from apps.changes.models import Change
from apps.clusters.models import Cluster
from apps.fleet import metric_readings, sync
from apps.fleet.models import Deployment
from apps.incidents import ingest, services
from apps.incidents.models import Incident
from apps.incidents.oom import culprit, oom_kills, replica_of
from integrations import ray_metrics
from integrations.ray.parsing import parse_actor
from tests.conftest import FIXTURES, ray_fixture
from tests.factories import ChangeFactory, ClusterFactory

DEAD = "state_actors_dead_oom_t1_modelonly_detail.json"


def metrics(name: str, at: float = 100.0) -> ray_metrics.Scrape:
    return ray_metrics.parse((FIXTURES / name).read_text(), at=at)


# --- pure ----------------------------------------------------------------------------------


def test_an_oom_killed_replica_is_read_from_its_death_cause():
    actors = [parse_actor(a) for a in ray_fixture(DEAD)["data"]["result"]["result"]]
    kills = oom_kills(actors)
    assert len(kills) == 1
    kill = kills[0]
    assert (kill.application, kill.deployment, kill.replica) == ("modelonly", "Model", "lg45rpy4")
    assert kill.node_ip == "192.0.2.2"
    assert (kill.used_bytes, kill.threshold_bytes) == (7595319296, 7582819328)


def test_replica_names_that_are_not_serve_replicas_are_ignored():
    assert replica_of("SERVE_CONTROLLER_ACTOR") is None
    assert replica_of("SERVE_REPLICA::app#Dep#abc") == ("app", "Dep", "abc")


def test_signals_from_a_scrape_give_requests_latency_and_oom_evidence():
    reading = metric_readings.read(ray_metrics.Scrape(at=0), metrics("metrics_after_oom_kills_filtered.prom"))
    assert reading.deployments[("demo", "Echo")].oom_errors == 1
    assert reading.deployments[("modelonly", "Model")].requests == 423
    node = reading.nodes["192.0.2.2"]
    assert 0 < node.mem_fraction < 1
    assert node.evictions["SERVE_CONTROLLER_ACTOR:ServeController.__init__"] == 2


def test_latency_percentiles_come_from_bucket_deltas():
    before = metrics("metrics_after_200_requests_filtered.prom", at=0)
    after = copy.deepcopy(before)
    after.at = 60
    reading = metric_readings.read(before, after)
    assert all(d.requests == 0 and d.p99_ms is None for d in reading.deployments.values())
    assert metric_readings.quantile([(10.0, 50), (100.0, 100), (float("inf"), 100)], 0.5) == 10.0
    assert metric_readings.quantile([(10.0, 50), (100.0, 100), (float("inf"), 100)], 0.75) == 55.0


def test_a_counter_that_goes_back_is_a_reset_with_a_warning_not_a_negative_rate():
    before = metrics("metrics_after_oom_kills_filtered.prom", at=0)
    # The same series, counted again from a small number: the replica restarted.
    after = ray_metrics.Scrape(
        at=60,
        samples=[
            ray_metrics.Sample(s.name, s.labels, 3.0 if s.name == metric_readings.REQUESTS else s.value)
            for s in before.samples
        ],
    )
    reading = metric_readings.read(before, after)
    assert all(d.requests >= 0 for d in reading.deployments.values())
    assert any("went backwards" in w for w in reading.warnings)


def test_garbage_is_not_metrics():
    with pytest.raises(ray_metrics.MetricsUnavailable):
        ray_metrics.parse("<html><body>nginx</body></html>\n{not: metrics}")


def test_an_unreachable_metrics_endpoint_is_reported_transient():
    def refuse(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(ray_metrics.MetricsUnavailable) as caught:
        ray_metrics.scrape("http://ray.test:8080/metrics", transport=httpx.MockTransport(refuse))
    assert caught.value.transient


# --- detection -----------------------------------------------------------------------------


@pytest.fixture
def cluster(team, use_replay, monkeypatch):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_oom_t1_modelonly_after_recovery.json"
    use_replay.routes["/api/v0/actors"] = DEAD
    cluster = ClusterFactory(name="gpu-prod", team=team, metrics_url="http://ray.test:8080/metrics")
    sync.sync_cluster(cluster.pk)
    monkeypatch.setattr(
        ingest.ray_metrics,
        "scrape",
        lambda url, timeout_s, names=None: metrics("metrics_after_oom_kills_filtered.prom"),
    )
    return Cluster.objects.get(pk=cluster.pk)


@pytest.mark.django_db
def test_an_oom_kill_opens_an_incident_with_evidence_and_ranked_causes(cluster):
    [incident_id] = services.detect(cluster.pk)
    incident = Incident.objects.get(pk=incident_id)
    assert incident.kind == "oom_kill" and incident.status == "open"
    assert (incident.application_name, incident.deployment_name) == ("modelonly", "Model")
    assert incident.deployment == Deployment.objects.get(
        application__cluster=cluster, application__name="modelonly", name="Model"
    )
    assert incident.oom_kills.get().replica == "lg45rpy4"
    ids = [c["id"] for c in incident.causes]
    assert ids[0] == "OOM-2" and "max_ongoing_requests" in incident.causes[0]["reason"]
    assert {"OOM-1", "OOM-5"} <= set(ids) and incident.causes[0]["remedies"][0]["id"] == "R1"
    assert incident.evidence["out_of_memory_errors"] == {"demo/Echo": 1.0}
    assert incident.evidence["nodes"][0]["memory_monitor_kills"]
    assert incident.timeline.get().kind == "detected"


def innocent_echo_killed_beside(payload: dict) -> dict:
    """The modelonly kill, with demo/Echo's replica (0.20 GB in the same message, against the
    Model's 5.48 GB) killed in the same pass, as Ray's monitor does since 2.56."""
    payload = copy.deepcopy(payload)
    echo = copy.deepcopy(payload["data"]["result"]["result"][0])
    echo["actor_id"], echo["name"] = "e" * 32, "SERVE_REPLICA::demo#Echo#d9ikbnzi"
    payload["data"]["result"]["result"].append(echo)
    return payload


def test_a_replica_killed_beside_the_one_holding_the_memory_is_blamed_on_that_one():
    payload = innocent_echo_killed_beside(ray_fixture(DEAD))
    greedy, innocent = oom_kills([parse_actor(a) for a in payload["data"]["result"]["result"]])
    assert culprit(greedy) == ("modelonly", "Model")
    assert (innocent.application, innocent.deployment) == ("demo", "Echo")
    assert culprit(innocent) == ("modelonly", "Model")
    # Without the monitor's list there is nobody else to blame.
    assert culprit(dataclasses.replace(innocent, message="")) == ("demo", "Echo")


@pytest.mark.django_db
def test_an_innocent_replica_killed_in_the_same_pass_counts_in_the_greedy_deployment_s_incident(cluster, use_replay):
    use_replay.routes["/api/v0/actors"] = innocent_echo_killed_beside(ray_fixture(DEAD))
    [incident_id] = services.detect(cluster.pk)
    incident = Incident.objects.get(pk=incident_id)
    assert (incident.application_name, incident.deployment_name) == ("modelonly", "Model")
    assert dict(incident.oom_kills.values_list("replica", "killed_deployment")) == {
        "lg45rpy4": "",
        "d9ikbnzi": "demo/Echo",
    }
    assert "replicas of demo/Echo killed in the same pass" in incident.timeline.get().message
    assert not Incident.objects.filter(deployment_name="Echo").exists()


@pytest.mark.django_db
def test_the_same_kill_seen_again_changes_nothing_and_a_new_one_extends_the_incident(cluster, use_replay):
    [first] = services.detect(cluster.pk)
    assert services.detect(cluster.pk) == []
    payload = ray_fixture(DEAD)
    extra = copy.deepcopy(payload["data"]["result"]["result"][0])
    extra["actor_id"], extra["name"] = "ffff", "SERVE_REPLICA::modelonly#Model#zzzz9999"
    payload["data"]["result"]["result"].append(extra)
    use_replay.routes["/api/v0/actors"] = payload

    assert services.detect(cluster.pk) == [first]

    incident = Incident.objects.get(pk=first)
    assert incident.signal_count == 2 and incident.severity == "major"
    assert incident.oom_kills.count() == 2 and Incident.objects.count() == 1


@pytest.mark.django_db
def test_a_kill_right_after_a_change_suspects_the_rollout_first(cluster, people):
    ChangeFactory(
        cluster=cluster,
        targets=[{"application": "modelonly", "deployment": "Model"}],
        reason="bigger batches",
        state="succeeded",
        started_at=timezone.now() - timedelta(minutes=3),
    )
    [incident_id] = services.detect(cluster.pk)
    causes = Incident.objects.get(pk=incident_id).causes
    assert causes[0]["id"] == "OOM-7" and "3 min after change" in causes[0]["reason"]


@pytest.mark.django_db
def test_quiet_incidents_resolve_themselves(cluster, settings):
    [incident_id] = services.detect(cluster.pk)
    Incident.objects.filter(pk=incident_id).update(last_signal_at=timezone.now() - timedelta(hours=2))
    assert services.resolve_quiet() == 1
    incident = Incident.objects.get(pk=incident_id)
    assert incident.status == "resolved" and "automatically" in incident.timeline.last().message


@pytest.mark.django_db
def test_an_unreachable_metrics_endpoint_leaves_a_visible_warning(cluster, monkeypatch):
    def down(url, timeout_s, names=None):
        raise ray_metrics.MetricsUnavailable("http://ray.test:8080/metrics did not answer in time.", transient=True)

    monkeypatch.setattr(ingest.ray_metrics, "scrape", down)
    [incident_id] = services.detect(cluster.pk)
    assert "did not answer" in Incident.objects.get(pk=incident_id).evidence["metrics_warning"]


@pytest.mark.django_db
def test_an_open_incident_blocks_a_recycle_of_its_deployment(cluster, people):
    from apps.maintenance.guards import recycle_guards
    from apps.maintenance.models import MaintenanceRun

    services.detect(cluster.pk)
    deployment = Deployment.objects.get(application__cluster=cluster, application__name="modelonly", name="Model")
    run = MaintenanceRun(kind="recycle", trigger="manual", cluster=cluster, deployment=deployment)
    assert any("is open on this deployment" in reason for reason in recycle_guards(run, ["a", "b"], {}))


@pytest.mark.django_db
def test_the_api_filters_and_handles_incidents(api_as, cluster):
    [incident_id] = services.detect(cluster.pk)
    viewer, operator = api_as("viewer"), api_as("operator")
    assert [
        i["id"]
        for i in viewer.get("/api/v1/incidents/?status=open&kind=oom_kill&application=modelonly").json()["results"]
    ] == [incident_id]
    assert viewer.get("/api/v1/incidents/?application=demo").json()["results"] == []
    assert viewer.post(f"/api/v1/incidents/{incident_id}/acknowledge/").status_code == 403
    assert viewer.post(f"/api/v1/incidents/{incident_id}/notes/", {"text": "seen it"}, format="json").status_code == 201
    assert operator.post(f"/api/v1/incidents/{incident_id}/acknowledge/").json()["status"] == "acknowledged"
    resolved = operator.post(f"/api/v1/incidents/{incident_id}/resolve/").json()
    assert resolved["status"] == "resolved" and [e["kind"] for e in resolved["timeline"]] == [
        "detected",
        "note",
        "acknowledged",
        "resolved",
    ]
    assert operator.post(f"/api/v1/incidents/{incident_id}/resolve/").status_code == 400
    assert api_as("outsider").get(f"/api/v1/incidents/{incident_id}/").status_code == 404


@pytest.mark.django_db
def test_incident_pages_show_causes_kills_and_appear_on_the_cluster_page(client, people, cluster):
    [incident_id] = services.detect(cluster.pk)
    client.force_login(people["operator"])
    page = client.get(reverse("incidents:detail", args=[incident_id])).content.decode()
    assert "OOM-2" in page and "lg45rpy4" in page and "Acknowledge" in page and "Plan a fix" in page
    assert "OOM kill of modelonly/Model" in client.get(reverse("incidents:list")).content.decode()
    assert "Open incidents" in client.get(reverse("fleet:cluster", args=[cluster.pk])).content.decode()
    client.post(reverse("incidents:action", args=[incident_id, "note"]), {"text": "looking"})
    assert Incident.objects.get(pk=incident_id).timeline.filter(kind="note").exists()


# --- metrics readings and latency incidents --------------------------------------------------


def slower(scrape: ray_metrics.Scrape, at: float, extra: int = 60, over_ms: float = 5000) -> ray_metrics.Scrape:
    """The same counters plus `extra` demo/Model requests that all landed in the bucket ending at `over_ms`."""
    samples = []
    for s in scrape.samples:
        value = s.value
        model = s.labels.get("application") == "demo" and s.labels.get("deployment") == "Model"
        if (model and s.name == f"{metric_readings.LATENCY}_bucket" and float(s.labels["le"]) >= over_ms) or (
            model and s.name in (metric_readings.REQUESTS, f"{metric_readings.LATENCY}_count")
        ):
            value += extra
        samples.append(ray_metrics.Sample(s.name, s.labels, value))
    return ray_metrics.Scrape(at=at, samples=samples)


def test_old_points_are_summarized_and_points_past_retention_dropped():
    points = [
        {"t": float(t), "p99": float(t % 7), "rps": 1.0, "errors": 1, "starts": 0, "queued": 0, "ongoing": 0}
        for t in range(0, 7200, 30)
    ]
    compacted = metric_readings.compact(points, now=7200, raw_s=1800, bucket_s=300, retention_s=5400)
    raw = [p for p in compacted if "summary" not in p]
    summaries = [p for p in compacted if "summary" in p]
    assert all(p["t"] >= 5400 for p in raw) and len(raw) == 60
    assert summaries and all(1800 <= p["t"] < 5400 for p in summaries) and summaries[0]["errors"] == 10


@pytest.fixture
def metered(cluster):
    baseline = metrics("metrics_after_200_requests_filtered.prom", at=1000)
    return cluster, baseline


@pytest.mark.django_db
def test_a_sustained_slowdown_in_the_metrics_opens_a_latency_incident(metered, monkeypatch):
    from apps.incidents.models import SignalWindow

    cluster, base = metered
    scrapes = iter([base, slower(base, 1030, over_ms=5000)])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[
            {"t": 800 + 30 * i, "p99": 90.0 + i, "rps": 5.0, "queued": 0, "ongoing": 1, "starts": 0} for i in range(5)
        ]
        + [{"t": 990, "p99": 6000.0, "rps": 5.0, "queued": 3, "ongoing": 8, "starts": 0}],
    )

    assert ingest.collect_metrics(cluster.pk) == []  # the first scrape only sets the base
    [incident_id] = ingest.collect_metrics(cluster.pk)

    incident = Incident.objects.get(pk=incident_id)
    assert incident.kind == "latency_spike" and incident.deployment_name == "Model"
    assert incident.evidence["peak_p99_ms"] >= 5000 and incident.evidence["series"][-1]["rps"] == 2.0
    assert incident.causes[0]["id"] == "LAT-2"
    window = SignalWindow.objects.get(cluster=cluster, deployment_name="Model")
    assert 2000 < window.points[-1]["p99"] <= 5000


@pytest.mark.django_db
def test_an_unchanged_scrape_is_quiet_and_a_down_endpoint_is_recorded(metered, monkeypatch):
    from apps.incidents.models import ScrapeState

    cluster, base = metered
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: base)
    assert ingest.collect_metrics(cluster.pk) == [] and ingest.collect_metrics(cluster.pk) == []
    assert not Incident.objects.filter(kind="latency_spike").exists()

    def down(url, timeout_s, names=None):
        raise ray_metrics.MetricsUnavailable("http://ray.test:8080/metrics answered HTTP 502.", transient=True)

    monkeypatch.setattr(ingest.ray_metrics, "scrape", down)
    assert ingest.collect_metrics(cluster.pk) == []
    assert "502" in ScrapeState.objects.get(cluster=cluster).error


def test_latency_causes_put_a_cold_start_first_when_replicas_just_started():
    from apps.incidents.causes import LatencyContext, rank_latency_causes

    ctx = LatencyContext(
        cold_start=True,
        queue_building=False,
        ongoing=1,
        queued=0,
        max_ongoing_requests=2,
        running_replicas=1,
        at_max_replicas=False,
        memory_pressure=False,
    )
    assert [c["id"] for c in rank_latency_causes(ctx)][:1] == ["LAT-1"]
    blocked = LatencyContext(
        cold_start=False,
        queue_building=False,
        ongoing=1,
        queued=0,
        max_ongoing_requests=8,
        running_replicas=2,
        at_max_replicas=False,
        memory_pressure=True,
    )
    assert [c["id"] for c in rank_latency_causes(blocked)][:2] == ["LAT-6", "LAT-3"]


@pytest.mark.django_db
def test_an_incident_with_a_series_draws_charts_with_kill_markers(client, people, cluster):
    from apps.incidents.charts import chart_data
    from apps.incidents.models import SignalWindow

    now = timezone.now().timestamp()
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="modelonly",
        deployment_name="Model",
        points=[
            {"t": now - 30 * (5 - i), "p50": 40.0, "p99": 90.0 + i, "rps": 3.0, "ongoing": 2, "queued": 0}
            for i in range(6)
        ],
    )
    [incident_id] = services.detect(cluster.pk)
    incident = Incident.objects.get(pk=incident_id)

    chart = chart_data(incident)
    assert len(chart["latency"]["p99"]) == 6 and [k["replica"] for k in chart["kills"]] == ["lg45rpy4"]
    # The kill is drawn at the moment Fleetdeck saw it, on the same time axis as the readings.
    assert chart["start"] == int((now - 150) * 1000) and chart["end"] == chart["kills"][0]["t"]
    client.force_login(people["viewer"])
    page = client.get(reverse("incidents:detail", args=[incident_id])).content.decode()
    assert (
        "chartjs-4.6.1/chart.umd.min.js" in page
        and "js/incident_charts.js" in page
        and 'id="incident-chart-data"' in page
    )


def test_an_incident_without_a_series_has_no_chart():
    from apps.incidents.charts import chart_data

    assert chart_data(Incident(evidence={})) is None


@pytest.mark.django_db
def test_incidents_filter_by_time_range(api_as, cluster):
    [incident_id] = services.detect(cluster.pk)
    viewer = api_as("viewer")
    later = (timezone.now() + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    earlier = (timezone.now() - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    assert [i["id"] for i in viewer.get(f"/api/v1/incidents/?since={earlier}&until={later}").json()["results"]] == [
        incident_id
    ]
    assert viewer.get(f"/api/v1/incidents/?since={later}").json()["results"] == []


def with_memory(
    scrape: ray_metrics.Scrape, at: float, fraction: float, gpu: tuple[float, float] | None = None
) -> ray_metrics.Scrape:
    samples = []
    for s in scrape.samples:
        value = s.value
        if s.name == metric_readings.MEM_USED:
            total = next(t.value for t in scrape.samples if t.name == metric_readings.MEM_TOTAL)
            value = total * fraction
        samples.append(ray_metrics.Sample(s.name, s.labels, value))
    if gpu:
        samples += [
            ray_metrics.Sample(metric_readings.GRAM_USED, {"ip": "192.0.2.2", "GpuIndex": "0"}, gpu[0]),
            ray_metrics.Sample(metric_readings.GRAM_AVAILABLE, {"ip": "192.0.2.2", "GpuIndex": "0"}, gpu[1]),
        ]
    return ray_metrics.Scrape(at=at, samples=samples)


@pytest.mark.django_db
def test_sustained_node_memory_pressure_opens_a_node_incident(metered, monkeypatch, client, people):
    cluster, base = metered
    scrapes = iter([with_memory(base, 1000 + 30 * i, f) for i, f in enumerate([0.5, 0.93, 0.96])])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    touched = [ingest.collect_metrics(cluster.pk) for _ in range(3)]
    assert touched[:2] == [[], []]
    incident = Incident.objects.get(pk=touched[2][0])
    assert incident.kind == "memory_pressure" and incident.node_ip == "192.0.2.2" and incident.severity == "major"
    assert incident.causes[0]["id"] == "OOM-2" and "modelonly/Model (8)" in incident.causes[0]["reason"]
    client.force_login(people["viewer"])
    page = client.get(reverse("incidents:detail", args=[incident.pk])).content.decode()
    assert "node 192.0.2.2" in page and 'id="memory-chart"' in page


@pytest.mark.django_db
def test_gpu_memory_is_read_when_ray_reports_it(metered, monkeypatch):
    cluster, base = metered
    scrapes = iter(
        [with_memory(base, 1000 + 30 * i, 0.3, gpu=(g, 80_000 - g)) for i, g in enumerate([10_000, 77_000, 78_000])]
    )
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    touched = [ingest.collect_metrics(cluster.pk) for _ in range(3)]
    incident = Incident.objects.get(pk=touched[2][0])
    assert incident.kind == "memory_pressure" and "GPU memory at 98%" in incident.evidence["summary"]


@pytest.mark.django_db
def test_memory_that_only_grows_for_hours_opens_a_ratchet_incident_suspecting_oom5(metered, monkeypatch):
    from apps.incidents.models import NodeWindow

    cluster, base = metered
    NodeWindow.objects.create(
        cluster=cluster, node_ip="192.0.2.2", points=[{"t": 1000 + 3600 * h, "mem": 0.40 + 0.04 * h} for h in range(4)]
    )
    scrapes = iter([with_memory(base, 1000 + 3600 * 4, 0.58), with_memory(base, 1000 + 3600 * 4 + 30, 0.58)])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    ingest.collect_metrics(cluster.pk)
    [incident_id] = ingest.collect_metrics(cluster.pk)
    incident = Incident.objects.get(pk=incident_id)
    assert incident.kind == "memory_ratchet" and incident.causes[0]["id"] == "OOM-5"
    assert incident.causes[0]["remedies"][0]["id"] == "R8"


@pytest.mark.django_db
def test_the_timeline_shows_the_changes_and_recycles_around_the_incident(cluster, api_as, client, people):
    from apps.maintenance.models import MaintenanceRun

    deployment = Deployment.objects.get(application__cluster=cluster, application__name="modelonly", name="Model")
    change = ChangeFactory(
        cluster=cluster,
        targets=[{"application": "modelonly", "deployment": "Model"}],
        reason="bigger batches",
        state="succeeded",
        started_at=timezone.now(),
    )
    ChangeFactory(
        cluster=cluster,
        targets=[{"application": "demo", "deployment": "Echo"}],
        reason="other app",
        state="succeeded",
        new_hash="c",
    )
    run = MaintenanceRun.objects.create(
        kind="recycle", trigger="schedule", state="succeeded", cluster=cluster, deployment=deployment
    )
    [incident_id] = services.detect(cluster.pk)

    related = api_as("viewer").get(f"/api/v1/incidents/{incident_id}/").json()["related_work"]
    assert [(r["kind"], r["id"]) for r in related] == [("change", change.pk), ("maintenance", run.pk)]
    client.force_login(people["viewer"])
    assert "bigger batches" in client.get(reverse("incidents:detail", args=[incident_id])).content.decode()


@pytest.mark.django_db
def test_a_deployment_deleted_mid_incident_keeps_the_incident_by_name(cluster):
    [incident_id] = services.detect(cluster.pk)
    Deployment.objects.filter(application__cluster=cluster, application__name="modelonly").delete()
    incident = Incident.objects.get(pk=incident_id)
    assert incident.deployment is None and (incident.application_name, incident.deployment_name) == (
        "modelonly",
        "Model",
    )
    assert services.detect(cluster.pk) == []  # the same kill is not a new one


def test_a_huge_metrics_page_is_refused(monkeypatch):
    monkeypatch.setattr(ray_metrics, "MAX_BYTES", 1024)
    big = httpx.MockTransport(lambda request: httpx.Response(200, text="# HELP x\n" + "x 1\n" * 1000))
    with pytest.raises(ray_metrics.MetricsUnavailable, match="not a metrics page"):
        ray_metrics.scrape("http://ray.test:8080/metrics", transport=big)


@pytest.mark.django_db
def test_a_growing_queue_opens_a_queue_incident_before_latency_spikes(metered, monkeypatch):
    from apps.incidents.models import SignalWindow

    cluster, base = metered
    queued = ray_metrics.Scrape(
        at=1030,
        samples=[
            ray_metrics.Sample(
                s.name,
                s.labels,
                20.0 if s.name == metric_readings.QUEUED and s.labels.get("deployment") == "Model" else s.value,
            )
            for s in base.samples
        ],
    )
    scrapes = iter([base, queued])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[
            {"t": 900 + 30 * i, "p99": 90.0, "rps": 5.0, "queued": q, "ongoing": 8, "starts": 0}
            for i, q in enumerate([0, 0, 3, 9])
        ],
    )
    ingest.collect_metrics(cluster.pk)
    touched = ingest.collect_metrics(cluster.pk)
    incidents = Incident.objects.filter(pk__in=touched, kind="queue_buildup")
    model = incidents.get(deployment_name="Model")
    assert "3 → 9 → 20" in model.evidence["summary"] and model.causes[0]["id"] == "LAT-2"


# --- cluster sessions and config revisions made outside Fleetdeck ----------------------------------


def test_a_change_before_a_cluster_restart_or_replaced_outside_fleetdeck_is_not_a_cause():
    from apps.incidents.causes import ClusterHistory, RecentChange, change_in_effect

    now = timezone.now()
    older = RecentChange("change #1 (tune)", now - timedelta(minutes=9), session="session_a")
    change = RecentChange("change #2 (bigger batches)", now - timedelta(minutes=4), session="session_a")
    assert change_in_effect([older, change], ClusterHistory(session="session_a")) == (change, [])

    restarted, why = change_in_effect([older, change], ClusterHistory(session="session_b"))
    assert restarted is None and len(why) == 2
    assert why[0] == (
        "Change #2 (bigger batches) is not counted: it ran on Ray session session_a, and the cluster has restarted "
        "since (now session_b)."
    )
    # No sync saw the change's config run yet: a restart recorded after it is the evidence.
    unseen = RecentChange("change #2 (bigger batches)", now - timedelta(minutes=4))
    history = ClusterHistory(session="session_b", restarts=(now - timedelta(minutes=2),))
    assert change_in_effect([unseen], history)[1] == [
        "Change #2 (bigger batches) is not counted: the cluster restarted 2 min after it; every replica started "
        "again since."
    ]
    assert (
        change_in_effect([unseen], ClusterHistory(session="session_b", restarts=(now - timedelta(minutes=6),)))[0]
        == unseen
    )

    # A revision Fleetdeck did not make replaced change #2's config but not change #1's... which it also replaced.
    pushed_outside = ClusterHistory(session="session_a", foreign_revisions=(now - timedelta(minutes=3),))
    found, why = change_in_effect([older, change], pushed_outside)
    assert found is None and "1 min after it, the application's config changed outside Fleetdeck" in why[0]
    before_both = ClusterHistory(session="session_a", foreign_revisions=(now - timedelta(minutes=10),))
    assert change_in_effect([older, change], before_both)[0] == change


def serve_with(max_ongoing_requests: int, controller_started: float | None = None) -> dict:
    """The recovered cluster's Serve payload with modelonly/Model deployed at another
    max_ongoing_requests (submitted and effective), as a new config push shows it."""
    payload = ray_fixture("serve_applications_oom_t1_modelonly_after_recovery.json")
    app = payload["applications"]["modelonly"]
    app["deployed_app_config"]["deployments"][0]["max_ongoing_requests"] = max_ongoing_requests
    app["deployments"]["Model"]["deployment_config"]["max_ongoing_requests"] = max_ongoing_requests
    if controller_started is not None:
        payload["controller_health_metrics"]["controller_start_time"] = controller_started
    return payload


def pushed_change(cluster, minutes_ago: float, *, verified_minutes_ago: float | None = None) -> Change:
    """A change pushed `minutes_ago` whose rolling update was verified `verified_minutes_ago` (by
    default a few seconds ago: a model's replicas can take minutes to start, and the kill to come
    while old and new ones both hold memory)."""
    at = timezone.now() - timedelta(minutes=minutes_ago)
    verified = timezone.now() - timedelta(minutes=verified_minutes_ago if verified_minutes_ago is not None else 0.1)
    return ChangeFactory(
        cluster=cluster,
        targets=[{"application": "modelonly", "deployment": "Model"}],
        reason="bigger batches",
        state="succeeded",
        started_at=at,
        pushed_at=at,
        verified_at=verified,
        finished_at=verified,
    )


def new_session(use_replay, cluster) -> str:
    name = "session_2026-12-01_00-00-00_000000_1"
    use_replay.routes["/api/version"] = ray_fixture("version.json") | {"session_name": name}
    assert sync.sync_cluster(cluster.pk).ok
    return name


@pytest.mark.django_db
def test_a_kill_after_a_cluster_restart_does_not_blame_a_change_made_before_it(cluster, use_replay):
    change = pushed_change(cluster, minutes_ago=4)
    use_replay.routes["/api/serve/applications/"] = serve_with(4)
    sync.sync_cluster(cluster.pk)  # the change's config, seen running on the first session
    first = Cluster.objects.get(pk=cluster.pk).session_name
    second = new_session(use_replay, cluster)

    [incident_id] = services.detect(cluster.pk)

    incident = Incident.objects.get(pk=incident_id)
    assert "OOM-7" not in [c["id"] for c in incident.causes] and incident.causes[0]["id"] == "OOM-2"
    assert incident.evidence["changes_not_counted"] == [
        f"Change #{change.pk} (bigger batches) is not counted: it ran on Ray session {first}, and the cluster has "
        f"restarted since (now {second})."
    ]
    assert incident.evidence["session"]["name"] == second


@pytest.mark.django_db
@pytest.mark.parametrize("pushed_outside", [False, True])
def test_a_config_pushed_outside_fleetdeck_after_a_change_clears_the_change_but_the_change_s_own_revision_does_not(
    cluster, use_replay, pushed_outside
):
    from apps.fleet.models import ConfigRevision

    change = pushed_change(cluster, minutes_ago=4)
    use_replay.routes["/api/serve/applications/"] = serve_with(4)
    sync.sync_cluster(cluster.pk)  # change #N's own revision
    if pushed_outside:
        use_replay.routes["/api/serve/applications/"] = serve_with(16)
        sync.sync_cluster(cluster.pk)
    assert ConfigRevision.objects.filter(application__name="modelonly").count() == (3 if pushed_outside else 2)

    [incident_id] = services.detect(cluster.pk)

    causes = [c["id"] for c in Incident.objects.get(pk=incident_id).causes]
    evidence = Incident.objects.get(pk=incident_id).evidence
    if pushed_outside:
        assert "OOM-7" not in causes
        assert f"Change #{change.pk} (bigger batches) is not counted" in evidence["changes_not_counted"][0]
        assert "the application's config changed outside Fleetdeck" in evidence["changes_not_counted"][0]
    else:
        assert causes[0] == "OOM-7" and "changes_not_counted" not in evidence


@pytest.mark.django_db
def test_a_rollout_that_was_over_before_the_kill_is_not_a_cause_and_the_concurrency_ranks_first(cluster):
    # The first-day story: a change, a minute and more of quiet, then a burst that kills the replica.
    change = pushed_change(cluster, minutes_ago=3, verified_minutes_ago=2)

    [incident_id] = services.detect(cluster.pk)

    incident = Incident.objects.get(pk=incident_id)
    assert "OOM-7" not in [c["id"] for c in incident.causes]
    assert incident.causes[0]["id"] == "OOM-2"
    assert incident.evidence["changes_not_counted"] == [
        f"Change #{change.pk} (bigger batches) is not counted: its rolling update was over 2 min before the kill, "
        "so no replicas of two versions were alive together."
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["verifying", "pushing", "rolling_back"])
def test_a_rollout_still_running_at_the_kill_ranks_first(cluster, state):
    at = timezone.now() - timedelta(minutes=3)
    ChangeFactory(
        cluster=cluster,
        targets=[{"application": "modelonly", "deployment": "Model"}],
        reason="bigger batches",
        state=state,
        started_at=at,
        pushed_at=at,
    )
    [incident_id] = services.detect(cluster.pk)
    assert Incident.objects.get(pk=incident_id).causes[0]["id"] == "OOM-7"


@pytest.mark.django_db
@pytest.mark.parametrize("replaces", [False, True])
def test_a_change_just_verified_counts_only_if_it_started_new_replicas(cluster, replaces):
    # The README's story: `demo_config misbehaving` verified seconds before the burst that kills. It
    # changes concurrency, queue, autoscaling and user_config, which Serve applies to the running
    # replicas: no rollout, no two versions alive. A change of ray_actor_options starts new ones.
    base = {"applications": [{"name": "modelonly", "import_path": "app:m", "deployments": [{"name": "Model"}]}]}
    new = copy.deepcopy(base)
    model = new["applications"][0]["deployments"][0]
    model.update({"max_ongoing_requests": 16, "user_config": {"scratch_mb_per_request": 256}})
    if replaces:
        model["ray_actor_options"] = {"num_cpus": 0.5}
    change = pushed_change(cluster, minutes_ago=0.5)
    Change.objects.filter(pk=change.pk).update(base_config=base, new_config=new)

    [incident_id] = services.detect(cluster.pk)

    incident = Incident.objects.get(pk=incident_id)
    causes = [c["id"] for c in incident.causes]
    if replaces:
        assert causes[0] == "OOM-7"
    else:
        assert "OOM-7" not in causes and causes[0] == "OOM-2"
        assert incident.evidence["changes_not_counted"] == [
            f"Change #{change.pk} (bigger batches) is not counted: it changed only options Serve applies to the "
            "running replicas (concurrency, queue, autoscaling, user_config), so it started no new replicas and no "
            "two versions were alive together."
        ]


def test_a_rollout_counts_while_its_old_replicas_may_still_be_stopping():
    from apps.incidents.causes import OLD_REPLICAS_LINGER, ClusterHistory, RecentChange, change_in_effect

    kill = timezone.now()
    just_verified = RecentChange("change #3 (x)", kill - timedelta(minutes=5), ended_at=kill - timedelta(seconds=30))
    assert change_in_effect([just_verified], ClusterHistory(session="", killed_at=kill))[0] == just_verified
    long_over = RecentChange(
        "change #3 (x)", kill - timedelta(minutes=5), ended_at=kill - OLD_REPLICAS_LINGER - timedelta(seconds=1)
    )
    assert change_in_effect([long_over], ClusterHistory(session="", killed_at=kill))[0] is None


@pytest.mark.django_db
def test_a_change_that_never_reached_the_cluster_is_not_a_cause(cluster):
    ChangeFactory(
        cluster=cluster,
        targets=[{"application": "modelonly", "deployment": "Model"}],
        reason="bigger batches",
        state="drifted",
        started_at=timezone.now() - timedelta(minutes=3),
    )
    [incident_id] = services.detect(cluster.pk)
    assert "OOM-7" not in [c["id"] for c in Incident.objects.get(pk=incident_id).causes]


@pytest.mark.django_db
def test_the_timeline_shows_restarts_and_config_revisions_made_outside_fleetdeck_among_kills_and_changes(
    cluster, use_replay, api_as, client, people
):
    from apps.fleet.models import ConfigRevision

    change = pushed_change(cluster, minutes_ago=4)
    use_replay.routes["/api/serve/applications/"] = serve_with(4)
    sync.sync_cluster(cluster.pk)  # the change's own revision: not shown as one made outside Fleetdeck
    started = ray_fixture("serve_applications_oom_t1_modelonly_after_recovery.json")["controller_health_metrics"][
        "controller_start_time"
    ]
    use_replay.routes["/api/serve/applications/"] = serve_with(16, controller_started=started + 120)
    assert "controller_restarted" in sync.sync_cluster(cluster.pk).events
    outside = ConfigRevision.objects.filter(application__name="modelonly").order_by("-pk").first()
    new_session(use_replay, cluster)
    [incident_id] = services.detect(cluster.pk)

    related = api_as("viewer").get(f"/api/v1/incidents/{incident_id}/").json()["related_work"]
    assert [(r["kind"], r["id"]) for r in related if r["kind"] in ("change", "config_revision")] == [
        ("change", change.pk),
        ("config_revision", outside.pk),
    ]
    # The sync that saw the controller restart saw the config pushed outside Fleetdeck too.
    assert [r["kind"] for r in related] == ["change", "controller_restart", "config_revision", "cluster_restart"]
    assert "changed outside Fleetdeck" in next(r["text"] for r in related if r["kind"] == "config_revision")

    client.force_login(people["viewer"])
    page = client.get(reverse("incidents:detail", args=[incident_id])).content.decode()
    timeline = page[page.index("<h2>Timeline</h2>") :]
    order = [
        timeline.index(text)
        for text in (
            f"Change #{change.pk}",
            "Serve controller restarted",
            "changed outside Fleetdeck",
            "Ray cluster restarted",
            "killed by Ray&#x27;s memory monitor",
        )
    ]
    assert order == sorted(order)
    assert reverse("fleet:revision", args=[outside.pk]) in timeline


@pytest.mark.django_db
def test_an_oom_incident_charts_node_memory_against_the_kill_threshold_and_memory_per_replica_within_its_session(
    cluster, use_replay, client, people, monkeypatch
):
    from apps.clusters.models import ClusterEvent
    from apps.incidents.charts import chart_data
    from apps.incidents.models import NodeWindow, SignalWindow

    new_session(use_replay, cluster)
    restarted = timezone.now() - timedelta(minutes=10)
    ClusterEvent.objects.filter(cluster=cluster, kind=ClusterEvent.Kind.SESSION_CHANGED).update(created_at=restarted)
    now = timezone.now().timestamp()
    times = [now - 3600 + 30 * i for i in range(121)]  # an hour of readings, most from the session before
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="modelonly",
        deployment_name="Model",
        points=[
            {"t": t, "p50": 40.0, "p99": 90.0, "rps": 3.0, "ongoing": 2, "queued": 0, "rss_mb": 1200.0, "replicas": 2}
            for t in times
        ],
    )
    NodeWindow.objects.create(
        cluster=cluster,
        node_ip="192.0.2.2",
        points=[
            {"t": t, "mem": 0.3, "mem_used": 7.0 * 2**30, "mem_total": 23.5 * 2**30, "gpu": None, "evictions": 0}
            for t in times
        ],
    )

    [incident_id] = services.detect(cluster.pk)
    incident = Incident.objects.get(pk=incident_id)
    chart = chart_data(incident)

    # Only the readings of the session the kill happened in.
    assert chart["start"] >= int(restarted.timestamp() * 1000) and len(chart["latency"]["p99"]) == 21
    [node] = chart["nodes"]
    assert node["ip"] == "192.0.2.2" and node["used_gib"][0][1] == 7.0 and node["total_gib"] == 23.5
    assert node["threshold_gib"] == round(7582819328 / 2**30, 3)  # the threshold in Ray's kill message
    [kill] = chart["kills"]
    assert kill["node_gib"] == round(7595319296 / 2**30, 3) and kill["replica_mib"] == round(
        int(5.48 * 2**30) / 2**20, 1
    )
    # 1,200 decimal MB over two replicas.
    assert chart["replica_mib"][0][1] == round(600e6 / 2**20, 1)
    client.force_login(people["viewer"])
    page = client.get(reverse("incidents:detail", args=[incident_id])).content.decode()
    assert (
        'id="node-memory-chart"' in page and 'id="replica-memory-chart"' in page and "from its Ray session only" in page
    )

    # Later readings follow into the open incident's evidence: whether memory came back down after the kill.
    later = metrics("metrics_after_oom_kills_filtered.prom", at=now + 30)
    scrapes = iter([metrics("metrics_after_oom_kills_filtered.prom", at=now), later])
    monkeypatch.setattr(ingest.ray_metrics, "scrape", lambda url, timeout_s, names=None: next(scrapes))
    ingest.collect_metrics(cluster.pk)
    ingest.collect_metrics(cluster.pk)
    evidence = Incident.objects.get(pk=incident_id).evidence
    assert evidence["series"][-1]["t"] == round(now + 30, 1) and evidence["node_memory"]["192.0.2.2"][-1]["t"] == round(
        now + 30, 1
    )
