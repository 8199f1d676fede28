"""From a real OOM kill to a verified fix for traffic of mixed request sizes, through the wizard in
the UI, on a dedicated Ray cluster, for the plain Starlette app of deploy/plain_app (no Fleetdeck hook).

Four requests in five ask the app for SMALL_MB, one for LARGE_MB (its own `?mb=` query), as a fifth
of a real workload's requests are several times heavier than the rest. Sized from one representative
request, a replica is unsafe the moment two large requests meet on it. The operator gives the wizard
the mix; the calibration measures each request on its own, the sizing reads the peak of a replica
holding that many requests drawn from the mix at its high quantile, and verification under the same
mixed load, judged by the clients at the proxy, must see no kill."""

from __future__ import annotations

import copy
import json

import pytest
from django.urls import reverse

from apps.calibration import services as calibrations
from apps.demo.local_ray import LocalRayHead, memory_monitor_env, threshold_for_headroom
from apps.remediation.models import Wizard
from tests.integration.test_wizard_real_ray import (
    CONFIG,
    MIB,
    applied,
    calibrated,
    killed_under_load,
    post,
    registered,
    verified,
)

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
SMALL_MB, LARGE_MB = 150, 900
MIX = [
    {"request": {"kind": "http", "method": "GET", "path": "/plain", "query": f"mb={SMALL_MB}"}, "share": 80},
    {"request": {"kind": "http", "method": "GET", "path": "/plain", "query": f"mb={LARGE_MB}"}, "share": 20},
]


@pytest.fixture(scope="module")
def mixed_lab():
    buckets = {"RAY_SERVE_REQUEST_LATENCY_BUCKETS_MS": "100,500,1000,2000,5000,10000,15000,20000,30000,60000,120000"}
    head = LocalRayHead.start(extra_env=memory_monitor_env(threshold_for_headroom(4)) | buckets)
    try:
        head.wait_ready()
        config = copy.deepcopy(CONFIG)
        config["applications"][0]["runtime_env"]["env_vars"]["PLAIN_ALLOC_MB"] = str(SMALL_MB)
        head.deploy(config)
        yield head
    finally:
        head.stop()


def mixed(url: str):
    """A client's n-th request: every fifth one large."""
    return lambda n: f"{url}?mb={LARGE_MB if n % 5 == 4 else SMALL_MB}"


def test_a_mixed_workload_s_oom_kills_are_fixed_from_a_calibrated_mix_verified_by_the_clients(
    mixed_lab, team, people, client, settings
):
    cluster = registered(mixed_lab, "mixed-lab", team, settings)
    url = f"{mixed_lab.serve_url}/plain"
    incident, before = killed_under_load(cluster, mixed(url))

    client.force_login(people["operator"])
    assert client.post(reverse("remediation:wizard_start"), {"incident": incident.pk}).status_code == 302
    wizard = Wizard.objects.get(incident=incident)
    post(client, wizard, "objectives", latency_objective_ms=20_000, failure_percent=5)
    calibration_step = wizard.steps.get(kind="calibration")

    # The operator gives the mix the traffic has; the job measures each request on its own.
    post(client, wizard, "calibrate", step=calibration_step.position, mix=json.dumps(MIX))
    run = calibrated(wizard)
    post(client, wizard, "replan", step=0)
    wizard.refresh_from_db()

    curve = calibrations.curve_of(run)
    small, large = curve.mix
    assert curve.is_mixed and (small.share, large.share) == (80.0, 20.0)
    assert 0.8 * SMALL_MB * MIB <= small.increment_bytes <= 1.6 * SMALL_MB * MIB
    assert 0.9 * LARGE_MB * MIB <= large.increment_bytes <= 1.3 * LARGE_MB * MIB
    plan, budget = wizard.diagnosis["plan"], wizard.diagnosis["budget"]["bytes_per_node"]
    steps = {s.remedy: s for s in wizard.steps.all() if s.remedy}
    r1, auto = steps["R1"].patch, steps["R2"].patch["autoscaling_config"]
    # Sized from the mix, not from its most common request: the peak of a replica at the chosen
    # concurrency is the mix's quantile, which holds two large requests at once when two fit.
    assert r1["max_ongoing_requests"] == plan["concurrency"] and auto["max_replicas"] == plan["replicas"]
    assert (
        plan["peak_bytes"]
        >= curve.mix_peak(plan["concurrency"])
        >= curve.baseline_bytes + plan["concurrency"] * min(large.increment_bytes, 2 * small.increment_bytes)
    )
    assert plan["peak_bytes"] * auto["max_replicas"] <= budget, (plan, budget)
    print(
        f"\nmix: +{small.increment_bytes / MIB:.0f} MiB ({small.share:g} %), +{large.increment_bytes / MIB:.0f} MiB "
        f"({large.share:g} %); plan {plan}; budget {budget / MIB:.0f} MiB; R1 {r1}, R2 {auto}"
    )

    applied(client, wizard, steps, cluster)
    after = verified(client, wizard, cluster, mixed(url))
    wizard.refresh_from_db()
    failed = [s for s in after.statuses if s != 200]
    print(
        f"before: {len(before.statuses)} requests, {sum(s != 200 for s in before.statuses)} failed; after "
        f"{wizard.after}; clients after: {len(after.statuses)} requests, {len(failed)} failed"
    )
    assert wizard.state == "resolved", f"{wizard.outcome} {wizard.after} {after.failures[:5]}"
    assert wizard.after["oom_kills"] == 0 and wizard.before["oom_kills"] >= 1
    assert after.statuses.count(200) > 8 and len(failed) <= 0.05 * len(after.statuses), failed[:20]
