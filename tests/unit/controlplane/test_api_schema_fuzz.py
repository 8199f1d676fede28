"""Schemathesis over the OpenAPI schema the API publishes, in-process against the WSGI app:
every operation, as an admin of a team with one object of every kind, with generated valid and
invalid input. No answer is a 5xx, every status is documented, every body matches its schema.

Most path ids and ids a body names are pointed at the team's real objects, so the generated input
reaches the services, not only the 404 of an unknown id. Each call runs in a savepoint that is
rolled back, so every example starts from the same objects. The dashboard is the replayed one
and no name resolves but loopback's, so nothing leaves the machine."""

from __future__ import annotations

import os
import zlib

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.urls import resolve
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import ReplayRay, route_adapters_to
from tests.world import api_model, build_team, builtin_preset_slug, isolate_network, replay_oom_cluster

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# What a body may name, and which of the team's objects to name with it.
BODY_REFERENCES = {
    "cluster": "clusters.cluster",
    "application": "fleet.application",
    "deployment": "fleet.deployment",
    "revision": "fleet.configrevision",
    "incident": "incidents.incident",
    "finding": "remediation.finding",
    "warmup": "maintenance.warmupprofile",
}


def _load():
    from controlplane.wsgi import application

    return schemathesis.openapi.from_wsgi("/api/schema/", application)


# Loaded when the tests are collected: the schema is generated without a database.
schema = _load()


@pytest.fixture(scope="module")
def seeded(django_db_setup, django_db_blocker):
    """One team with one object of every kind, built once: each test runs in a savepoint of this
    transaction, and each call in a savepoint of its own."""
    with django_db_blocker.unblock(), pytest.MonkeyPatch.context() as patch, transaction.atomic():
        replay = ReplayRay()
        replay_oom_cluster(replay)
        route_adapters_to(patch, replay)
        isolate_network(patch)
        yield build_team("fuzz")
        transaction.set_rollback(True)


@pytest.fixture
def offline(use_replay, monkeypatch):
    replay_oom_cluster(use_replay)
    isolate_network(monkeypatch)


@pytest.fixture
def in_test_transaction():
    """Keep the database connection across WSGI requests, as Django's test client does: closing
    it at the end of a request would end the transaction the test runs in."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def aimed(value) -> bool:
    """Three generated values in four are replaced by a real object; the rest are sent as they
    came, so unknown and absurd ids are tried too. Decided by the value, so runs repeat."""
    return zlib.crc32(repr(value).encode()) % 4 != 0


def aim_at_seeded_objects(case, world) -> None:
    params = case.path_parameters or {}
    if "id" in params and aimed(params["id"]):
        url_name = resolve(case.operation.path.replace("{id}", "1")).url_name
        case.path_parameters["id"] = world.id(api_model(url_name))
    if isinstance(case.body, dict):
        for key, label in BODY_REFERENCES.items():
            if key in case.body and aimed(case.body[key]):
                case.body[key] = world.id(label)
        if "team" in case.body and aimed(case.body["team"]):
            case.body["team"] = world.slug
        if case.body.get("preset") is not None and aimed(case.body["preset"]):
            case.body["preset"] = builtin_preset_slug()


# Minutes of fuzzing: `make test` runs it, `make check` does not.
@pytest.mark.slow
@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("FLEETDECK_FUZZ_EXAMPLES", "25")),
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_documented(case, seeded, offline, in_test_transaction):
    aim_at_seeded_objects(case, seeded)
    with transaction.atomic():
        response = case.call(headers={"Authorization": f"Token {seeded.tokens['admin']}"})
        transaction.set_rollback(True)
    case.validate_response(response, checks=CHECKS)


# Inputs the fuzzing found answered with a 500, kept as plain examples.


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
    from apps.clusters.models import Cluster

    cluster = Cluster.objects.create(name="vision-prod", team=team, dashboard_url="http://ray.test:8265")
    response = api_as("admin").patch(f"/api/v1/clusters/{cluster.pk}/", {"token": "T±;Ò"}, format="json")
    assert response.status_code == 400 and "printable ASCII" in response.json()["token"][0]


@pytest.mark.django_db
def test_an_api_url_no_route_matches_answers_json(api_as):
    response = api_as("viewer").get("/api/v1/kube/connections/0.5/")
    assert response.status_code == 404 and response.json() == {"detail": "Not found."}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "since, status",
    [("0043-07-05T10:18:47+19:59", 200), ("2026-01-01T10:00:00-23:59", 200), ("0001-01-01T00:00:00+01:00", 400)],
)
def test_incident_time_filters_take_any_offset_iso_8601_allows(api_as, since, status):
    response = api_as("viewer").get("/api/v1/incidents/", {"since": since})
    assert response.status_code == status, response.content
