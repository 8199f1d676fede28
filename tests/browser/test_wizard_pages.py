"""An operator in the browser: from an OOM incident to the wizard, through its steps with htmx,
applying R1 + R2 as one change. The dashboard is replayed from captured payloads."""

from __future__ import annotations

import pytest

from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents import services as incidents
from apps.incidents.models import Incident
from apps.remediation.models import Wizard
from tests.unit.test_wizards import DEAD, Live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def incident(team, use_replay):
    use_replay.routes["/api/serve/applications/"] = Live()
    use_replay.routes["/api/v0/actors"] = DEAD
    cluster = Cluster.objects.create(name="gpu-prod", team=team, dashboard_url="http://ray.test:8265", ray_version="2.60.0")
    sync.sync_cluster(cluster.pk)
    incidents.detect(cluster.pk)
    return Incident.objects.get(application_name="demo", deployment_name="Model")


def test_an_operator_opens_the_wizard_from_the_incident_and_applies_r1_and_r2(page, live_server, people, incident):
    page.goto(f"{live_server.url}/accounts/login/?next=/incidents/{incident.pk}/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    page.click("text=Fix with a wizard")
    page.wait_for_selector("h2:text('R1: Cap per-replica concurrency')")
    assert "Why this value" in page.content()

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
