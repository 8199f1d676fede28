"""Calibrating an ordinary Serve app, written as in Ray's docs with no Fleetdeck hook, through its
own interface: the Starlette Request handler, the FastAPI ingress and the handle-called worker of
deploy/plain_app, each measured by a real Ray job on the session's head."""

from __future__ import annotations

import copy
import time

import pytest

from apps.accounts.audit import Actor
from apps.calibration import services
from apps.clusters.models import Cluster
from apps.demo.local_ray import REPO
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
MIB = 2**20
ALLOC_MB, HOLD_S, BASE_MB = 48, 0.5, 32
PLAIN_APP_DIR = REPO / "deploy" / "plain_app"


def plain_application(name: str, import_path: str, deployments: list[str]) -> dict:
    return {
        "name": name,
        "route_prefix": f"/{name}",
        "import_path": import_path,
        "runtime_env": {
            "env_vars": {
                "PYTHONPATH": str(PLAIN_APP_DIR),
                "PLAIN_ALLOC_MB": str(ALLOC_MB),
                "PLAIN_HOLD_S": str(HOLD_S),
                "PLAIN_BASE_MB": str(BASE_MB),
            }
        },
        # Small CPU shares, so the replicas and the calibration jobs all fit on the 2-CPU head.
        "deployments": [{"name": deployment, "ray_actor_options": {"num_cpus": 0.1}} for deployment in deployments],
    }


@pytest.fixture
def cluster(ray_head, team):
    # One deploy holding the three shapes beside the session's two applications, which stay as they are.
    config = copy.deepcopy(two_app_config())
    config["applications"] += [
        plain_application("plain", "plain_app:app", ["Plain"]),
        plain_application("plainapi", "plain_app:fastapi_app", ["PlainAPI"]),
        plain_application("plainhandle", "plain_app:handle_app", ["Front", "Worker"]),
    ]
    ray_head.deploy(config)
    cluster = Cluster.objects.create(
        name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0"
    )
    assert sync.sync_cluster(cluster.pk).ok
    yield Cluster.objects.get(pk=cluster.pk)
    ray_head.deploy(two_app_config())


def deployment(cluster: Cluster, app: str, name: str) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name=app, name=name
    )


def test_the_three_shapes_of_a_plain_app_are_calibrated_through_their_own_interface(cluster, people):
    operator = Actor(user=people["operator"], via="test")
    requested = {
        # No request given: Plain is its application's ingress, so the default is a GET of its route prefix.
        "starlette": services.request_calibration(operator, deployment(cluster, "plain", "Plain"), levels=[1, 2, 4]),
        "asgi": services.request_calibration(
            operator,
            deployment(cluster, "plainapi", "PlainAPI"),
            levels=[1, 2, 4],
            request={"kind": "http", "method": "POST", "path": "/plainapi/generate", "json": {"prompt": "hello"}},
        ),
        "handle": services.request_calibration(
            operator,
            deployment(cluster, "plainhandle", "Worker"),
            levels=[1, 2, 4],
            request={"kind": "handle", "args": ["hello"]},
        ),
    }
    assert requested["starlette"].request["representative"] == {
        "kind": "http",
        "method": "GET",
        "path": "/plain",
        "query": "",
        "headers": {},
    }
    deadline = time.monotonic() + 240
    while not all(calibration.is_final for calibration in requested.values()):
        assert time.monotonic() < deadline, {shape: c.state for shape, c in requested.items()}
        time.sleep(1)
        requested = {shape: services.poll(c.pk) for shape, c in requested.items()}

    for shape, calibration in requested.items():
        assert calibration.state == "succeeded", f"{shape}: {calibration.error}\n{calibration.log_tail}"
        curve = services.curve_of(calibration)
        print(
            f"\n{shape}: cold {curve.cold_baseline_bytes / MIB:.1f} MiB, warm {curve.baseline_bytes / MIB:.1f} MiB, "
            + ", ".join(f"{x:g} -> {peak / MIB:.1f} MiB in {curve.service_s[x]:.2f} s" for x, peak in curve.points)
            + f"; per request {curve.per_unit_bytes / MIB:.1f} MiB"
        )
        assert curve.shape == shape and curve.limit_reason is None and curve.device == "cpu"
        assert [x for x, _ in curve.points] == [1.0, 2.0, 4.0]
        # Each request fills PLAIN_ALLOC_MB and holds it for PLAIN_HOLD_S, while the others run.
        assert ALLOC_MB * MIB * 0.8 <= curve.per_unit_bytes <= ALLOC_MB * MIB * 2
        assert curve.peak_at(4) - curve.baseline_bytes >= 3 * ALLOC_MB * MIB
        assert curve.baseline_bytes >= curve.cold_baseline_bytes * 0.9 and curve.cold_baseline_bytes >= BASE_MB * MIB
        assert all(HOLD_S <= seconds < HOLD_S + 2 for seconds in curve.service_s.values())
