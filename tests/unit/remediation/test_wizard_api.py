"""Remediation wizards through the API: automation drives one, roles, and the schema."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.calibration.models import MemoryCalibration
from tests.unit.remediation.wizard_helpers import (
    MIB,
)

pytestmark = pytest.mark.django_db


def test_automation_drives_a_wizard_through_the_api(api_as, incident, use_replay):
    operator = api_as("operator")
    response = operator.post(
        "/api/v1/wizards/",
        {"incident": incident.pk, "verification_window_s": 60, "failure_objective": 0.02},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["failure_objective"] == 0.02 and body["steps"][1]["kind"] == "calibration"
    assert operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").status_code == 200
    # The first step measures memory: a calibration job on the cluster, with Fleetdeck's default request.
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    started = operator.post(f"/api/v1/wizards/{body['id']}/calibrate/", {"revision": body["revision"]}, format="json")
    assert started.status_code == 202, started.content
    step = started.json()["steps"][1]
    assert step["status"] == "applying" and step["calibration"]
    run = MemoryCalibration.objects.get(pk=step["calibration"])
    assert run.deployment_name == "Model" and run.state == "pending"
    # The job reports its curve (what polling stores); the wizard computes its values from it.
    MemoryCalibration.objects.filter(pk=run.pk).update(
        state="succeeded",
        axis="concurrency",
        device="cpu",
        baseline_bytes=200 * MIB,
        finished_at=timezone.now(),
        points=[{"x": k, "peak_bytes": (200 + 800 * k) * MIB, "service_s": 1.0} for k in (1, 2, 4)],
    )
    body = operator.post(f"/api/v1/wizards/{body['id']}/replan/", {}, format="json").json()
    assert body["steps"][1]["status"] == "done" and not body["diagnosis"]["needs_calibration"]
    steps = {s["remedy"]: s for s in body["steps"] if s["remedy"]}
    assert (
        steps["R1"]["patch"]["max_ongoing_requests"] >= 1
        and steps["R2"]["patch"]["autoscaling_config"]["max_replicas"] >= 1
    )
    # A measurement is not a fix: there is nothing to verify yet.
    early = operator.post(f"/api/v1/wizards/{body['id']}/verify/", {"window_s": 60}, format="json")
    assert early.status_code == 400 and "nothing to verify" in early.json()["detail"][0]
    applied = operator.post(
        f"/api/v1/wizards/{body['id']}/apply/",
        {"steps": [steps["R1"]["position"], steps["R2"]["position"]], "revision": body["revision"]},
        format="json",
    )
    assert applied.status_code == 202, applied.content
    assert {s["status"] for s in applied.json()["steps"] if s["remedy"] in ("R1", "R2")} == {"applying"}
    stale = operator.post(
        f"/api/v1/wizards/{body['id']}/skip/",
        {"step": steps["R5"]["position"], "note": "x", "revision": body["revision"]},
        format="json",
    )
    assert stale.status_code == 409 and "moved on" in stale.json()["detail"][0]
    refused = operator.post(f"/api/v1/wizards/{body['id']}/verify/", {"window_s": 60}, format="json")
    assert refused.status_code == 400 and "still being applied" in refused.json()["detail"][0]
    assert operator.get(f"/api/v1/wizards/?incident={incident.pk}").json()["count"] == 1


def test_wizard_roles_viewers_read_operators_act_outsiders_see_nothing(api_as, incident):
    wizard_id = api_as("operator").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()["id"]
    assert api_as("viewer").get(f"/api/v1/wizards/{wizard_id}/").status_code == 200
    assert (
        api_as("viewer").post(f"/api/v1/wizards/{wizard_id}/abandon/", {"reason": "x"}, format="json").status_code
        == 403
    )
    assert api_as("outsider").get(f"/api/v1/wizards/{wizard_id}/").status_code == 404
    assert api_as("outsider").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").status_code == 400
    assert api_as("viewer").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").status_code == 403
    abandoned = api_as("admin").post(
        f"/api/v1/wizards/{wizard_id}/abandon/", {"reason": "handled by hand"}, format="json"
    )
    assert abandoned.json()["state"] == "abandoned" and "handled by hand" in abandoned.json()["outcome"]


def test_the_schema_documents_the_wizard_actions(api_as):
    schema = api_as("viewer").get(reverse("schema"), {"format": "json"}).json()
    paths = schema["paths"]
    assert {
        "/api/v1/wizards/",
        "/api/v1/wizards/{id}/apply/",
        "/api/v1/wizards/{id}/verify/",
        "/api/v1/wizards/{id}/check/",
    } <= set(paths)
