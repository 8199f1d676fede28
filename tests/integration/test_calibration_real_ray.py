"""A real calibration: Fleetdeck submits the measuring job to a real Ray head, the job runs the
demo Model on the cluster, and the measured curve comes back to the wizard's interface."""

from __future__ import annotations

import copy
import time

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.calibration import services
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
MIB = 2**20
ALLOC_MB = 64


@pytest.fixture
def cluster(ray_head, team, settings):
    config = copy.deepcopy(two_app_config())
    model = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")
    model["user_config"] = {"alloc_mb": ALLOC_MB, "hold_s": 0.5}
    ray_head.deploy(config)
    cluster = Cluster.objects.create(
        name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0"
    )
    assert sync.sync_cluster(cluster.pk).ok
    yield Cluster.objects.get(pk=cluster.pk)
    ray_head.deploy(two_app_config())


def test_calibrating_the_demo_model_measures_its_memory_per_request_on_the_cluster(cluster, people, ray_head):
    model = Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="demo", name="Model"
    )
    assert model.effective_config["user_config"] == {"alloc_mb": ALLOC_MB, "hold_s": 0.5}

    calibration = services.request_calibration(
        Actor(user=people["operator"], via="test"), model, levels=[1, 2, 4], call="calibrate"
    )
    deadline = time.monotonic() + 180
    while not calibration.is_final:
        assert time.monotonic() < deadline, f"calibration still {calibration.state}"
        time.sleep(1)
        calibration = services.poll(calibration.pk)
    assert calibration.state == "succeeded", f"{calibration.error}\n{calibration.log_tail}"

    ray_says = httpx.get(f"{ray_head.dashboard_url}/api/jobs/{calibration.submission_id}", timeout=10).json()
    assert ray_says["status"] == "SUCCEEDED" and ray_says["runtime_env"]["env_vars"]["PYTHONPATH"]

    curve = services.latest_curve(model)
    print(
        f"\nMeasured on the cluster: device {curve.device}, baseline {curve.baseline_bytes / MIB:.1f} MiB, "
        + ", ".join(f"{x:g} -> {peak / MIB:.1f} MiB" for x, peak in curve.points)
        + f"; per request {curve.per_unit_bytes / MIB:.1f} MiB; peak_at(8) {curve.peak_at(8) / MIB:.1f} MiB"
    )
    assert curve.calibration_id == calibration.pk and curve.axis == "concurrency" and curve.device == "cpu"
    assert curve.monotone and [x for x, _ in curve.points] == [1.0, 2.0, 4.0]
    # Four requests each holding 64 MiB at once; a little allowance for measurement noise.
    assert curve.peak_at(4) - curve.baseline_bytes >= 3 * ALLOC_MB * MIB
    assert ALLOC_MB * MIB * 0.9 <= curve.per_unit_bytes <= ALLOC_MB * MIB * 2
