"""The deployment page's request-size chart: drawn from a script file the page loads (the `page`
fixture fails on anything the content security policy blocks), one line per percentile, each point
a reading of the deployment's signal window."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.incidents.models import SignalWindow
from tests.browser.pages import log_in, wait_until
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
CHART = "Chart.getChart(document.getElementById('request-sizes-chart'))"


def test_the_request_size_percentiles_are_drawn_per_reading(page, live_server, people, team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    model = Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")
    Deployment.objects.filter(pk=model.pk).update(size_metric="ray_demo_request_bytes", size_unit="bytes")
    now = time.time()
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[
            {"t": now - 90, "seconds": 30, "size_in": {"1024": 10.0, "4096": 0.0}},
            {"t": now - 60, "seconds": 30},  # no request counted: no point
            {"t": now - 30, "seconds": 30, "size_in": {"1024": 2.0, "4096": 8.0}},
        ],
    )
    log_in(page, live_server, "viewer", reverse("fleet:deployment", args=[model.pk]))
    page.wait_for_selector("#request-sizes-chart")
    wait_until(page, f"!!{CHART}")
    labels = page.evaluate(f"{CHART}.data.datasets.map((d) => d.label)")
    assert labels == ["p50", "p90", "p99"]
    p50 = page.evaluate(f"{CHART}.data.datasets[0].data.map((point) => Math.round(point.y))")
    # 10 requests up to 1 KiB: p50 at half of it. Then 2 up to 1 KiB and 8 above: the 5th is 3/8 into 1-4 KiB.
    assert p50 == [512, 2176]
    assert page.evaluate(f"{CHART}.options.scales.y.title.text") == "bytes"
