"""A person's path through the UI: log in, see the fleet, open a cluster, see its applications.
Playwright drives Debian's Chromium (scripts/install-browser.sh installs it)."""

from __future__ import annotations

import pytest

from apps.fleet import sync
from tests.browser.pages import log_in, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.django_db(transaction=True)]


def test_an_operator_logs_in_and_sees_the_clusters_applications(page, live_server, api_as, ray_head):
    response = api_as("admin").post(
        "/api/v1/clusters/",
        {"name": "local-ray", "team": "vision", "dashboard_url": ray_head.dashboard_url, "labels": {"env": "test"}},
        format="json",
    )
    assert response.status_code == 201
    sync.sync_cluster(response.json()["id"])

    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")

    row = page.locator("#cluster-rows tr", has_text="local-ray")
    row.wait_for()
    assert "Reachable" in row.inner_text()
    assert "2.60.0" in row.inner_text()

    page.click("text=local-ray")
    page.wait_for_selector("h2:text('demo')")
    assert page.locator("h2", has_text="echo2").count() == 1
    model_row = page.locator("tr", has_text="Model")
    assert "HEALTHY" in model_row.inner_text()
    assert "1 / 2 / 4" in model_row.inner_text()

    # "Sync now" posts through htmx and swaps the live status block in place.
    page.click("text=Sync now")
    wait_until(page, "document.querySelector('#cluster-status') !== null")
    assert page.locator("#cluster-status h2", has_text="demo").count() == 1

    page.click("text=Model")
    page.wait_for_selector("text=Effective config")
    assert "graceful_shutdown_timeout_s" in page.content()


def test_a_viewer_with_no_team_sees_a_designed_empty_state(page, live_server, people):
    log_in(page, live_server, "outsider")
    page.wait_for_selector("text=No clusters are visible to you yet")


def test_an_operator_plans_reviews_and_applies_a_change_in_the_browser(page, live_server, api_as, ray_head, settings):
    from celery.contrib.testing.worker import start_worker

    from apps.changes.models import Change
    from controlplane.celery import app as celery_app
    from tests.conftest import two_app_config

    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    cluster_id = (
        api_as("admin")
        .post(
            "/api/v1/clusters/",
            {"name": "local-ray", "team": "vision", "dashboard_url": ray_head.dashboard_url},
            format="json",
        )
        .json()["id"]
    )
    sync.sync_cluster(cluster_id)
    celery_app.control.purge()
    try:
        with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            log_in(page, live_server, "operator")
            page.goto(f"{live_server.url}/clusters/{cluster_id}/")
            page.click("text=Model")
            page.click("text=Plan a change")
            assert page.is_checked("input[value='demo/Model']")
            page.fill("textarea[name=options_text]", "max_queued_requests: 12")
            page.fill("textarea[name=reason]", "bound the queue (browser test)")
            page.click("text=Plan and show the diff")
            page.wait_for_selector("text=Diff of the full config")
            assert page.locator(".diff-add", has_text='"max_queued_requests": 12').count() == 1
            page.click("button:text('Apply')")
            page.wait_for_selector("#change-progress .badge:text('Succeeded')", timeout=90_000)
            assert "Verified" in page.locator("#change-progress").inner_text()
            assert Change.objects.get().state == "succeeded"
    finally:
        ray_head.deploy(two_app_config())


def test_an_incident_page_draws_its_evidence_charts(page, live_server, team, people):
    from django.utils import timezone

    from apps.clusters.models import Cluster
    from apps.incidents.models import Incident

    cluster = Cluster.objects.create(
        name="gpu-prod", team=team, dashboard_url="http://127.0.0.1:9", ray_version="2.60.0"
    )
    now = timezone.now()
    series = [
        {
            "t": now.timestamp() - 30 * (20 - i),
            "p50": 40.0 + i,
            "p99": 90.0 + (900 if i > 16 else 0),
            "rps": 3.0,
            "ongoing": 2 + (6 if i > 16 else 0),
            "queued": 4 if i > 16 else 0,
        }
        for i in range(20)
    ]
    incident = Incident.objects.create(
        kind="latency_spike",
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        title="Latency spike of demo/Model on gpu-prod",
        started_at=now,
        last_signal_at=now,
        evidence={"series": series},
        causes=[],
    )
    log_in(page, live_server, "viewer")
    page.goto(f"{live_server.url}/incidents/{incident.pk}/")
    wait_until(page, "window.Chart && Chart.getChart('latency-chart') && Chart.getChart('load-chart')")
    datasets = page.evaluate("Chart.getChart('latency-chart').data.datasets.map(d => d.label)")
    assert datasets == ["p50 ms", "p99 ms"]  # no kill markers on a latency incident
    axes = (
        "(id) => Object.fromEntries(Object.entries(Chart.getChart(id).options.scales)"
        ".map(([k, s]) => [k, s.title.text]))"
    )
    assert page.evaluate(axes, "latency-chart") == {"x": "time", "y": "latency (ms)"}
    # A rate and a count are different units: requests/s has an axis of its own.
    assert page.evaluate(axes, "load-chart") == {"x": "time", "y": "requests", "rate": "requests/s"}
    page.screenshot(path="/tmp/incident-chart.png", full_page=True)


