"""Recycles and warmups against a real Ray cluster, with a steady request loop measuring impact."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.maintenance import dispatch, execution, schedules
from apps.maintenance.models import MaintenanceRun, WarmupProfile
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]


@pytest.fixture
def cluster(ray_head, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 90
    settings.FLEETDECK_CHANGE_POLL_S = 0.2
    # The shared head exports its metrics every 10 s (Ray's default): the closing reading waits that out.
    settings.FLEETDECK_CLIENT_IMPACT_SETTLE_S = 11
    cluster = Cluster.objects.create(
        name="local",
        team=team,
        dashboard_url=ray_head.dashboard_url,
        ray_version="2.60.0",
        metrics_url=f"http://127.0.0.1:{ray_head.ports['metrics-export-port']}/metrics",
    )
    sync.sync_cluster(cluster.pk)
    yield Cluster.objects.get(pk=cluster.pk)
    ray_head.deploy(two_app_config())


def ids(head, app, dep) -> set[str]:
    body = httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()
    return {r["actor_id"] for r in body["applications"][app]["deployments"][dep]["replicas"] if r["state"] == "RUNNING"}


class Traffic:
    """A steady request loop against the demo route while maintenance runs."""

    def __init__(self, url: str):
        self.url, self.failures, self.latencies, self._stop = url, 0, [], threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - started)
                self.failures += not ok
                time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(timeout=35)


def recycle(people, deployment, override=""):
    run = dispatch.request_recycle(Actor(user=people["operator"]), deployment, override_reason=override)
    execution.execute(run.pk)
    return MaintenanceRun.objects.get(pk=run.pk)


def test_a_single_replica_without_surge_is_skipped_with_the_reason(cluster, people):
    # echo2/Echo has a fixed num_replicas of 1; Model's count depends on what ran before.
    echo = Deployment.objects.get(application__cluster=cluster, application__name="echo2", name="Echo")
    run = recycle(people, echo)
    assert run.state == MaintenanceRun.State.SKIPPED
    assert "Only 1 running replica(s) and no surge" in run.skip_reason


@pytest.mark.parametrize("surge", [0, 100])
def test_a_recycle_replaces_only_the_target_replicas_under_traffic(cluster, people, ray_head, surge):
    if surge:
        operator = Actor(user=people["operator"])
        change = protocol.plan_change(
            operator,
            cluster,
            targets=[{"application": "demo", "deployment": "Model"}],
            options={"max_surge_percent": surge},
            reason="enable surge",
        )
        protocol.request_apply(operator, change)
        protocol.run(change.pk)
        sync.sync_cluster(cluster.pk)
    model = Deployment.objects.get(application__cluster=cluster, name="Model")
    before = {dep: ids(ray_head, app, dep) for app, dep in (("demo", "Model"), ("demo", "Echo"))}
    echo2 = ids(ray_head, "echo2", "Echo")

    with Traffic(f"{ray_head.serve_url}/demo?text=hi") as traffic:
        time.sleep(1)
        run = recycle(people, model, override="" if surge else "test: one replica, measuring the gap")
        time.sleep(1)

    assert run.state == MaintenanceRun.State.SUCCEEDED, run.log
    after_model = ids(ray_head, "demo", "Model")
    assert after_model and not (after_model & before["Model"])
    assert ids(ray_head, "demo", "Echo") == before["Echo"]
    assert ids(ray_head, "echo2", "Echo") == echo2
    assert run.cold_start_s and run.cold_start_s > 0
    worst = max(traffic.latencies)
    seen = run.change.client_impact
    print(
        f"\nrecycle surge={surge}%: {len(traffic.latencies)} requests, {traffic.failures} failed, "
        f"worst {worst * 1000:.0f} ms, cold start {run.cold_start_s:.2f} s; the proxy during the change: {seen}"
    )
    assert traffic.failures == 0
    # What the product recorded agrees with the clients: requests counted at the proxy, none failed.
    assert seen["measured"] and seen["requests"] > 0 and seen["failed"] == 0, seen
    assert run.change.clients_seen in [line["message"] for line in run.log]


def test_a_warmup_records_latencies_and_fails_on_errors(cluster, people):
    demo = cluster.applications.get(name="demo")
    actor = Actor(user=people["operator"])
    good = schedules.save_profile(
        actor, demo, {"name": "ok", "path": "/demo?text=warm", "requests": 8, "concurrency": 2}
    )
    bad = schedules.save_profile(
        actor, demo, {"name": "broken", "path": "/demo?fail=1", "requests": 4, "concurrency": 2}
    )

    for profile, state in ((good, MaintenanceRun.State.SUCCEEDED), (bad, MaintenanceRun.State.FAILED)):
        run = dispatch.request_warmup(actor, profile)
        execution.execute(run.pk)
        run.refresh_from_db()
        assert run.state == state, run.log
        assert len(run.results["samples"]) == profile.requests
        assert run.results["first_ms"] > 0 and run.results["steady_p95_ms"] > 0
    assert "4 of 4 responses were not 2xx" in run.results["verdict"]
    assert WarmupProfile.objects.count() == 2
