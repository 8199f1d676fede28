"""RayDashboard.put_serve_applications against the answers a real Ray 2.60 cluster gave to PUTs
(tests/fixtures/ray/put_*.json envelopes: {request, status, content_type, body})."""

from __future__ import annotations

import json

import httpx
import pytest

from integrations.ray.dashboard import USER_AGENT, RayDashboard
from integrations.ray.errors import RayBadResponse, RayTimeout, RayUnreachable, RayValidationError
from tests.conftest import FIXTURES, ReplayRay, ray_fixture

SERVE = "/api/serve/applications/"
INVALID = sorted(path.name for path in FIXTURES.glob("put_invalid_*.json"))
REFUSED_400 = [name for name in INVALID if ray_fixture(name)["status"] == 400]
FAILED_500 = [name for name in INVALID if ray_fixture(name)["status"] == 500]


def envelope_response(name: str) -> httpx.Response:
    """Ray's answer to the captured PUT, status, content type and body as they were."""
    envelope = ray_fixture(name)
    headers = {"content-type": envelope["content_type"]} if envelope["content_type"] else {}
    return httpx.Response(envelope["status"], text=envelope["body"], headers=headers)


def replay_put(name: str) -> tuple[RayDashboard, ReplayRay]:
    """A dashboard whose PUT of the Serve config answers like the envelope `name`."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.method == "PUT"
        return envelope_response(name)

    replay = ReplayRay({SERVE: answer})
    return replay.dashboard(), replay


def sent_config(name: str):
    """The config the capture sent (a dict, or the raw text of the malformed ones)."""
    return ray_fixture(name)["request"]["body"]


def test_the_parametrized_lists_cover_every_put_invalid_fixture():
    assert len(INVALID) >= 10
    assert sorted(REFUSED_400 + FAILED_500) == INVALID
    assert FAILED_500 == ["put_invalid_empty_body.json", "put_invalid_malformed_json.json"]


# --- accepted ---------------------------------------------------------------------------------


def test_an_accepted_put_returns_none():
    ray, replay = replay_put("put_demo_response.json")
    assert ray_fixture("put_demo_response.json")["status"] == 200
    assert ray_fixture("put_demo_response.json")["body"] == ""
    assert ray.put_serve_applications(sent_config("put_demo_response.json")) is None
    assert len(replay.requests) == 1


def test_the_put_sends_the_config_as_json_to_the_serve_applications_path():
    config = sent_config("put_demo_response.json")
    ray, replay = replay_put("put_demo_response.json")
    ray.put_serve_applications(config)
    (request,) = replay.requests
    assert request.method == "PUT"
    assert request.url.path == SERVE
    assert request.url == httpx.URL("http://ray.test:8265/api/serve/applications/")
    assert json.loads(request.content) == config


def test_the_put_says_it_is_json_and_comes_from_fleetdeck_not_a_browser():
    ray, replay = replay_put("put_demo_response.json")
    ray.put_serve_applications(sent_config("put_demo_response.json"))
    (request,) = replay.requests
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"] == USER_AGENT
    assert "Mozilla" not in request.headers["user-agent"]
    for browser_header in ("origin", "referer", "sec-fetch-mode", "sec-fetch-site"):
        assert browser_header not in request.headers


def test_the_put_carries_the_token_when_one_is_given():
    replay = ReplayRay({SERVE: lambda request: envelope_response("put_demo_response.json")})
    replay.dashboard(token="s3cret").put_serve_applications(sent_config("put_demo_response.json"))
    (request,) = replay.requests
    assert request.headers["authorization"] == "Bearer s3cret"


@pytest.mark.parametrize(
    "name",
    [
        "put_empty_applications_response.json",
        "put_only_echo2_response.json",
        "put_legacy_max_concurrent_queries_response.json",
        "put_unknown_fields_response.json",
        "put_bad_import_module_response.json",
        "put_accepted_200_bad_route_prefix_no_slash.json",
    ],
)
def test_configs_ray_accepted_with_200_return_none_even_when_they_fail_later(name):
    ray, replay = replay_put(name)
    assert ray_fixture(name)["status"] == 200
    assert ray.put_serve_applications(sent_config(name)) is None
    assert json.loads(replay.requests[0].content) == sent_config(name)


# --- refused (400) ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", REFUSED_400)
def test_a_config_ray_refuses_raises_a_validation_error_with_rays_own_text(name):
    envelope = ray_fixture(name)
    ray, _ = replay_put(name)
    config = envelope["request"]["body"]
    with pytest.raises(RayValidationError) as excinfo:
        ray.put_serve_applications(config if isinstance(config, dict) else {"raw": config})
    error = excinfo.value
    assert error.message == envelope["body"]
    assert str(error) == envelope["body"]
    assert error.status == 400
    assert error.transient is False
    assert error.message.startswith("1 validation error for ServeDeploySchema")


def test_a_400_with_an_empty_body_still_says_ray_refused_the_config():
    ray = ReplayRay({SERVE: httpx.Response(400, text="  \n")}).dashboard()
    with pytest.raises(RayValidationError) as excinfo:
        ray.put_serve_applications({"applications": []})
    assert excinfo.value.message == "Ray refused the config (HTTP 400)."


# --- failed (500) -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAILED_500)
def test_a_500_traceback_raises_a_transient_bad_response_with_an_excerpt(name):
    envelope = ray_fixture(name)
    ray, _ = replay_put(name)
    with pytest.raises(RayBadResponse) as excinfo:
        ray.put_serve_applications({"applications": []})
    error = excinfo.value
    assert not isinstance(error, RayValidationError)
    assert error.transient is True
    assert error.status == 500
    assert error.message.startswith(
        f"The Ray dashboard failed on {SERVE} with HTTP 500: Traceback (most recent call last):"
    )
    assert "\n" not in error.message
    assert len(error.message) < len(envelope["body"])
    assert error.message.endswith("…")


# --- the network ------------------------------------------------------------------------------


def test_a_refused_connection_raises_unreachable():
    ray = ReplayRay({SERVE: httpx.ConnectError("[Errno 111] Connection refused")}).dashboard()
    with pytest.raises(RayUnreachable) as excinfo:
        ray.put_serve_applications({"applications": []})
    assert excinfo.value.transient is True
    assert "Connection refused" in excinfo.value.message
    assert excinfo.value.message.startswith("Cannot reach the Ray dashboard")


@pytest.mark.parametrize("timeout", [httpx.ReadTimeout("timed out"), httpx.ConnectTimeout("timed out")])
def test_a_timeout_raises_ray_timeout_naming_the_put(timeout):
    ray = ReplayRay({SERVE: timeout}).dashboard()
    with pytest.raises(RayTimeout) as excinfo:
        ray.put_serve_applications({"applications": []})
    assert excinfo.value.transient is True
    assert "PUT" in excinfo.value.message
    assert type(timeout).__name__ in excinfo.value.message


def test_a_timeout_is_not_mistaken_for_an_unreachable_cluster():
    ray = ReplayRay({SERVE: httpx.ReadTimeout("timed out")}).dashboard()
    with pytest.raises(RayTimeout) as excinfo:
        ray.put_serve_applications({"applications": []})
    assert not isinstance(excinfo.value, RayUnreachable)
