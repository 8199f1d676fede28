"""Faults of the outside world during sync, push and verification, from a fault-injecting fake Ray
dashboard on a real socket (tests/fake_ray.py): hangs, resets, slow bodies, 500s, malformed and
enormous JSON, wrong content types. Whatever happens, the change ends in a final state with a step
log that says what happened, every application still exists, and the cluster runs exactly the
base or the new config."""

from __future__ import annotations

import time

import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import ChangeState
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Application
from tests.fake_ray import FakeRay, serving

pytestmark = pytest.mark.django_db
MODEL = [{"application": "demo", "deployment": "Model"}]


@pytest.fixture
def fake(settings):
    settings.FLEETDECK_RAY_TIMEOUT_S = 1.0
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 4
    settings.FLEETDECK_CHANGE_POLL_S = 0.1
    with serving() as fake:
        yield fake


@pytest.fixture
def cluster(fake, team):
    cluster = Cluster.objects.create(name="faulty", team=team, dashboard_url=fake.url, ray_version="2.60.0")
    assert sync.sync_cluster(cluster.pk).ok
    return cluster


def change_through(cluster: Cluster, fake: FakeRay, value: int = 6, *, within_s: float = 30):
    operator = Actor.system(via="cli")
    change = protocol.plan_change(
        operator, cluster, targets=MODEL, options={"max_ongoing_requests": value}, reason="fault test"
    )
    protocol.request_apply(operator, change)
    started = time.monotonic()
    protocol.run(change.pk)
    change.refresh_from_db()
    log = "\n".join(step.message for step in change.steps.all())
    assert change.is_final, log
    assert time.monotonic() - started < within_s, "a fault made the change hang"
    assert set(fake.serve["applications"]) == {"demo", "echo2"}, "an application was lost"
    return change, log


@pytest.mark.parametrize(
    ("kind", "ends", "runs"),
    [
        ("hang", ChangeState.FAILED, 8),  # no answer, and the cluster still runs the base: nothing changed
        ("reset", ChangeState.FAILED, 8),
        ("500", ChangeState.FAILED, 8),
        ("apply-then-hang", ChangeState.SUCCEEDED, 6),  # the answer was lost but the push landed: verified
    ],
)
def test_a_push_that_fails_in_flight_ends_with_the_cluster_on_base_or_verified_new(cluster, fake, kind, ends, runs):
    fake.arm("PUT", "/api/serve/applications", kind, times=1)
    change, log = change_through(cluster, fake)
    assert change.state == ends, log
    assert fake.model_moq() == runs
    if ends == ChangeState.FAILED:
        assert "nothing changed" in change.error or "nothing changed" in log


@pytest.mark.parametrize("kind", ["hang", "500", "garbage", "html", "huge", "slow"])
def test_verification_rides_out_a_dashboard_that_misbehaves_for_a_while(cluster, fake, kind, settings):
    # The push lands; the next reads misbehave twice, then the dashboard answers again. A trickled
    # body is cut at the adapter's deadline (10 s here), so verification gets the time for two.
    if kind == "slow":
        settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 30
    original_apply = fake.apply

    def apply_and_break(config):
        original_apply(config)
        fake.arm("GET", "/api/serve/applications", kind, times=2)

    fake.apply = apply_and_break
    change, log = change_through(cluster, fake, within_s=45)
    assert change.state == ChangeState.SUCCEEDED, log
    assert fake.model_moq() == 6


def test_a_dashboard_that_stays_broken_after_the_push_is_rolled_back_or_recorded_as_not(cluster, fake):
    original_apply = fake.apply

    def apply_and_break(config):
        original_apply(config)
        if fake.model_moq() == 6:
            fake.arm("GET", "/api/serve/applications", "garbage")

    fake.apply = apply_and_break
    change, log = change_through(cluster, fake)
    # The rollback push lands (the base config runs again), but nothing can verify it: the record says so.
    assert change.state == ChangeState.ROLLBACK_FAILED, log
    assert fake.model_moq() == 8
    assert "did not answer JSON" in change.error or "not answering" in change.error, change.error


@pytest.mark.parametrize("kind", ["hang", "reset", "500", "garbage", "html", "huge", "slow"])
def test_a_sync_against_a_faulty_dashboard_keeps_the_inventory_and_says_why(cluster, fake, kind):
    fake.arm("GET", "/api/serve/applications", kind)
    result = sync.sync_cluster(cluster.pk)
    cluster.refresh_from_db()
    assert not result.ok and cluster.last_error
    assert set(Application.objects.filter(cluster=cluster, removed_at__isnull=True).values_list("name", flat=True)) == {
        "demo",
        "echo2",
    }
