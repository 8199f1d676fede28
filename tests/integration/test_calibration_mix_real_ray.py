"""A calibration of a weighted mix on a real Ray head: the plain Starlette app of deploy/plain_app,
written as in Ray's docs with no Fleetdeck hook, asked for two request sizes through its own
`?mb=` query, each measured on its own by the job, and the increments coming back as it allocates."""

from __future__ import annotations

import copy
import time

import pytest

from apps.accounts.audit import Actor
from apps.calibration import services
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.conftest import two_app_config
from tests.integration.test_calibration_shapes_real_ray import BASE_MB, HOLD_S, plain_application

pytestmark = [pytest.mark.ray, pytest.mark.django_db]
MIB = 2**20
# Both above glibc's largest mmap threshold (32 MiB): each allocation is its own mapping, returned when freed,
# so the allocator's retention does not blur the two sizes.
SMALL_MB, LARGE_MB = 40, 160


@pytest.fixture
def cluster(ray_head, team):
    config = copy.deepcopy(two_app_config())
    config["applications"].append(plain_application("plain", "plain_app:app", ["Plain"]))
    ray_head.deploy(config)
    cluster = Cluster.objects.create(
        name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0"
    )
    assert sync.sync_cluster(cluster.pk).ok
    yield Cluster.objects.get(pk=cluster.pk)
    ray_head.deploy(two_app_config())


def test_a_mix_of_two_request_sizes_is_measured_request_by_request_on_the_cluster(cluster, people):
    plain = Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="plain", name="Plain"
    )
    mix = [
        {"request": {"kind": "http", "method": "GET", "path": "/plain", "query": f"mb={SMALL_MB}"}, "share": 80},
        {"request": {"kind": "http", "method": "GET", "path": "/plain", "query": f"mb={LARGE_MB}"}, "share": 20},
    ]
    calibration = services.request_calibration(
        Actor(user=people["operator"], via="test"), plain, levels=[1, 2], mix=mix
    )
    deadline = time.monotonic() + 240
    while not calibration.is_final:
        assert time.monotonic() < deadline, f"calibration still {calibration.state}"
        time.sleep(1)
        calibration = services.poll(calibration.pk)
    assert calibration.state == "succeeded", f"{calibration.error}\n{calibration.log_tail}"

    curve = services.latest_curve(plain)
    small, large = curve.mix
    print(
        f"\nat rest {curve.baseline_bytes / MIB:.1f} MiB; "
        + "; ".join(
            f"{e.label} ({e.share:g} %): +{e.increment_bytes / MIB:.1f} MiB, levels "
            + ", ".join(f"{x:g} -> {peak / MIB:.1f} MiB" for x, peak in e.points)
            for e in curve.mix
        )
        + f"; sized peaks {', '.join(f'{c}: {curve.mix_peak(c) / MIB:.1f} MiB' for c in (1, 2, 4))}"
    )
    assert curve.is_mixed and curve.shape == "starlette" and curve.limit_reason is None
    assert (small.label, small.share, large.label, large.share) == (
        f"GET /plain?mb={SMALL_MB}",
        80.0,
        f"GET /plain?mb={LARGE_MB}",
        20.0,
    )
    assert [x for x, _ in small.points] == [x for x, _ in large.points] == [1.0, 2.0]
    # Each request fills its own ?mb= and holds it while the others run: the increments differ as the app allocates.
    assert SMALL_MB * MIB * 0.8 <= small.increment_bytes <= SMALL_MB * MIB * 1.6
    assert LARGE_MB * MIB * 0.9 <= large.increment_bytes <= LARGE_MB * MIB * 1.3
    assert large.increment_bytes > 3 * small.increment_bytes
    assert curve.cold_baseline_bytes >= BASE_MB * MIB
    assert all(HOLD_S <= seconds < HOLD_S + 2 for seconds in curve.service_s.values())
    # Two in flight are both large 4 % of the time, inside the sizing quantile: the replica is sized for both.
    assert curve.mix_peak(2) == curve.baseline_bytes + 2 * large.increment_bytes
    # The points the card and the API show are the largest share's own levels.
    assert curve.points == list(small.points)
