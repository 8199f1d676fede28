"""The representative request a calibration sends, the resources it needs and the memory budget it stops at."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.calibration import job_script, services
from apps.calibration.curve import CalibrationOutputError, parse_output
from apps.calibration.models import MemoryCalibration
from apps.core.redaction import placeholder
from apps.core.secrets import decrypt
from apps.fleet.models import Deployment
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory
from tests.unit.calibration.helpers import MIB, job_says, result_line

NEW_RESULT = {
    "shape": "starlette",
    "cold_baseline_bytes": 90 * MIB,
    "limit_reason": "concurrency 8 would exceed the memory budget",
    "points": [
        {"concurrency": 1, "peak_bytes": 164 * MIB, "uss_peak_bytes": 150 * MIB, "service_s": 0.5},
        {"concurrency": 2, "peak_bytes": 228 * MIB, "uss_peak_bytes": 214 * MIB, "service_s": 0.6},
    ],
}


def submitted_argv(replay) -> list[str]:
    return shlex.split(json.loads(replay.requests[-1].content)["entrypoint"])


def argument(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def echo_of(model) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application=model.application, name="Echo"
    )


def test_without_a_request_the_ingress_gets_a_get_of_its_route_prefix_and_others_a_bare_handle_call(
    model, operator, use_replay
):
    services.request_calibration(operator, echo_of(model))
    argv = submitted_argv(use_replay)
    assert json.loads(argument(argv, "--request")) == {
        "kind": "http",
        "method": "GET",
        "path": "/demo",
        "query": "",
        "headers": {},
    }
    assert (argument(argv, "--route-prefix"), argument(argv, "--app-name"), argument(argv, "--deployment-name")) == (
        "/demo",
        "demo",
        "Echo",
    )
    MemoryCalibration.objects.all().delete()
    services.request_calibration(operator, model)
    assert json.loads(argument(submitted_argv(use_replay), "--request")) == {"kind": "handle", "args": []}


def test_a_warmup_profile_s_request_is_the_default_for_the_ingress(model, operator, use_replay):
    from apps.maintenance.models import WarmupProfile

    WarmupProfile.objects.create(
        application=model.application,
        name="a-first",
        method="post",
        path="/demo/generate?n=2",
        headers={"x-team": "vision"},
        body={"prompt": "hi"},
    )
    calibration = services.request_calibration(operator, echo_of(model))
    assert calibration.request["representative"] == {
        "kind": "http",
        "method": "POST",
        "path": "/demo/generate",
        "query": "n=2",
        "headers": {"x-team": placeholder("vision")},
        "json": {"prompt": "hi"},
    }
    assert json.loads(decrypt(calibration.headers_ciphertext)) == {"x-team": "vision"}


def test_a_given_http_request_is_normalised_stored_and_sent(model, operator, use_replay):
    request = {
        "kind": "http",
        "method": "post",
        "path": "/demo/generate",
        "query": "?a=1",
        "headers": {"X-Key": "v"},
        "body": "text",
    }
    calibration = services.request_calibration(operator, echo_of(model), request=request)
    expected = {
        "kind": "http",
        "method": "POST",
        "path": "/demo/generate",
        "query": "a=1",
        "headers": {"X-Key": "v"},
        "body": "text",
    }
    assert calibration.request["representative"] == {**expected, "headers": {"X-Key": placeholder("v")}}
    assert json.loads(argument(submitted_argv(use_replay), "--request")) == {**expected, "headers": {}}
    assert AuditEvent.objects.get(action="calibration.request").changes["request"] == {**expected, "headers": ["X-Key"]}


def test_request_headers_reach_the_job_through_its_environment_never_its_command_line(
    model, operator, use_replay, monkeypatch
):
    headers = {"Authorization": "Bearer live_secret_789", "Content-Type": "application/json"}
    request = {"kind": "http", "method": "POST", "path": "/demo/generate", "headers": headers, "json": {"a": 1}}
    services.request_calibration(operator, echo_of(model), request=request)

    submitted = json.loads(use_replay.requests[-1].content)
    assert "live_secret_789" not in submitted["entrypoint"]
    env_vars = submitted["runtime_env"]["env_vars"]
    assert env_vars["PYTHONPATH"] == "/opt/demo-app"
    # The job, on the cluster, runs with the runtime_env's variables set.
    for name, value in env_vars.items():
        monkeypatch.setenv(name, value)
    received = job_script.parse_request(argument(submitted_argv(use_replay), "--request"), None)
    assert received == {**request, "query": "", "headers": headers}


@pytest.mark.parametrize(
    "request_, message",
    [
        ("GET /", 'The representative request must be an object with "kind" "http" or "handle".'),
        ({"kind": "grpc"}, 'kind must be "http" or "handle", not'),
        (
            {"kind": "http", "url": "/x"},
            "An http request has no url; it takes body, headers, json, method, path, query.",
        ),
        ({"kind": "http", "method": "BREW"}, "The HTTP method must be one of"),
        ({"kind": "http", "path": "/x?a=1"}, "give the query string apart"),
        ({"kind": "http", "path": "x"}, "The path must start with /"),
        ({"kind": "http", "headers": {"a": 1}}, "The headers must be an object of header names to text values."),
        ({"kind": "http", "headers": {"a": "b\nc"}}, "Header names and values must be single-line ASCII."),
        ({"kind": "http", "body": "x", "json": {}}, "not both"),
        ({"kind": "http", "body": {"a": 1}}, 'The body must be text; give JSON under "json".'),
        (
            {"kind": "http", "headers": {"Content-Type": "application/json"}, "body": '{"prompt": "hi"'},
            "The body is declared application/json but is not JSON",
        ),
        ({"kind": "handle", "args": "x"}, "The handle call's args must be a list of JSON values."),
        ({"kind": "handle", "args": ["x" * 20000]}, "at most 16384 fit in the job's command line"),
    ],
)
def test_a_bad_representative_request_is_refused_with_the_reason(model, operator, request_, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        services.request_calibration(operator, model, request=request_)
    assert not MemoryCalibration.objects.exists()


def test_a_request_and_a_call_together_are_refused(model, operator):
    with pytest.raises(ValidationError, match="not both"):
        services.request_calibration(operator, model, call="x", request={"kind": "handle", "args": []})


def test_no_node_with_the_replica_s_cpus_free_refuses_before_submitting(model, operator, use_replay):
    status = ray_fixture("cluster_status.json")
    for usage in [
        status["data"]["clusterStatus"]["loadMetricsReport"]["usage"],
        *status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"].values(),
    ]:
        usage["CPU"] = [1.9, 2.0]
    use_replay.routes["/api/cluster_status"] = status
    with pytest.raises(ValidationError) as refused:
        services.request_calibration(operator, model)
    assert refused.value.messages == [
        "No node of vision-prod has 0.2 CPU free for a calibration replica (1.9 of 2 CPU in use on "
        "192.0.2.2): free some, or calibrate when the cluster is quieter."
    ]
    assert not MemoryCalibration.objects.exists() and not any(r.url.path == "/api/jobs/" for r in use_replay.requests)


def test_a_node_past_ray_s_memory_threshold_refuses_before_submitting(model, operator, use_replay):
    total = 16 * 2**30
    use_replay.routes["/nodes"] = {
        "result": True,
        "msg": "",
        "data": {"summary": [{"ip": "192.0.2.2", "mem": [total, int(total * 0.04), 96.0, int(total * 0.96)]}]},
    }
    with pytest.raises(
        ValidationError,
        match=r"Node 192\.0\.2\.2 of vision-prod already uses 15729 MiB of 16384 MiB, at or past "
        r"Ray's memory threshold \(95%\)",
    ):
        services.request_calibration(operator, model)
    assert not MemoryCalibration.objects.exists()


def test_polling_a_new_result_stores_shape_cold_baseline_limit_reason_and_service_times(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(**NEW_RESULT))
    done = services.poll(calibration.pk)
    assert done.state == "succeeded" and (done.shape, done.cold_baseline_bytes) == ("starlette", 90 * MIB)
    curve = services.latest_curve(model)
    assert curve.shape == "starlette" and curve.cold_baseline_bytes == 90 * MIB
    assert curve.limit_reason == "concurrency 8 would exceed the memory budget"
    assert curve.service_s == {1.0: 0.5, 2.0: 0.6} and curve.per_unit_bytes == 64 * MIB
    assert done.points[0] == {"x": 1, "peak_bytes": 164 * MIB, "uss_peak_bytes": 150 * MIB, "service_s": 0.5}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"shape": "grpc"}, "The result's shape is 'grpc'"),
        ({"cold_baseline_bytes": -1}, "cold_baseline_bytes is not a non-negative integer"),
        ({"limit_reason": 5}, "limit_reason is not a sentence"),
        (
            {"points": [{"concurrency": 1, "peak_bytes": 5, "service_s": -1}]},
            "service_s that is not a non-negative number",
        ),
        ({"points": [{"concurrency": 1, "peak_bytes": 5, "uss_peak_bytes": 1.5}]}, "uss_peak_bytes that is not"),
    ],
)
def test_malformed_new_fields_are_refused(overrides, message):
    with pytest.raises(CalibrationOutputError, match=re.escape(message)):
        parse_output(result_line(**overrides))


def test_an_operator_gives_the_representative_request_through_the_api(api_as, model):
    request = {"kind": "http", "method": "POST", "path": "/demo/generate", "json": {"prompt": "hi"}}
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": echo_of(model).pk, "request": request}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["request"]["representative"] == {**request, "query": "", "headers": {}}
    bad = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": model.pk, "request": {"kind": "ftp"}}, format="json"
    )
    assert bad.status_code == 400 and "kind must be" in bad.content.decode()
    broken = {"kind": "http", "path": "/demo", "headers": {"content-type": "application/json"}, "body": "{"}
    refused = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": model.pk, "request": broken}, format="json"
    )
    assert refused.status_code == 400 and "is not JSON" in refused.content.decode(), refused.content


def test_the_form_builds_the_http_request_from_its_fields(login, model):
    echo = echo_of(model)
    response = login("operator").post(
        reverse("calibration:calibrate", args=[echo.pk]),
        {
            "method": "POST",
            "path": "/demo/generate",
            "query": "a=1",
            "headers": "Content-Type: application/json\nX-Team: v",
            "body": '{"prompt": "hi"}',
        },
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200 and "pending" in response.content.decode()
    assert MemoryCalibration.objects.get().request["representative"] == {
        "kind": "http",
        "method": "POST",
        "path": "/demo/generate",
        "query": "a=1",
        "headers": {"Content-Type": "application/json", "X-Team": placeholder("v")},
        "body": '{"prompt": "hi"}',
    }
    MemoryCalibration.objects.all().delete()
    refused = (
        login("operator")
        .post(
            reverse("calibration:calibrate", args=[echo.pk]),
            {"method": "GET", "headers": "no colon"},
            HTTP_HX_REQUEST="true",
        )
        .content.decode()
    )
    assert "is not `Name: value`" in refused and not MemoryCalibration.objects.exists()
    # A JSON body that is not JSON is named before any job runs, and what was typed stays in the form.
    typed = {"method": "POST", "path": "/demo/generate", "headers": "content-type: application/json", "body": "{oops"}
    page = (
        login("operator")
        .post(reverse("calibration:calibrate", args=[echo.pk]), typed, HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert "declared application/json but is not JSON" in page and "{oops" in page
    assert not MemoryCalibration.objects.exists()
    # {n} in a JSON body is a call number: the body is checked as a call would send it.
    numbered = {**typed, "body": '{"id": {n}}'}
    login("operator").post(reverse("calibration:calibrate", args=[echo.pk]), numbered, HTTP_HX_REQUEST="true")
    assert MemoryCalibration.objects.get().request["representative"]["body"] == '{"id": {n}}'


def test_the_card_shows_shape_rest_levels_service_time_and_why_it_stopped(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(**NEW_RESULT))
    services.poll(calibration.pk)
    card = login("viewer").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "Starlette Request handler" in card and "handle call __call__()" in card
    assert "100\xa0MiB" in card  # the warm rest
    assert "90\xa0MiB cold, before any request" in card
    assert "164\xa0MiB" in card and "+64\xa0MiB" in card and "150\xa0MiB" in card and "500\xa0ms" in card
    assert "Stopped early:" in card and "concurrency 8 would exceed the memory budget" in card


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_headers_of_calibrations_already_stored_and_redacts_their_env_vars():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    headers = {"Authorization": "Bearer live_1", "Content-Type": "application/json"}
    MemoryCalibration.objects.create(
        cluster=ClusterFactory(),
        application_name="demo",
        deployment_name="Model",
        submission_id="fleetdeck-calibration-old",
        request={
            "representative": {"kind": "http", "method": "GET", "path": "/demo", "headers": headers},
            "runtime_env": {"env_vars": {"HF_TOKEN": "hf_live_1"}},
        },
    )
    MigrationExecutor(connection).migrate([("calibration", "0002_shape_cold_baseline_limit_reason")])

    MigrationExecutor(connection).migrate([("calibration", "0003_encrypted_request_headers")])
    # Forward to the latest, whose columns the model reads (and the tests after this one expect).
    latest = MigrationExecutor(connection)
    latest.migrate(latest.loader.graph.leaf_nodes("calibration"))

    calibration = MemoryCalibration.objects.get()
    assert json.loads(decrypt(calibration.headers_ciphertext)) == headers
    assert calibration.request["representative"]["headers"] == {
        "Authorization": placeholder("Bearer live_1"),
        "Content-Type": "application/json",
    }
    assert calibration.request["runtime_env"] == {"env_vars": {"HF_TOKEN": placeholder("hf_live_1")}}
