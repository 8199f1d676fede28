"""Request sizes from a real application's own histogram, and a calibration mix taken from them, on a
real Ray head.

The application is deploy/plain_app's FastAPI shape, written as in Ray's docs: it exports the bytes of
each prompt with `ray.serve.metrics.Histogram` and fills memory in proportion to the prompt. Traffic of
small and large prompts goes through Serve's proxy; Fleetdeck reads the histogram from Ray's metrics
endpoint once the operator names it, the deployment page and the API show the distribution, and a
calibration with `"mix": "observed"` sends the template at each size class the traffic had, weighted
as it was, and measures each."""

from __future__ import annotations

import copy
import time

import httpx
import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.calibration import services
from apps.clusters.models import Cluster
from apps.fleet import request_sizes, sync
from apps.fleet.models import Deployment
from apps.incidents import ingest
from apps.incidents.request_sizes import observed
from tests.conftest import two_app_config
from tests.integration.test_calibration_shapes_real_ray import plain_application

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
MIB = 2**20
SMALL_BYTES, LARGE_BYTES = 700, 12_000  # buckets <= 1024 and <= 16384 of the app's histogram
SMALL_N, LARGE_N = 24, 6
MB_PER_KB = 8  # a 12 KB prompt fills ~94 MiB more than a 0.7 KB one
EXPORT_S = 11  # Ray exports a replica's metrics every ~10 s


@pytest.fixture
def cluster(ray_head, team):
    config = copy.deepcopy(two_app_config())
    app = plain_application("plainapi", "plain_app:fastapi_app", ["PlainAPI"])
    app["runtime_env"]["env_vars"] |= {"PLAIN_ALLOC_MB": "8", "PLAIN_HOLD_S": "0.5", "PLAIN_MB_PER_KB": str(MB_PER_KB)}
    config["applications"].append(app)
    ray_head.deploy(config)
    cluster = Cluster.objects.create(
        name="sizes",
        team=team,
        dashboard_url=ray_head.dashboard_url,
        ray_version="2.60.0",
        metrics_url=f"http://127.0.0.1:{ray_head.ports['metrics-export-port']}/metrics",
    )
    assert sync.sync_cluster(cluster.pk).ok
    yield Cluster.objects.get(pk=cluster.pk)
    ray_head.deploy(two_app_config())


def test_an_applications_size_histogram_is_read_shown_and_calibrated_from(ray_head, cluster, people, api_as):
    deployment = Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="plainapi", name="PlainAPI"
    )
    operator = Actor(user=people["operator"], via="test")
    # As an operator types it from a scrape: the suffix goes.
    request_sizes.set_size_metric(operator, deployment, metric="ray_plain_prompt_bytes_bucket", unit="bytes")
    deployment.refresh_from_db()
    assert deployment.size_metric == "ray_plain_prompt_bytes"

    ingest.collect_metrics(cluster.pk)  # the base scrape
    with httpx.Client(timeout=60) as client:
        for i in range(SMALL_N + LARGE_N):
            size = LARGE_BYTES if i % 5 == 4 else SMALL_BYTES
            answer = client.post(f"{ray_head.serve_url}/plainapi/generate", json={"prompt": "p" * size})
            assert answer.status_code == 200, answer.text
    deadline, counted = time.monotonic() + 90, 0.0
    while counted < SMALL_N + LARGE_N:
        assert time.monotonic() < deadline, f"the histogram counted {counted} of {SMALL_N + LARGE_N} requests"
        time.sleep(EXPORT_S)
        ingest.collect_metrics(cluster.pk)
        side = observed(deployment)["input"]
        counted = side["quantiles"]["requests"] if side else 0.0

    sizes = observed(deployment)
    by_bound = {b["le"]: b["requests"] for b in sizes["input"]["buckets"] if b["requests"]}
    print(f"\nobserved prompt bytes by bucket: {by_bound}; quantiles {sizes['input']['quantiles']}")
    assert sizes["source"] == {"metric": "ray_plain_prompt_bytes", "unit": "bytes", "output": None}
    assert by_bound == {"1024": SMALL_N, "16384": LARGE_N}
    assert sizes["output"] is None
    assert 256 < sizes["input"]["quantiles"]["p50"] <= 1024 < sizes["input"]["quantiles"]["p99"] <= 16384

    # The same through the API and on the page.
    api = api_as("viewer").get(f"/api/v1/deployments/{deployment.pk}/request-sizes/")
    assert api.status_code == 200 and api.json()["input"]["quantiles"]["requests"] == SMALL_N + LARGE_N
    viewer = Client()
    viewer.force_login(people["viewer"])
    page = viewer.get(reverse("fleet:deployment", args=[deployment.pk])).content.decode()
    assert "ray_plain_prompt_bytes" in page and 'id="request-sizes-chart"' in page

    calibration = services.request_calibration(
        operator,
        deployment,
        levels=[1, 2],
        mix="observed",
        request={"kind": "http", "method": "POST", "path": "/plainapi/generate", "json": {"prompt": "{pad}"}},
        observed=sizes,
    )
    assert [(e["share"], len(e["request"]["json"]["prompt"])) for e in calibration.mix] == [
        (80.0, len("{pad:1024}")),
        (20.0, len("{pad:16384}")),
    ]
    deadline = time.monotonic() + 240
    while not calibration.is_final:
        assert time.monotonic() < deadline, f"calibration still {calibration.state}"
        time.sleep(1)
        calibration = services.poll(calibration.pk)
    assert calibration.state == "succeeded", f"{calibration.error}\n{calibration.log_tail}"
    curve = services.latest_curve(deployment)
    small, large = curve.mix
    print(
        "; ".join(f"{e.label} ({e.share:g} %): +{e.increment_bytes / MIB:.1f} MiB" for e in curve.mix)
        + f"; sized peak at 2: {curve.mix_peak(2) / MIB:.1f} MiB"
    )
    assert (small.label, large.label) == (
        "POST /plainapi/generate with 1,024 bytes of filler",
        "POST /plainapi/generate with 16,384 bytes of filler",
    )
    # Each class was sent at its bucket's bound, and the app filled memory in proportion to it.
    expected_small, expected_large = (8 + MB_PER_KB * 1) * MIB, (8 + MB_PER_KB * 16) * MIB
    assert 0.8 * expected_small <= small.increment_bytes <= 1.6 * expected_small
    assert 0.9 * expected_large <= large.increment_bytes <= 1.3 * expected_large
    assert calibration.request["mix_from"] == {
        "source": "ray_plain_prompt_bytes",
        "unit": "bytes",
        "hours": 24,
        "requests": SMALL_N + LARGE_N,
        "above_last_bound": 0.0,
    }
