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
# Minutes of fuzzing, and seconds of schema generation at collection: `make test` runs it, `make
# check` leaves the whole module out (Makefile).
pytestmark = pytest.mark.slow


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
