"""A scaler in control of a real Ray 2.60 deployment: turned on through the push protocol (the
application's external_scaler_enabled on, a fixed count), scaled to two replicas by the tick
through the scale API, and handed back to Serve's autoscaler by the watchdog when its metrics go
stale. The change runs inline (`protocol.run`), as the worker would run it."""

from __future__ import annotations

import time

import pytest

from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.demo.local_ray import DEMO_APP_DIR, OWN_HEAD, LocalRayHead
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.scaler import shadow
from apps.scaler.models import Scaler, ScalerDecision
from integrations.ray.dashboard import RayDashboard
from tests.unit.scaler.conftest import record_readings

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


@pytest.fixture(scope="module")
def echo_head():
    head = LocalRayHead.start(num_cpus=2)
    try:
        head.wait_ready()
        head.deploy(
            {
                "applications": [
                    {
                        "name": "scaled",
                        "route_prefix": "/scaled",
                        "import_path": "demo_app:echo_only",
                        "runtime_env": {"env_vars": {"PYTHONPATH": str(DEMO_APP_DIR)}},
                        "deployments": [
                            {
                                "name": "Echo",
                                "autoscaling_config": {"min_replicas": 1, "max_replicas": 2},
                                "ray_actor_options": {"num_cpus": 0.1},
                            }
                        ],
                    }
                ]
            }
        )
        yield head
    finally:
        head.stop()


def echo(ray: RayDashboard):
    app = ray.serve_applications().applications["scaled"]
    return app, app.deployments["Echo"]


def test_a_scaler_takes_control_scales_to_two_and_hands_back(echo_head, api_as, settings):
    settings.FLEETDECK_CHANGE_POLL_S = 0.5
    registered = api_as("admin").post(
        "/api/v1/clusters/",
        {"name": "scaled", "team": "vision", "dashboard_url": echo_head.dashboard_url},
        format="json",
    )
    assert registered.status_code == 201, registered.content
    cluster_id = registered.json()["id"]
    assert sync.sync_and_announce([cluster_id])[0].ok
    dep = Deployment.objects.get(application__cluster_id=cluster_id, application__name="scaled", name="Echo")
    operator = api_as("operator")
    created = operator.post(
        "/api/v1/scalers/",
        {"deployment": dep.pk, "min_replicas": 1, "max_replicas": 2, "concurrency": 2, "service_s": 0.5},
        format="json",
    )
    assert created.status_code == 201, created.content
    scaler_id = created.json()["id"]

    on = operator.post(f"/api/v1/scalers/{scaler_id}/activate/")
    assert on.status_code == 202, on.content
    protocol.run(on.json()["change"])
    change = Change.objects.get(pk=on.json()["change"])
    assert change.state == ChangeState.SUCCEEDED, change.error
    scaler = Scaler.objects.get(pk=scaler_id)
    assert (scaler.mode, scaler.target) == (Scaler.Mode.ACTIVE, 1)
    with RayDashboard(echo_head.dashboard_url, timeout_s=10, policy=OWN_HEAD) as ray:
        app, deployment = echo(ray)
        assert app.external_scaler_enabled is True
        assert deployment.deployment_config.get("autoscaling_config") is None

    # Eight requests a second at half a second each, two per replica: two replicas.
    record_readings(dep, [8, 8, 8, 8])
    row = shadow.evaluate(scaler_id)
    assert row is not None and row.kind == ScalerDecision.Kind.UP and row.target == 2
    assert row.applied, row.error
    deadline = time.monotonic() + 60
    with RayDashboard(echo_head.dashboard_url, timeout_s=10, policy=OWN_HEAD) as ray:
        while time.monotonic() < deadline:
            _, deployment = echo(ray)
            if sum(1 for r in deployment.replicas if r.state == "RUNNING") == 2:
                break
            time.sleep(1)
        assert deployment.target_num_replicas == 2
        assert sum(1 for r in deployment.replicas if r.state == "RUNNING") == 2

    # The metrics stop: the watchdog hands the deployment back.
    assert sync.sync_and_announce([cluster_id])[0].ok
    record_readings(dep, [8, 8, 8], end=time.time() - 600)
    assert shadow.evaluate(scaler_id) is None
    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.HANDING_BACK, scaler.decisions.first().error
    protocol.run(scaler.change_id)
    back = Change.objects.get(pk=scaler.change_id)
    assert back.state == ChangeState.SUCCEEDED, back.error
    scaler.refresh_from_db()
    assert scaler.mode == Scaler.Mode.OFF
    with RayDashboard(echo_head.dashboard_url, timeout_s=10, policy=OWN_HEAD) as ray:
        app, deployment = echo(ray)
        assert app.external_scaler_enabled is False
        assert deployment.deployment_config["autoscaling_config"]["max_replicas"] == 2
