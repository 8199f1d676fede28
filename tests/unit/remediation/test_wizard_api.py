"""Remediation wizards through the API: automation drives one, roles, and the schema."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.calibration.models import MemoryCalibration
from apps.remediation import remedy_checks
from apps.remediation.models import Finding
from integrations import serve_http
from tests.unit.remediation.wizard_helpers import (
    MIB,
    incidents_deployment,
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


@pytest.fixture
def probes(monkeypatch):
    """What the checks send to the cluster's Serve proxy, each answered with a 413."""
    sent = []

    def send(base_url, **request):
        sent.append(request)
        return [serve_http.Sample(0, 413, 12.0)]

    monkeypatch.setattr(remedy_checks.serve_http, "send", send)
    return sent


@pytest.fixture
def wizard_for(api_as, incident, cluster):
    """A wizard with the remedy's step: R3 for the OOM kill, R6 for cold starts without a warmup."""

    def start(remedy: str) -> dict:
        if remedy == "R3":
            return api_as("operator").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
        finding = Finding.objects.create(
            cluster=cluster,
            deployment=incidents_deployment(cluster),
            application_name="demo",
            deployment_name="Model",
            rule="warmup-missing",
            severity="warning",
        )
        return api_as("operator").post("/api/v1/wizards/", {"finding": finding.pk}, format="json").json()

    return start


def step_of(wizard: dict, remedy: str) -> dict:
    return next(s for s in wizard["steps"] if s["remedy"] == remedy)


def run_check(client, wizard: dict, remedy: str, params: dict):
    body = {"step": step_of(wizard, remedy)["position"], "params": params}
    return client.post(f"/api/v1/wizards/{wizard['id']}/check/", body, format="json")


WITHIN_BOUNDS = {"R3": {"size": 5000, "timeout_s": "12.5"}, "R6": {"factor": 4}}


@pytest.mark.parametrize(
    "remedy, params, field",
    [
        ("R3", {"timeout_s": 1e9}, "timeout_s"),
        ("R3", {"timeout_s": "nan"}, "timeout_s"),
        ("R3", {"timeout_s": "inf"}, "timeout_s"),
        ("R3", {"timeout_s": 0.01}, "timeout_s"),
        ("R3", {"timeout_s": True}, "timeout_s"),
        ("R6", {"factor": "abc"}, "factor"),
        ("R6", {"factor": "nan"}, "factor"),
        ("R6", {"factor": 1e9}, "factor"),
        ("R6", {"factor": [3]}, "factor"),
    ],
)
def test_a_check_parameter_that_is_no_number_within_its_bounds_is_a_400_naming_it_and_sends_nothing(
    api_as, wizard_for, probes, remedy, params, field
):
    operator = api_as("operator")
    wizard = wizard_for(remedy)
    refused = run_check(operator, wizard, remedy, params)
    assert refused.status_code == 400
    (message,) = refused.json()["detail"]
    assert message.startswith(f"{field} must be a number") and "between 1 and" in message
    assert probes == []
    assert not step_of(operator.get(f"/api/v1/wizards/{wizard['id']}/").json(), remedy)["check_result"]
    assert run_check(operator, wizard, remedy, WITHIN_BOUNDS[remedy]).status_code == 200


def test_the_oversized_input_probe_waits_the_timeout_it_was_given_within_bounds(api_as, wizard_for, probes):
    probed = run_check(api_as("operator"), wizard_for("R3"), "R3", WITHIN_BOUNDS["R3"])
    assert probed.status_code == 200, probed.content
    assert step_of(probed.json(), "R3")["status"] == "passed" and probes[0]["timeout_s"] == 12.5


def test_the_cold_start_check_runs_with_a_factor_within_bounds(api_as, wizard_for):
    checked = run_check(api_as("operator"), wizard_for("R6"), "R6", WITHIN_BOUNDS["R6"])
    assert checked.status_code == 200, checked.content
    assert step_of(checked.json(), "R6")["check_result"]["result"] == "inconclusive"
