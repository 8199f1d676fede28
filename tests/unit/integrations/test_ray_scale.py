"""RayDashboard.scale_deployment against the answers of Ray 2.60's scale API. The bodies are the
ones `scale_deployment` in ray/dashboard/modules/serve/serve_head.py writes; the real head answers
them in tests/integration/test_scale_api_real_ray.py."""

from __future__ import annotations

import json

import httpx
import pytest

from integrations.ray.errors import (
    RayBadResponse,
    RayControllerUnavailable,
    RayDeploymentNotFound,
    RayError,
    RayExternalScalerDisabled,
    RayScaleUnsupported,
    RayValidationError,
)
from tests.conftest import ReplayRay

SCALE = "/api/v1/applications/demo/deployments/Model/scale"
ACCEPTED = {"message": "Scaling request received. Deployment will get scaled asynchronously."}
DISABLED = (
    "Cannot update replicas for deployment 'Model' in application 'demo'. The external scaling API can only "
    "be used when 'external_scaler_enabled' is set to true in the application configuration."
)


def answering(status: int, body: object = None, *, text: str | None = None, path: str = SCALE):
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=body)

    replay = ReplayRay({path: answer})
    return replay.dashboard(), replay


def test_an_accepted_scale_posts_the_target_as_json_and_returns_none():
    ray, replay = answering(200, ACCEPTED)
    assert ray.scale_deployment("demo", "Model", 3, ray_version="2.60.0") is None
    (request,) = replay.requests
    assert request.url.path == SCALE
    assert json.loads(request.content) == {"target_num_replicas": 3}
    assert request.headers["content-type"] == "application/json"


def test_an_application_that_is_not_externally_scaled_is_refused_with_rays_reason():
    ray, _ = answering(412, {"error": DISABLED})
    with pytest.raises(RayExternalScalerDisabled) as refused:
        ray.scale_deployment("demo", "Model", 2)
    assert refused.value.status == 412 and not refused.value.transient
    assert "external_scaler_enabled: true" in refused.value.summary
    assert "external scaling API can only be used" in refused.value.message


def test_a_deployment_being_deleted_is_refused_the_same_way():
    ray, _ = answering(412, {"error": "Deployment is deleted"})
    with pytest.raises(RayExternalScalerDisabled, match="Deployment is deleted"):
        ray.scale_deployment("demo", "Model", 2)


def test_an_unknown_deployment_is_not_found_and_permanent():
    ray, _ = answering(404, {"error": "Application or Deployment not found"})
    with pytest.raises(RayDeploymentNotFound) as missing:
        ray.scale_deployment("demo", "Model", 2)
    assert missing.value.status == 404 and not missing.value.transient
    assert "demo/Model" in missing.value.summary


def test_a_bare_404_is_a_dashboard_without_the_scale_api():
    ray, _ = answering(404, text="404: Not Found")
    with pytest.raises(RayScaleUnsupported, match=r"needs Ray 2\.60's scale API"):
        ray.scale_deployment("demo", "Model", 2)


def test_an_unavailable_controller_is_transient():
    ray, _ = answering(503, {"error": "Serve controller is not available"})
    with pytest.raises(RayControllerUnavailable) as unavailable:
        ray.scale_deployment("demo", "Model", 2)
    assert unavailable.value.transient and unavailable.value.status == 503
    assert "Serve controller is not available" in unavailable.value.message


def test_a_refused_body_is_a_validation_error():
    ray, _ = answering(400, {"error": "Invalid request body: target_num_replicas must be >= 0"})
    with pytest.raises(RayValidationError, match="Invalid request body"):
        ray.scale_deployment("demo", "Model", 2)


def test_a_crash_in_the_dashboard_handler_is_a_transient_bad_response():
    ray, _ = answering(500, text="Traceback (most recent call last): ...")
    with pytest.raises(RayBadResponse) as failed:
        ray.scale_deployment("demo", "Model", 2)
    assert failed.value.transient and failed.value.status == 500


def test_a_ray_before_2_60_is_refused_without_a_request():
    ray, replay = answering(200, ACCEPTED)
    with pytest.raises(RayScaleUnsupported, match=r"Ray 2\.59\.1 cannot .*needs Ray 2\.60's scale API"):
        ray.scale_deployment("demo", "Model", 2, ray_version="2.59.1")
    assert replay.requests == []


@pytest.mark.parametrize("count", [-1, 1.5, True, "2"])
def test_a_count_that_is_not_a_whole_number_is_refused_before_sending(count):
    ray, replay = answering(200, ACCEPTED)
    with pytest.raises(RayValidationError):
        ray.scale_deployment("demo", "Model", count)
    assert replay.requests == []


def test_names_are_one_path_segment_each():
    # The replay matches the decoded path; what went on the wire is the raw one.
    ray, replay = answering(200, ACCEPTED, path="/api/v1/applications/a/b/deployments/M x/scale")
    ray.scale_deployment("a/b", "M x", 1)
    assert replay.requests[0].url.raw_path.startswith(b"/api/v1/applications/a%2Fb/deployments/M%20x/scale")


def test_an_empty_name_is_refused():
    ray, _ = answering(200, ACCEPTED)
    with pytest.raises(RayError):
        ray.scale_deployment("", "Model", 1)
