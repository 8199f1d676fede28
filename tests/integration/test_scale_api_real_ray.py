"""Ray 2.60's scale API on a real head, through the adapter: an application deployed with
`external_scaler_enabled: true` has its replica count set from outside; one without it is refused
with 412, an unknown deployment with 404."""

from __future__ import annotations

import time

import pytest

from apps.demo.local_ray import DEMO_APP_DIR, OWN_HEAD, LocalRayHead
from integrations.ray.dashboard import RayDashboard
from integrations.ray.errors import RayDeploymentNotFound, RayExternalScalerDisabled, RayScaleUnsupported

pytestmark = pytest.mark.ray


def echo_app(name: str, *, external: bool) -> dict:
    return {
        "name": name,
        "route_prefix": f"/{name}",
        "import_path": "demo_app:echo_only",
        "runtime_env": {"env_vars": {"PYTHONPATH": str(DEMO_APP_DIR)}},
        "external_scaler_enabled": external,
        # A fixed count: Ray refuses autoscaling_config on an externally scaled application.
        "deployments": [{"name": "Echo", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}],
    }


@pytest.fixture(scope="module")
def scaled_head():
    head = LocalRayHead.start(num_cpus=2)
    try:
        head.wait_ready()
        head.deploy({"applications": [echo_app("scaled", external=True), echo_app("fixed", external=False)]})
        yield head
    finally:
        head.stop()


def running_echoes(ray: RayDashboard, app: str) -> tuple[int | None, int]:
    deployment = ray.serve_applications().applications[app].deployments["Echo"]
    return deployment.target_num_replicas, sum(1 for r in deployment.replicas if r.state == "RUNNING")


def test_the_scale_api_refuses_sets_and_moves_the_replica_count(scaled_head):
    with RayDashboard(scaled_head.dashboard_url, timeout_s=10, policy=OWN_HEAD) as ray:
        with pytest.raises(RayExternalScalerDisabled) as refused:
            ray.scale_deployment("fixed", "Echo", 2, ray_version="2.60.0")
        assert refused.value.status == 412 and "external_scaler_enabled" in refused.value.message

        with pytest.raises(RayDeploymentNotFound) as missing:
            ray.scale_deployment("scaled", "NoSuchDeployment", 2)
        assert missing.value.status == 404
        with pytest.raises(RayDeploymentNotFound):
            ray.scale_deployment("no-such-app", "Echo", 2)

        with pytest.raises(RayScaleUnsupported):
            ray.scale_deployment("scaled", "Echo", 2, ray_version="2.59.0")

        started = time.monotonic()
        assert ray.scale_deployment("scaled", "Echo", 2, ray_version=ray.version().ray_version) is None
        deadline = time.monotonic() + 60
        counts = running_echoes(ray, "scaled")
        while counts != (2, 2) and time.monotonic() < deadline:
            time.sleep(0.5)
            counts = running_echoes(ray, "scaled")
        assert counts == (2, 2), f"not two running replicas 60 s after the scale request: {counts}"
        print(f"\nscale request to 2 RUNNING replicas: {time.monotonic() - started:.1f} s")
        assert running_echoes(ray, "fixed") == (1, 1)
