"""Calibrations through the API: who may request one, refusals, filters and query counts."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.calibration import services
from apps.calibration.models import MemoryCalibration
from tests.unit.calibration.helpers import MIB, job_says, result_line


def test_an_operator_calibrates_through_the_api_and_gets_202(api_as, model):
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": model.pk, "levels": [1, 2], "call": "hi"}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "pending" and body["levels"] == [1, 2] and body["request"]["call"] == "hi"
    assert body["per_unit_bytes"] is None


def test_automation_calibrates_by_token_sum_through_the_api(api_as, model):
    operator = api_as("operator")
    response = operator.post(
        "/api/v1/calibrations/", {"deployment": model.pk, "axis": "token_sum", "levels": [512, 2048]}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["axis"] == "token_sum" and response.json()["levels"] == [512, 2048]
    MemoryCalibration.objects.all().delete()
    refused = operator.post("/api/v1/calibrations/", {"deployment": model.pk, "axis": "pixels"}, format="json")
    assert refused.status_code == 400 and "axis" in refused.json()
    too_big = operator.post(
        "/api/v1/calibrations/", {"deployment": model.pk, "axis": "token_sum", "levels": [100_000]}, format="json"
    )
    assert too_big.status_code == 400 and "between 1 and 65,536" in too_big.json()["detail"][0]


def test_a_viewer_cannot_calibrate(api_as, model):
    response = api_as("viewer").post("/api/v1/calibrations/", {"deployment": model.pk}, format="json")
    assert response.status_code == 403 and "operator role" in response.json()["detail"][0]


def test_an_outsider_sees_no_calibration_and_cannot_request_one(api_as, model, operator):
    services.request_calibration(operator, model)
    assert api_as("outsider").get("/api/v1/calibrations/").json()["count"] == 0
    response = api_as("outsider").post("/api/v1/calibrations/", {"deployment": model.pk}, format="json")
    # Exactly what naming a deployment that does not exist answers.
    assert response.status_code == 400 and response.json() == {
        "deployment": [f'Invalid pk "{model.pk}" - object does not exist.']
    }


def test_service_refusals_come_back_as_400_with_the_reason(api_as, model, operator):
    services.request_calibration(operator, model)
    response = api_as("operator").post("/api/v1/calibrations/", {"deployment": model.pk}, format="json")
    assert response.status_code == 400 and "already running" in response.json()["detail"][0]


def test_the_list_filters_by_deployment_and_cluster_and_shows_the_curve(
    api_as, model, operator, use_replay, other_team
):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    viewer = api_as("viewer")
    listed = viewer.get(f"/api/v1/calibrations/?deployment={model.pk}").json()
    assert listed["count"] == 1 and listed["results"][0]["per_unit_bytes"] == 64 * MIB
    assert listed["results"][0]["points"][0] == {"x": 1, "peak_bytes": 164 * MIB}
    assert viewer.get(f"/api/v1/calibrations/?cluster={model.application.cluster_id + 1}").json()["count"] == 0
    assert viewer.get(f"/api/v1/calibrations/{calibration.pk}/").json()["state"] == "succeeded"


def test_the_list_costs_the_same_queries_for_one_or_many(api_as, model, operator, use_replay):
    def count_queries() -> int:
        client = api_as("viewer")
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/calibrations/").status_code == 200
        return len(queries)

    first = services.request_calibration(operator, model)
    job_says(use_replay, first, "SUCCEEDED", logs=result_line())
    services.poll(first.pk)
    one = count_queries()
    for _ in range(3):
        extra = services.request_calibration(operator, model)
        job_says(use_replay, extra, "SUCCEEDED", logs=result_line())
        services.poll(extra.pk)
    assert count_queries() == one
