"""From a real OOM kill to a verified fix, through the wizard in the UI, on a dedicated Ray cluster,
for an ordinary Serve application written as in Ray's docs (deploy/plain_app: a Starlette
`Request` handler, no Fleetdeck hook).

The deployment starts as users first write it: one replica admitting up to 16 requests, each
filling 500 MiB and holding it 1 s, an unbounded queue, on a node whose memory monitor trips about
4 GiB above what the machine used before the cluster started (the cluster itself takes 1–1.5 GiB of
that). A fixed load of 8 concurrent clients, 4 GB at once, kills it.
The wizard has no trustworthy figure (the kill message only bounds memory from below), so its
first step is a calibration through the app's own HTTP interface; the values computed from that
measurement are applied through the change protocol, and verification under the same load judges
the fix by what the clients got at the proxy."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from django.urls import reverse

from apps.calibration import services as calibrations
from apps.calibration.models import MemoryCalibration
from apps.changes import protocol
from apps.clusters.models import Cluster
from apps.demo.local_ray import REPO, LocalRayHead, memory_monitor_env, threshold_for_headroom
from apps.fleet import sync
from apps.incidents import ingest
from apps.incidents import services as incidents
from apps.incidents.models import Incident, SignalWindow
from apps.remediation import observed, verification
from apps.remediation.models import Wizard

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
CLIENTS = 8
ALLOC_MB, HOLD_S, BASE_MB = 500, 1, 64
MIB = 2**20
CONFIG = {
    "applications": [
        {
            "name": "plain",
            "route_prefix": "/plain",
            "import_path": "plain_app:app",
            "runtime_env": {
                "env_vars": {
                    "PYTHONPATH": str(REPO / "deploy" / "plain_app"),
                    "PLAIN_ALLOC_MB": str(ALLOC_MB),
                    "PLAIN_HOLD_S": str(HOLD_S),
                    "PLAIN_BASE_MB": str(BASE_MB),
                }
            },
            "deployments": [
                {
                    "name": "Plain",
                    "num_replicas": 1,
                    "max_ongoing_requests": 16,
                    "max_queued_requests": -1,
                    "ray_actor_options": {"num_cpus": 0.5},
                }
            ],
        }
    ]
}


@pytest.fixture(scope="module")
def oom_lab():
    # The proxy's default latency buckets jump from 10 s to 60 s, so a p99 against the 20 s objective
    # could not be decided either way; the verdict says to add a boundary at the objective, as done here.
    buckets = {"RAY_SERVE_REQUEST_LATENCY_BUCKETS_MS": "100,500,1000,2000,5000,10000,15000,20000,30000,60000,120000"}
    head = LocalRayHead.start(extra_env=memory_monitor_env(threshold_for_headroom(4)) | buckets)
    try:
        head.wait_ready()
        head.deploy(CONFIG)
        yield head
    finally:
        head.stop()


class Load:
    """The same fixed schedule in both phases: CLIENTS clients, each sending one request after another
    (`url`, or `url(n)` for a client's n-th request)."""

    def __init__(self, url: str | Callable[[int], str]):
        self.url = url if callable(url) else (lambda n: url)
        self.statuses, self.failures, self._stop = [], [], threading.Event()
        self.started = time.monotonic()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def _client(self):
        with httpx.Client(timeout=60) as client:
            for n in itertools.count():
                if self._stop.is_set():
                    break
                try:
                    response = client.get(self.url(n))
                    self.statuses.append(response.status_code)
                    if response.status_code != 200:
                        # What the proxy said, and when: a failure message names its own cause.
                        self.failures.append((round(time.monotonic() - self.started, 1), response.text[:300]))
                except httpx.HTTPError as exc:
                    self.statuses.append(type(exc).__name__)
                    time.sleep(0.5)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self.threads:
            thread.join(timeout=90)


def observe(cluster: Cluster) -> list[int]:
    """One pass of what the worker does for a cluster: sync, OOM evidence, metrics."""
    sync.sync_cluster(cluster.pk)
    touched = incidents.detect(cluster.pk)
    ingest.collect_metrics(cluster.pk)
    return touched


def signal_points(cluster: Cluster) -> list[dict]:
    window = SignalWindow.objects.filter(cluster=cluster, deployment_name="Plain").first()
    return window.points if window else []


def killed_under_load(cluster: Cluster, url) -> tuple[Incident, Load]:
    """Fleetdeck watches the cluster before anything goes wrong, as it does a registered one, until
    its readings hold the replica's memory at rest (Ray exports every few seconds, and a kill in the
    load's first seconds would otherwise leave nothing read before it); then the load gets the
    replica killed by Ray's memory monitor. The OOM incident, and what the clients saw."""
    deadline = time.monotonic() + 90
    while not ((seen := observed.from_points(signal_points(cluster))) and seen.idle_readings):
        assert time.monotonic() < deadline, f"no memory reading of Plain at rest: {signal_points(cluster)[-3:]}"
        observe(cluster)
        time.sleep(2)
    with Load(url) as before:
        deadline = time.monotonic() + 150
        while not Incident.objects.filter(kind="oom_kill", deployment_name="Plain").exists():
            assert time.monotonic() < deadline, f"no OOM kill under load; clients saw {before.statuses[-20:]}"
            time.sleep(2)
            observe(cluster)
    return Incident.objects.get(kind="oom_kill", deployment_name="Plain"), before


def registered(head: LocalRayHead, name: str, team, settings) -> Cluster:
    """The lab's cluster as an operator registers it, its metrics endpoint included; changes verified
    within 2 minutes, polled every half second."""
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 120
    settings.FLEETDECK_CHANGE_POLL_S = 0.5
    return Cluster.objects.create(
        name=name,
        team=team,
        dashboard_url=head.dashboard_url,
        ray_version="2.60.0",
        serve_url=head.serve_url,
        metrics_url=f"http://127.0.0.1:{head.ports['metrics-export-port']}/metrics",
    )


def calibrated(wizard: Wizard, timeout_s: float = 300) -> MemoryCalibration:
    """The wizard's calibration, once its job has succeeded."""
    run = MemoryCalibration.objects.get(pk=wizard.steps.get(kind="calibration").calibration_id)
    deadline = time.monotonic() + timeout_s
    while not run.is_final:
        assert time.monotonic() < deadline, "calibration did not finish"
        time.sleep(2)
        run = calibrations.poll(run.pk)
    assert run.state == "succeeded", f"{run.error}\n{run.log_tail}"
    return run


def applied(client, wizard: Wizard, steps: dict, cluster: Cluster):
    """R1 + R2 + R10 applied as one change through the protocol (the worker's part runs here)."""
    positions = [steps[r].position for r in ("R1", "R2", "R10")]
    post(client, wizard, "apply", steps=positions, step=positions[0])
    change = wizard.steps.get(remedy="R1").change
    protocol.run(change.pk)
    change.refresh_from_db()
    assert change.state == "succeeded", "\n".join(s.message for s in change.steps.all())
    observe(cluster)
    return change


def verified(client, wizard: Wizard, cluster: Cluster, url) -> Load:
    """Verification under the load of `url` until it has an outcome; what the clients saw."""
    post(client, wizard, "verify", window_s=45, step=wizard.steps.get(kind="verification").position)
    with Load(url) as after:
        while verification.evaluate(wizard.pk) == "running":
            time.sleep(3)
            observe(cluster)
    return after


def post(client, wizard: Wizard, action: str, **data):
    wizard.refresh_from_db()
    response = client.post(
        reverse("remediation:wizard_action", args=[wizard.pk, action]),
        {"revision": wizard.revision, **data},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    assert b'role="alert"' not in response.content, response.content.decode()[:3000]
    return response


def test_an_operator_fixes_a_plain_app_s_oom_kills_with_measured_values_verified_by_the_clients(
    oom_lab, team, people, client, settings
):
    cluster = registered(oom_lab, "oom-lab", team, settings)
    url = f"{oom_lab.serve_url}/plain"

    # 0-1. Watched at rest, then the load gets the replica killed.
    marks = {"rest": time.time()}  # when each phase began, to read the proxy's counts against
    marks["load"] = time.time()
    incident, before = killed_under_load(cluster, url)
    marks["load ended"] = time.time()
    assert incident.causes[0]["id"] == "OOM-2"

    # 2. The operator opens the wizard from the incident page. Nothing trustworthy is measured, so
    #    the wizard computes nothing and asks for a calibration first.
    client.force_login(people["operator"])
    assert client.post(reverse("remediation:wizard_start"), {"incident": incident.pk}).status_code == 302
    wizard = Wizard.objects.get(incident=incident)
    assert wizard.diagnosis["needs_calibration"]
    # The operator states this service's objectives on the wizard: clients may wait up to 20 s and 5 % may
    # fail. The queue bound is sized for them, and the verdict judges against them.
    post(client, wizard, "objectives", latency_objective_ms=20_000, failure_percent=5)
    wizard.refresh_from_db()
    assert wizard.latency_objective_ms == 20_000 and wizard.diagnosis["objectives"]["given"]["latency_objective_ms"]
    # What Ray's per-process memory showed under the load: a replica's size at rest and a bound
    # per request that is below the truth (admitted is not resident), shown but sizing nothing.
    seen = wizard.diagnosis["observed"]
    assert seen is not None and seen["lower_bound"] and seen["baseline_bytes"] > 0, seen
    # Memory read as the load began, before the requests gauge showed it, is not a replica at rest:
    # at rest it holds its model, not a request's 500 MiB too (that would halve the sized values).
    assert seen["idle_readings"] and seen["baseline_bytes"] < (BASE_MB + ALLOC_MB) * MIB, seen
    readings = [
        {k: p.get(k) for k in ("t", "ongoing", "rps", "rss_mb", "replicas", "starts")} for p in signal_points(cluster)
    ]
    assert seen["per_request_bytes"] is None or seen["per_request_bytes"] <= 1.1 * ALLOC_MB * MIB, f"{seen} {readings}"
    calibration_step = wizard.steps.get(kind="calibration")
    assert calibration_step.position == 1 and wizard.steps.get(remedy="R1").patch is None

    # 3. The calibration drives the app's own route (no request given: a GET of /plain) at rising concurrency.
    marks["calibration"] = time.time()
    post(client, wizard, "calibrate", step=calibration_step.position)
    run = calibrated(wizard)
    assert run.shape == "starlette" and run.request["representative"]["path"] == "/plain"
    post(client, wizard, "replan", step=0)
    wizard.refresh_from_db()
    assert wizard.steps.get(kind="calibration").status == "done" and not wizard.diagnosis["needs_calibration"]

    # 4. The values come from what the calibration measured: its per-request memory, the budget and the CPUs.
    memory, budget, plan = (
        wizard.diagnosis["memory"],
        wizard.diagnosis["budget"]["bytes_per_node"],
        wizard.diagnosis["plan"],
    )
    assert memory["source"] == "calibration" and not memory["lower_bound"]
    assert 0.8 * ALLOC_MB * MIB <= memory["per_request_bytes"] <= 2 * ALLOC_MB * MIB, memory
    steps = {s.remedy: s for s in wizard.steps.all() if s.remedy}
    r1, auto, queue = (
        steps["R1"].patch,
        steps["R2"].patch["autoscaling_config"],
        steps["R10"].patch["max_queued_requests"],
    )
    assert r1["max_ongoing_requests"] == plan["concurrency"] and auto["max_replicas"] == plan["replicas"], (
        plan,
        wizard.diagnosis["budget"],
        memory,
        run.points,
    )
    measured_peak = next(p["peak_bytes"] for p in run.points if p["x"] == plan["concurrency"])
    assert plan["peak_bytes"] >= measured_peak and plan["peak_bytes"] * auto["max_replicas"] <= budget, (plan, budget)
    # 2 CPUs at 0.5 each: never more replicas than the node schedules.
    assert auto["max_replicas"] <= 4 and queue >= 1

    # 5. R1 + R2 + R10 applied as one change through the protocol (the worker's part runs here).
    marks["change"] = time.time()
    change = applied(client, wizard, steps, cluster)

    # 6. Verification under the same load, judged by what the clients got at the proxy.
    marks["verification"] = time.time()
    after = verified(client, wizard, cluster, url)
    wizard.refresh_from_db()
    print(
        f"\nwizard #{wizard.pk}: R1 {r1}, R2 {auto}, R10 {queue}; plan {plan}; before {wizard.before}; after "
        f"{wizard.after}; clients before: {sorted(set(map(str, before.statuses)))}, after: "
        f"{sorted(set(map(str, after.statuses)))}"
    )
    proxy = [(p["t"], p.get("http"), p.get("http_errors")) for p in signal_points(cluster) if "http" in p]
    assert wizard.state == "resolved", (
        f"{wizard.outcome} {wizard.after} {after.failures[:5]} proxy readings: {proxy} phases: {marks}"
    )
    assert wizard.after["oom_kills"] == 0 and wizard.before["oom_kills"] >= 1 and wizard.before["healthy"] is False
    assert wizard.after["client_requests"] and wizard.after["client_failed_share"] <= wizard.failure_objective
    failed = [s for s in after.statuses if s != 200]
    assert after.statuses.count(200) > CLIENTS and len(failed) <= 0.05 * len(after.statuses), failed[:20]
    incident.refresh_from_db()
    assert incident.status == "resolved"
    assert incident.timeline.filter(message__contains=f"changes #{change.pk}").exists()
    page = client.get(
        reverse("remediation:wizard", args=[wizard.pk]), {"step": wizard.steps.get(kind="outcome").position}
    )
    assert b"Fixed and verified" in page.content
