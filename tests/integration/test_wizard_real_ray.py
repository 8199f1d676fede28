"""From a real OOM kill to a verified fix, through the wizard in the UI, on a dedicated Ray cluster.

The Model deployment is set up like the seed's failure: up to 8 requests at once, each holding
800 MiB, on a node whose memory monitor trips about 4 GiB above what the machine used before the
cluster started. A fixed load of 6 concurrent clients kills it; the wizard measures memory per
request with a calibration job, computes R1 and R2, applies them through the change protocol, and
verification under the same load sees no further kill."""

from __future__ import annotations

import copy
import threading
import time

import httpx
import pytest
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.calibration import services as calibration
from apps.changes import protocol
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.incidents import services as incidents
from apps.incidents.models import Incident
from apps.remediation import verification
from apps.remediation.models import Wizard
from controlplane.local_ray import LocalRayHead
from tests.conftest import two_app_config
from tests.integration.test_oom_real_ray import GIB, used_fraction_plus

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
CLIENTS = 6
ALLOC_MB = 800


@pytest.fixture(scope="module")
def oom_lab():
    threshold = used_fraction_plus(4 * GIB)
    head = LocalRayHead.start(extra_env={"RAY_memory_usage_threshold": f"{threshold:.3f}", "RAY_memory_monitor_refresh_ms": "250"})
    try:
        head.wait_ready()
        config = copy.deepcopy(two_app_config())
        config["applications"] = config["applications"][:1]
        model = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")
        model["user_config"] = {"alloc_mb": ALLOC_MB, "hold_s": 2}
        head.deploy(config)
        yield head
    finally:
        head.stop()


class Load:
    """The same fixed schedule in both phases: CLIENTS clients, each sending one request after another."""

    def __init__(self, url: str):
        self.url, self.statuses, self._stop = url, [], threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def _client(self):
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    self.statuses.append(client.get(self.url, params={"text": "x"}).status_code)
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
    incidents.collect_metrics(cluster.pk)
    return touched


def post(client, wizard: Wizard, action: str, **data):
    wizard.refresh_from_db()
    response = client.post(reverse("remediation:wizard_action", args=[wizard.pk, action]), {"revision": wizard.revision, **data},
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert b'role="alert"' not in response.content, response.content.decode()[:3000]
    return response


def test_an_operator_goes_from_a_real_oom_kill_to_a_verified_fix_in_the_wizard(oom_lab, team, people, client, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 120
    settings.FLEETDECK_CHANGE_POLL_S = 0.5
    cluster = Cluster.objects.create(name="oom-lab", team=team, dashboard_url=oom_lab.dashboard_url, ray_version="2.60.0",
                                     serve_url=oom_lab.serve_url,
                                     metrics_url=f"http://127.0.0.1:{oom_lab.ports['metrics-export-port']}/metrics")
    url = f"{oom_lab.serve_url}/demo"

    # 1. The failure: the load gets the Model replica killed by Ray's memory monitor.
    with Load(url) as before:
        deadline = time.monotonic() + 120
        while not Incident.objects.filter(kind="oom_kill", deployment_name="Model").exists():
            assert time.monotonic() < deadline, f"no OOM kill under load; clients saw {before.statuses[-20:]}"
            time.sleep(2)
            observe(cluster)
    incident = Incident.objects.get(kind="oom_kill", deployment_name="Model")
    assert incident.causes[0]["id"] == "OOM-2"

    # 2. The operator opens the wizard from the incident page.
    client.force_login(people["operator"])
    assert client.post(reverse("remediation:wizard_start"), {"incident": incident.pk}).status_code == 302
    wizard = Wizard.objects.get(incident=incident)
    steps = {s.remedy: s for s in wizard.steps.all() if s.remedy}
    assert list(steps)[:2] == ["R1", "R2"]

    # 3. Memory per request is measured, not guessed: a calibration job on the cluster, then the values are recomputed.
    deployment = Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")
    run = calibration.request_calibration(Actor(user=people["operator"], via="ui"), deployment, levels=[1, 2], call="x")
    deadline = time.monotonic() + 180
    while not run.is_final:
        assert time.monotonic() < deadline, "calibration did not finish"
        time.sleep(2)
        run = calibration.poll(run.pk)
    assert run.state == "succeeded", f"{run.error}\n{run.log_tail}"
    post(client, wizard, "replan", step=0)
    wizard.refresh_from_db()
    memory = wizard.diagnosis["memory"]
    assert memory["source"] == "calibration" and memory["per_request_bytes"] >= 0.8 * ALLOC_MB * 2**20, memory
    steps = {s.remedy: s for s in wizard.steps.all() if s.remedy}
    r1, r2 = steps["R1"].patch, steps["R2"].patch["autoscaling_config"]
    # What fits: each replica's peak (baseline + cap × per request) times max_replicas within the budget.
    peak = memory["baseline_bytes"] + r1["max_ongoing_requests"] * memory["per_request_bytes"]
    assert r1["max_ongoing_requests"] <= 2 and r2["target_ongoing_requests"] == 1
    assert peak * r2["max_replicas"] <= wizard.diagnosis["budget"]["bytes_per_node"], (r1, r2, wizard.diagnosis["budget"])

    # 4. R1 + R2 applied as one change through the protocol (the worker's part runs here).
    post(client, wizard, "apply", steps=[steps["R1"].position, steps["R2"].position], step=steps["R1"].position)
    change = wizard.steps.get(remedy="R1").change
    protocol.run(change.pk)
    change.refresh_from_db()
    assert change.state == "succeeded", "\n".join(s.message for s in change.steps.all())
    assert {s.status for s in wizard.steps.filter(remedy__in=["R1", "R2"])} == {"applied"}
    observe(cluster)

    # 5. Verification under the same load: no further OOM kill; the incident resolves with the change linked.
    post(client, wizard, "verify", window_s=45, step=wizard.steps.get(kind="verification").position)
    wizard.refresh_from_db()
    with Load(url) as after:
        while verification.evaluate(wizard.pk) == "running":
            time.sleep(3)
            observe(cluster)
    wizard.refresh_from_db()
    print(f"\nwizard #{wizard.pk}: R1 {r1}, R2 {r2}; before {wizard.before}; after {wizard.after}; "
          f"clients before: {sorted(set(map(str, before.statuses)))}, after: {sorted(set(map(str, after.statuses)))}")
    assert wizard.state == "resolved", f"{wizard.outcome} {wizard.after}"
    assert wizard.after["oom_kills"] == 0 and wizard.before["oom_kills"] >= 1
    assert after.statuses.count(200) > CLIENTS, after.statuses[-20:]
    incident.refresh_from_db()
    assert incident.status == "resolved"
    assert incident.timeline.filter(message__contains=f"changes #{change.pk}").exists()
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": wizard.steps.get(kind="outcome").position})
    assert b"Fixed and verified" in page.content
