"""An operator in the browser: from an OOM incident to the wizard, through its calibration step
and the values computed from it, applying R1 + R2 as one change. The dashboard is replayed from
captured payloads; the calibration job's result is stored as polling would store it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.calibration.models import MemoryCalibration
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents import services as incidents
from apps.incidents.models import Incident
from apps.remediation.models import Wizard
from tests.browser.pages import log_in
from tests.unit.remediation.wizard_helpers import DEAD, Live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def incident(team, use_replay):
    use_replay.routes["/api/serve/applications/"] = Live()
    use_replay.routes["/api/v0/actors"] = DEAD
    for path, payload in (
        ("/api/v0/nodes", "state_nodes.json"),
        ("/nodes", "nodes_view_summary.json"),
        ("/api/cluster_status", "cluster_status.json"),
        ("/api/jobs/", "jobs_submit_response.json"),
    ):
        use_replay.routes[path] = payload
    cluster = Cluster.objects.create(
        name="gpu-prod", team=team, dashboard_url="http://ray.test:8265", ray_version="2.60.0"
    )
    sync.sync_cluster(cluster.pk)
    incidents.detect(cluster.pk)
    return Incident.objects.get(application_name="demo", deployment_name="Model")


def test_an_operator_opens_the_wizard_from_the_incident_and_applies_r1_and_r2(page, live_server, people, incident):
    log_in(page, live_server, "operator", f"/incidents/{incident.pk}/")
    page.click("text=Fix with a wizard")
    # Nothing measured: the wizard's first step is the calibration, and R1 has no value yet.
    page.wait_for_selector("h2:text('Measure memory per request (calibration)')")
    page.click("button:text('Calibrate')")
    page.wait_for_selector(".wizard-steps .badge:text('Measuring')")
    run = MemoryCalibration.objects.get()
    assert run.request["representative"]["kind"] == "handle" and run.deployment_name == "Model"
    # The job on the cluster reports its curve; polling stores it and the wizard recomputes.
    MemoryCalibration.objects.filter(pk=run.pk).update(
        state="succeeded",
        axis="concurrency",
        device="cpu",
        shape="handle",
        baseline_bytes=200 * 2**20,
        finished_at=timezone.now(),
        points=[{"x": k, "peak_bytes": (200 + 800 * k) * 2**20, "service_s": 1.0} for k in (1, 2, 4)],
    )
    page.click(".wizard-steps >> text=Diagnosis")
    page.click("text=Recompute from the latest measurements")
    page.wait_for_selector(".wizard-steps li:nth-child(2) .badge:text('Measured')")
    page.click(".wizard-steps >> text=R1 · Config remedy")
    page.wait_for_selector("h2:text('R1: Cap per-replica concurrency')")
    assert "Why this value" in page.content() and "Weighed:" in page.content()

    # Every step is reachable again; htmx swaps the panel and the URL follows.
    page.click(".wizard-steps >> text=R3 · Code-level remedy")
    page.wait_for_selector("text=Run the automatic check")
    assert "step=" in page.url
    page.click(".wizard-steps >> text=Diagnosis")
    page.wait_for_selector("text=What the values are computed from")
    page.screenshot(path="/tmp/fleetdeck-wizard.png", full_page=True)

    page.click(".wizard-steps >> text=R1 · Config remedy")
    page.click("text=Apply R1 + R2 as one change")
    page.wait_for_selector(".wizard-steps .badge:text('Applying')")
    wizard = Wizard.objects.get()
    assert {s.status for s in wizard.steps.filter(remedy__in=["R1", "R2"])} == {"applying"}
    assert wizard.steps.get(remedy="R1").change.state == "queued"