def test_an_oom_incident_page_charts_node_memory_against_the_threshold_and_memory_per_replica(
    page, live_server, team, people
):
    from django.utils import timezone

    from apps.clusters.models import Cluster
    from apps.incidents.models import Incident, OomKillRecord

    cluster = Cluster.objects.create(
        name="gpu-prod", team=team, dashboard_url="http://127.0.0.1:9", ray_version="2.60.0"
    )
    now = timezone.now()
    times = [now.timestamp() - 30 * (20 - i) for i in range(20)]
    series = [
        {
            "t": t,
            "p50": 40.0,
            "p99": 90.0,
            "rps": 3.0,
            "ongoing": 2,
            "queued": 0,
            "rss_mb": 900.0 + 100 * i,
            "replicas": 1,
        }
        for i, t in enumerate(times)
    ]
    nodes = {
        "192.0.2.2": [
            {"t": t, "mem_used": (5 + 0.1 * i) * 2**30, "mem_total": 23.5 * 2**30} for i, t in enumerate(times)
        ]
    }
    incident = Incident.objects.create(
        kind="oom_kill",
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        title="OOM kill of demo/Model on gpu-prod",
        started_at=now,
        last_signal_at=now,
        evidence={"series": series, "node_memory": nodes, "session": {"name": "s", "started_at": None}},
        causes=[],
    )
    OomKillRecord.objects.create(
        incident=incident,
        actor_id="a1",
        replica="r1",
        node_ip="192.0.2.2",
        used_bytes=7 * 2**30,
        threshold_bytes=int(6.9 * 2**30),
        message="",
    )
    log_in(page, live_server, "viewer")
    page.goto(f"{live_server.url}/incidents/{incident.pk}/")
    wait_until(page, "window.Chart && Chart.getChart('node-memory-chart') && Chart.getChart('replica-memory-chart')")
    node = page.evaluate(
        "(() => { const c = Chart.getChart('node-memory-chart'); return {labels: c.data.datasets.map(d => d.label), "
        "unit: c.options.scales.y.title.text}; })()"
    )
    assert node == {
        "labels": [
            "memory used",
            "Ray's memory monitor kills above",
            "node total",
            "OOM kill (node memory Ray reported)",
        ],
        "unit": "node memory (GiB)",
    }
    assert (
        page.evaluate("Chart.getChart('replica-memory-chart').options.scales.y.title.text")
        == "memory per replica (MiB)"
    )
    # The latency chart shares the time axis and marks the kill too.
    assert page.evaluate("Chart.getChart('latency-chart').data.datasets.map(d => d.label)") == [
        "p50 ms",
        "p99 ms",
        "OOM kill",
    ]
    page.screenshot(path="/tmp/incident-oom-chart.png", full_page=True)


def test_the_incident_filters_submit_when_a_select_changes_under_the_csp(page, live_server, people):
    log_in(page, live_server, "viewer", "/incidents/")
    page.wait_for_selector("select[name=kind]")
    # An inline onchange handler would be blocked by the page's script-src; the delegated one is not.
    with page.expect_navigation():
        page.select_option("select[name=kind]", "oom_kill")
    assert "kind=oom_kill" in page.url


def test_a_node_memory_incident_charts_memory_as_a_share_with_its_unit_on_the_axis(page, live_server, team, people):
    from django.utils import timezone

    from apps.clusters.models import Cluster
    from apps.incidents.models import Incident

    cluster = Cluster.objects.create(
        name="gpu-prod", team=team, dashboard_url="http://127.0.0.1:9", ray_version="2.60.0"
    )
    now = timezone.now()
    series = [{"t": now.timestamp() - 30 * (20 - i), "mem": 0.5 + i * 0.02, "gpu": None} for i in range(20)]
    incident = Incident.objects.create(
        kind="memory_pressure",
        cluster=cluster,
        node_ip="10.0.0.7",
        title="Memory pressure on 10.0.0.7",
        started_at=now,
        last_signal_at=now,
        evidence={"node_series": series},
        causes=[],
    )
    log_in(page, live_server, "viewer", f"/incidents/{incident.pk}/")
    wait_until(page, "window.Chart && Chart.getChart('memory-chart')")
    y = "Chart.getChart('memory-chart').scales.y"
    assert page.evaluate(f"{y}.options.title.text") == "memory used (%)"
    assert page.evaluate(f"{y}.ticks.map((t) => t.label)")[-1] == "100 %"
    assert page.evaluate("Chart.getChart('memory-chart').options.scales.x.title.text") == "time"
