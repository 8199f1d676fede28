"""A real token-sum calibration: the reference app on the session's Ray head, its Generator
measured against batch token sum by a Ray job through its `calibration_batch` hook, and the
wizard's R4 limit computed from that curve and a real node-memory reading."""

from __future__ import annotations

import copy
import json
import time

import pytest
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.calibration import services
from apps.clusters.models import Cluster
from apps.core.catalogue import cause
from apps.demo.local_ray import REFERENCE_APP_DIR
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.incidents import ingest
from apps.incidents.models import Incident, NodeWindow
from apps.remediation import wizards
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
MIB, KIB = 2**20, 2**10
TOKEN_SUMS = [64, 256, 1024]


def reference_config() -> dict:
    return json.loads((REFERENCE_APP_DIR / "reference.json").read_text())


@pytest.fixture
def cluster(ray_head, team):
    # Added beside the two applications the session's head serves, which stay as they are.
    config = copy.deepcopy(two_app_config())
    config["applications"] += reference_config()["applications"]
    ray_head.deploy(config)
    cluster = Cluster.objects.create(
        name="local",
        team=team,
        dashboard_url=ray_head.dashboard_url,
        ray_version="2.60.0",
        metrics_url=f"http://127.0.0.1:{ray_head.ports['metrics-export-port']}/metrics",
    )
    assert sync.sync_cluster(cluster.pk).ok
    yield Cluster.objects.get(pk=cluster.pk)
    ray_head.deploy(two_app_config())


def node_reading(cluster: Cluster) -> dict:
    """The node's memory as Ray's own metrics report it (a reading needs two scrapes)."""
    deadline = time.monotonic() + 90
    while True:
        ingest.collect_metrics(cluster.pk)
        window = NodeWindow.objects.filter(cluster=cluster).first()
        if window is not None and window.points and window.points[-1].get("mem_total"):
            return window.points[-1]
        assert time.monotonic() < deadline, "no node memory reading from Ray's metrics endpoint"
        time.sleep(2)


def test_the_reference_generator_is_calibrated_by_token_sum_and_r4_is_computed_from_the_curve(cluster, people):
    generator = Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="reference", name="Generator"
    )
    user_config = generator.effective_config["user_config"]
    assert user_config["scratch_kb_per_token"] == 64 and user_config["max_batch_tokens"] == 1024

    operator = Actor(user=people["operator"], via="test")
    calibration = services.request_calibration(operator, generator, axis="token_sum", levels=TOKEN_SUMS)
    deadline = time.monotonic() + 240
    while not calibration.is_final:
        assert time.monotonic() < deadline, f"calibration still {calibration.state}"
        time.sleep(1)
        calibration = services.poll(calibration.pk)
    assert calibration.state == "succeeded", f"{calibration.error}\n{calibration.log_tail}"

    curve = services.latest_curve(generator)
    print(
        f"\nMeasured on the cluster: device {curve.device}, at rest {curve.baseline_bytes / MIB:.1f} MiB, "
        + ", ".join(f"{x:g} tokens -> {peak / MIB:.1f} MiB" for x, peak in curve.points)
        + f"; steepest step {curve.per_unit_bytes / KIB:.1f} KiB per token"
    )
    assert curve.axis == "token_sum" and curve.device == "cpu" and [x for x, _ in curve.points] == TOKEN_SUMS
    assert curve.monotone, calibration.warnings
    # The batch's own temporaries alone (64 KiB per token) separate the ends; a little allowance for noise.
    scratch = (TOKEN_SUMS[-1] - TOKEN_SUMS[0]) * user_config["scratch_kb_per_token"] * KIB
    assert curve.points[-1][1] - curve.points[0][1] >= 0.8 * scratch

    node = node_reading(cluster)
    now = timezone.now()
    incident = Incident.objects.create(
        kind="oom_kill",
        cluster=cluster,
        deployment=generator,
        application_name="reference",
        deployment_name="Generator",
        title="reference/Generator: OOM kill",
        started_at=now,
        last_signal_at=now,
        causes=[
            cause("OOM-1", "Memory peaks track the batch's token sum.", 1),
            cause("OOM-2", "Several requests share a replica.", 2),
        ],
    )
    wizard, _ = wizards.start(operator, incident=incident)
    steps = {s.remedy: s for s in wizard.steps.all() if s.remedy}
    r1, r4 = steps["R1"], steps["R4"]
    budget, memory = wizard.diagnosis["budget"], wizard.diagnosis["memory"]
    computed = r4.values["largest_fitting_tokens"]
    print(
        f"Node: {node['mem_used'] / MIB:,.0f} of {node['mem_total'] / MIB:,.0f} MiB used. Budget: {budget['reason']}\n"
        f"Memory: {memory['reason']}\n"
        f"max_ongoing_requests {r1.patch['max_ongoing_requests']}: {r1.values['reasons']['max_ongoing_requests']}\n"
        f"max_batch_tokens: {computed} fit (step {r4.kind}, {r4.status}, patch {r4.patch}): "
        f"{r4.values['reasons']['max_batch_tokens']} {' '.join(r4.values['warnings'])}"
    )

    # A request is priced at the deployment's own caps: 512 prompt + 128 generated tokens.
    assert memory["source"] == "calibration" and "640 tokens" in memory["reason"]
    share = budget["bytes_per_node"] // r1.values["replicas_per_node"]
    assert computed >= 1 and curve.peak_at(computed) <= share
    if "Capped at" not in r4.values["reasons"]["max_batch_tokens"]:
        assert curve.peak_at(computed + 1) > share
    # reference.json reads the limit from its user_config, so R4 is a config step on user_config.max_batch_tokens;
    # a lower limit already in place is kept.
    assert r4.kind == "config" and r4.patch == {"user_config": {"max_batch_tokens": min(computed, 1024)}}
    assert r4.values["value"] == {"max_batch_tokens": min(computed, 1024)}
    assert r4.status == ("not_applicable" if computed >= 1024 else "pending")
