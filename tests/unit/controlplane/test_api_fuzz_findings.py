"""Inputs the schema fuzzing (test_api_schema_fuzz.py) found answered with a 500, kept as plain
examples: they run in the fast lane, the fuzzing does not."""

from __future__ import annotations

import pytest

from tests.factories import ClusterFactory


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["-1.7976931348623157e+308", "0.5", "99999999999999999999"])
def test_an_id_filter_refuses_what_no_id_can_be(api_as, value):
    for url in (
        "/api/v1/applications/",
        "/api/v1/deployments/",
        "/api/v1/calibrations/",
        "/api/v1/incidents/",
        "/api/v1/findings/",
    ):
        response = api_as("viewer").get(url, {"cluster": value})
        assert response.status_code == 400 and "cluster" in response.json(), (url, response.content)


@pytest.mark.django_db
def test_a_preset_with_remedies_that_are_not_a_list_is_refused(api_as, team):
    created = api_as("operator").post(
        "/api/v1/presets/", {"name": "mine", "team": team.slug, "options": {"max_ongoing_requests": 2}}, format="json"
    )
    response = api_as("operator").patch(f"/api/v1/presets/{created.json()['id']}/", {"remedies": None}, format="json")
    assert response.status_code == 400 and "remedies" in response.json()


@pytest.mark.django_db
def test_a_dashboard_token_that_cannot_travel_in_a_header_is_refused(api_as, team, use_replay):

    cluster = ClusterFactory(name="vision-prod", team=team)
    response = api_as("admin").patch(f"/api/v1/clusters/{cluster.pk}/", {"token": "T±;Ò"}, format="json")
    assert response.status_code == 400 and "printable ASCII" in response.json()["token"][0]


@pytest.mark.django_db
def test_an_api_url_no_route_matches_answers_json(api_as):
    response = api_as("viewer").get("/api/v1/kube/connections/0.5/")
    assert response.status_code == 404 and response.json() == {"detail": ["Not found."]}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "since, status",
    [("0043-07-05T10:18:47+19:59", 200), ("2026-01-01T10:00:00-23:59", 200), ("0001-01-01T00:00:00+01:00", 400)],
)
def test_incident_time_filters_take_any_offset_iso_8601_allows(api_as, since, status):
    response = api_as("viewer").get("/api/v1/incidents/", {"since": since})
    assert response.status_code == status, response.content
