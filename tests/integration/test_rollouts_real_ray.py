"""Rollouts across two real Ray 2.60 clusters, judged by what their clients saw at the proxies:
a canary that succeeds and then the rest; a canary whose change fails, where the rest never
starts; a wave whose change Serve reports healthy while its clients fail, stopped and rolled back."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol, rollouts
from apps.changes.models import Change, ChangeState, Rollout
from apps.clusters.models import Cluster
from apps.demo.local_ray import LocalRayHead
from apps.fleet import sync
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
# The proxies export their counters every second here (Ray's default is 10 s), so the closing
# reading of a change waits 2.5 s instead of 12.
EXPORT = {"RAY_metrics_report_interval_ms": "1000"}
CLIENTS = 6


@pytest.fixture(scope="module")
def heads():
    started: list[LocalRayHead] = []
    try:
        # One after the other: two GCSs starting at once on 2 CPUs (beside the session's own
        # cluster) missed their start-up deadline in CI.
        for _ in range(2):
            started.append(head := LocalRayHead.start(extra_env=EXPORT))
            head.wait_ready()
            head.deploy(two_app_config())
        yield started
    finally:
        for head in started:
            head.stop()


@pytest.fixture
def fleet(heads, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 25
    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    settings.FLEETDECK_CLIENT_IMPACT_SETTLE_S = 2.5
    clusters = []
    for name, head in zip(("canary", "rest"), heads, strict=True):
        cluster = Cluster.objects.create(
            name=name,
            team=team,
            dashboard_url=head.dashboard_url,
            ray_version="2.60.0",
            metrics_url=f"http://127.0.0.1:{head.ports['metrics-export-port']}/metrics",
        )
        assert sync.sync_cluster(cluster.pk).ok
        clusters.append(cluster)
    yield clusters
    for head in heads:
        head.deploy(two_app_config())


class Clients:
    """CLIENTS clients per cluster, each sending one request after another to the demo route."""

    def __init__(self, heads):
        self.statuses: dict[str, Counter] = {h.serve_url: Counter() for h in heads}
        self._stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(h.serve_url,), daemon=True) for h in heads for _ in range(CLIENTS)
        ]

    def _loop(self, url: str):
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    self.statuses[url][client.get(f"{url}/demo?text=hi").status_code] += 1
                except httpx.HTTPError as exc:
                    self.statuses[url][type(exc).__name__] += 1

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self.threads:
            thread.join(timeout=35)


def model_config(head) -> dict:
    body = httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()
    return body["applications"]["demo"]["deployments"]["Model"]["deployment_config"]


def replica_ids(head, app: str) -> set[str]:
    body = httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()
    return {r["actor_id"] for d in body["applications"][app]["deployments"].values() for r in d["replicas"]}


def roll(people, options: dict, **extra) -> Rollout:
    operator = Actor(user=people["operator"])
    rollout = rollouts.plan_rollout(
        operator, selection={"deployment": "Model"}, reason="fleet tuning", options=options, canary="canary", **extra
    )
    rollouts.start(operator, rollout)
    return rollout


def run_wave(rollout: Rollout, wave: int) -> list[Change]:
    """The worker's part: run the wave's queued changes (their end moves the rollout on)."""
    changes = list(Change.objects.filter(rollout=rollout, wave=wave).order_by("pk"))
    for change in changes:
        protocol.run(change.pk)
    return [Change.objects.get(pk=c.pk) for c in changes]


def steps(change: Change) -> str:
    return "\n".join(s.message for s in change.steps.all())


def test_a_canary_that_succeeds_then_the_rest_with_what_their_clients_saw(fleet, heads, people):
    echo2 = [replica_ids(h, "echo2") for h in heads]
    # Replaces every Model replica: the rolling restart is what clients could feel.
    options = {"ray_actor_options": {"runtime_env": {"env_vars": {"FLEET_ROLL": "1"}}}}
    with Clients(heads) as clients:
        rollout = roll(people, options)
        [canary] = run_wave(rollout, 0)
        assert canary.state == ChangeState.SUCCEEDED, steps(canary)
        [rest] = run_wave(rollout, 1)
    rollout.refresh_from_db()
    print(
        f"\ntwo-cluster rollout: canary {canary.client_impact}, rest {rest.client_impact}; clients saw "
        f"{ {url: dict(c) for url, c in clients.statuses.items()} }"
    )
    assert rest.state == ChangeState.SUCCEEDED, steps(rest)
    assert rollout.state == Rollout.State.SUCCEEDED, rollout.error
    for change in (canary, rest):
        seen = change.client_impact
        assert seen["measured"] and seen["requests"] > 0, seen
        assert "Clients: " in steps(change)
    # The proxies' count of failures agrees with the clients' own: none on either side.
    failed_at_clients = sum(n for c in clients.statuses.values() for code, n in c.items() if code != 200)
    assert failed_at_clients == 0 and canary.client_impact["failed"] == rest.client_impact["failed"] == 0
    assert all(model_config(h)["ray_actor_options"]["runtime_env"]["env_vars"]["FLEET_ROLL"] == "1" for h in heads)
    assert [replica_ids(h, "echo2") for h in heads] == echo2


def test_a_canary_whose_change_fails_never_starts_the_rest(fleet, heads, people):
    rest_before = model_config(heads[1])
    # No node has 64 CPUs: the new replica never starts, verification times out, the change rolls back.
    rollout = roll(people, {"ray_actor_options": {"num_cpus": 64}})
    [canary] = run_wave(rollout, 0)
    rollout.refresh_from_db()
    assert canary.state == ChangeState.ROLLED_BACK, steps(canary)
    assert rollout.state == Rollout.State.FAILED and f"change #{canary.pk} rolled back" in rollout.error
    rest = Change.objects.get(rollout=rollout, wave=1)
    assert rest.state == ChangeState.CANCELLED and rest.pushed_at is None
    assert model_config(heads[1]) == rest_before
    assert model_config(heads[0])["ray_actor_options"]["num_cpus"] == rest_before["ray_actor_options"]["num_cpus"]


def test_a_wave_serve_calls_healthy_but_whose_clients_fail_is_stopped_and_rolled_back(fleet, heads, people):
    before = model_config(heads[0])
    # One request at a time and a queue of one, each request held 0.5 s: six clients overflow it at
    # once. Serve reports the app RUNNING with exactly these options; only the proxy sees the 5xx.
    options = {
        "num_replicas": 1,
        "max_ongoing_requests": 1,
        "max_queued_requests": 1,
        "user_config": {"alloc_mb": 0, "hold_s": 0.5},
    }
    with Clients(heads[:1]) as clients:
        rollout = roll(people, options)
        [canary] = run_wave(rollout, 0)
        rollout.refresh_from_db()
        restore = Change.objects.get(restores=canary)
        protocol.run(restore.pk)
    restore.refresh_from_db()
    print(f"\nover budget: canary {canary.client_impact}; clients saw {dict(clients.statuses[heads[0].serve_url])}")
    assert canary.state == ChangeState.SUCCEEDED, steps(canary)  # what Serve says
    seen = canary.client_impact
    assert seen["measured"] and seen["failed"] > 0.001 * seen["requests"], seen
    assert rollout.state == Rollout.State.FAILED
    assert f"rolled back by change #{restore.pk}" in rollout.error and "over the 0.1 % budget" in rollout.error
    assert restore.state == ChangeState.SUCCEEDED, steps(restore)
    after = model_config(heads[0])
    keys = ("max_ongoing_requests", "max_queued_requests", "user_config", "autoscaling_config")
    assert {k: after.get(k) for k in keys} == {k: before.get(k) for k in keys}
    rest = Change.objects.get(rollout=rollout, wave=1)
    assert rest.state == ChangeState.CANCELLED and rest.pushed_at is None
