"""Every error the API answers has one shape: field paths (or `detail`) to lists of messages."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import ErrorDetail


@pytest.mark.parametrize(
    "drf, ours",
    [
        ({"detail": ErrorDetail("Not found.", code="not_found")}, {"detail": ["Not found."]}),
        ({"detail": ["Change #3 is in progress."]}, {"detail": ["Change #3 is in progress."]}),
        ({"non_field_errors": ["Give a preset or options."]}, {"detail": ["Give a preset or options."]}),
        ({"reason": ["This field is required."]}, {"reason": ["This field is required."]}),
        (
            {"autoscaling_config": {"max_replicas": ["Must be at least 1."]}},
            {"autoscaling_config.max_replicas": ["Must be at least 1."]},
        ),
        (
            {"mix": [{}, {"share": ["Must be a number."]}, {"request": {"path": ["Must start with /."]}}]},
            {"mix[1].share": ["Must be a number."], "mix[2].request.path": ["Must start with /."]},
        ),
        (["A list at the top."], {"detail": ["A list at the top."]}),
        ({}, {"detail": ["The request was refused."]}),
    ],
)
def test_drf_shapes_become_one(drf, ours):
    from apps.accounts.drf import error_body  # after DRF's settings have loaded it

    assert error_body(drf) == ours


@pytest.mark.django_db
def test_the_api_answers_a_missing_object_a_refusal_and_bad_fields_in_the_same_shape(api_as, team):
    api = api_as("operator")
    missing = api.get("/api/v1/clusters/999999/")
    bad = api.post("/api/v1/clusters/", {"name": "", "dashboard_url": "not a url", "team": team.pk}, format="json")
    anonymous = api.__class__().get("/api/v1/clusters/")
    for response in (missing, bad, anonymous):
        body = response.json()
        assert response.status_code >= 400 and body, response.content
        assert all(isinstance(v, list) and all(isinstance(m, str) for m in v) for v in body.values()), body
    assert set(bad.json()) >= {"name", "dashboard_url"}


@pytest.mark.django_db
def test_a_nul_character_in_a_team_slug_is_a_400_naming_the_field(api_as):
    response = api_as("admin").post("/api/v1/webhooks/", {"team": "vi\x00sion", "url": "http://x.test/"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["team"], response.content
