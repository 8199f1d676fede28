"""What clients saw at the proxy while a change ran, and the rollout wave that spends more than its
client error budget: stopped, and rolled back."""

from __future__ import annotations

import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol, rollouts
from apps.changes.models import Change, ChangeState, Preset, Rollout
from apps.clusters.models import Cluster
from apps.fleet import client_impact, sync
from integrations import ray_metrics
from integrations.ray_metrics import Sample, Scrape
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory
from tests.fake_ray import FakeRay, serving

REQUESTS, ERRORS = "ray_serve_num_http_requests_total", "ray_serve_num_http_error_requests_total"


def proxy(at: float, *, ok: int, failed: dict[str, int] | None = None, app: str = "demo") -> Scrape:
    """The proxy's two counters as Ray exports them: one series per route and status code."""
    failed = failed or {}
    samples = [Sample(REQUESTS, {"application": app, "route": f"/{app}", "status_code": "200"}, float(ok))]
    for code, n in failed.items():
        samples.append(Sample(REQUESTS, {"application": app, "route": f"/{app}", "status_code": code}, float(n)))
        samples.append(Sample(ERRORS, {"application": app, "route": f"/{app}", "error_code": code}, float(n)))
    # The proxy's own routes (health checks, 404s for unknown paths) belong to no application.
    samples.append(Sample(ERRORS, {"application": "", "route": "", "error_code": "404"}, 7.0))
    return Scrape(at=at, samples=samples)


def test_the_window_counts_requests_and_failures_by_code_and_a_404_is_the_client_s_own():
    before = proxy(100.0, ok=1000, failed={"503": 2})
    after = proxy(130.0, ok=1290, failed={"503": 6, "500": 4, "404": 3})
    impact = client_impact.summary(before, after)
    assert (impact["requests"], impact["failed"]) == (290 + 4 + 4 + 3, 8)
    assert impact["by_application"]["demo"]["by_code"] == {"500": 4, "503": 4}
    assert impact["share"] == pytest.approx(8 / 301, abs=1e-6)
    assert client_impact.sentence(impact) == (
        "Clients: 301 requests at the proxy meanwhile, 8 failed (2.66 %; 500 ×4, 503 ×4)."
    )


def test_a_proxy_that_restarted_counts_from_zero_and_says_so():
    impact = client_impact.summary(proxy(100.0, ok=1000), proxy(130.0, ok=50, failed={"500": 2}))
    assert (impact["requests"], impact["failed"]) == (52, 2)
    assert any("went backwards" in w for w in impact["warnings"])


@pytest.fixture
def scrapes(monkeypatch):
    """Ray's metrics endpoint, answering the scrapes queued here in order."""
    queued: list[Scrape] = []

    def scrape(url, *, timeout_s, names=None):
        if not queued:
            raise ray_metrics.MetricsUnavailable(f"Cannot reach {url}: connection refused.", transient=True)
        return queued.pop(0)

    monkeypatch.setattr(client_impact.ray_metrics, "scrape", scrape)
    return queued


@pytest.fixture
def quick(settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 5
    settings.FLEETDECK_CHANGE_POLL_S = 0.05


def applied(cluster: Cluster, options: dict) -> Change:
    actor = Actor.system(via="cli")
    change = protocol.plan_change(
        actor, cluster, targets=[{"application": "demo", "deployment": "Model"}], options=options, reason="test"
    )
    protocol.request_apply(actor, change)
    protocol.run(change.pk)
    change.refresh_from_db()
    return change


@pytest.mark.django_db
def test_a_verified_change_records_what_its_clients_saw_at_the_proxy(team, scrapes, quick):
    with serving(FakeRay()) as fake:
        cluster = ClusterFactory(name="c", team=team, dashboard_url=fake.url, metrics_url="http://metrics.test/m")
        assert sync.sync_cluster(cluster.pk).ok
        scrapes[:] = [proxy(100.0, ok=500), proxy(140.0, ok=780, failed={"500": 3})]
        change = applied(cluster, {"max_queued_requests": 10})
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert change.client_impact["measured"] and (change.client_impact["requests"], change.client_impact["failed"]) == (
        283,
        3,
    )
    assert change.steps.filter(message__startswith="Clients: 283 requests at the proxy meanwhile, 3 failed").exists()
    assert change.clients_seen.startswith("Clients: 283 requests")


@pytest.mark.django_db
def test_a_cluster_without_metrics_says_its_clients_were_not_measured(team, scrapes, quick):
    with serving(FakeRay()) as fake:
        cluster = ClusterFactory(name="c", team=team, dashboard_url=fake.url)
        assert sync.sync_cluster(cluster.pk).ok
        change = applied(cluster, {"max_queued_requests": 10})
    assert change.state == ChangeState.SUCCEEDED
    assert change.client_impact == {
        "measured": False,
        "why": "the cluster has no metrics source (set its Prometheus or metrics URL to measure the proxy's errors).",
    }
    assert "Clients not measured" in change.clients_seen


@pytest.mark.django_db
def test_an_endpoint_down_at_the_end_leaves_the_change_verified_and_says_why(team, scrapes, quick):
    with serving(FakeRay()) as fake:
        cluster = ClusterFactory(name="c", team=team, dashboard_url=fake.url, metrics_url="http://metrics.test/m")
        assert sync.sync_cluster(cluster.pk).ok
        scrapes[:] = [proxy(100.0, ok=500)]
        change = applied(cluster, {"max_queued_requests": 10})
    assert change.state == ChangeState.SUCCEEDED
    assert change.client_impact["measured"] is False and "connection refused" in change.client_impact["why"]


# --- rollouts -------------------------------------------------------------------------------


@pytest.fixture
def fleet(team, use_replay):
    made = []
    for name in ("eu-prod", "us-prod", "ap-prod"):
        cluster = ClusterFactory(name=name, team=team, dashboard_url=f"http://{name}.test:8265")
        sync.sync_cluster(cluster.pk)
        made.append(cluster)
    return made


def planned(operator, **extra) -> Rollout:
    return rollouts.plan_rollout(
        operator,
        selection={"deployment": "Model"},
        reason="fleet OOMs",
        preset=Preset.objects.get(slug="heavy-gpu-model"),
        canary="eu-prod",
        **extra,
    )


@pytest.fixture
def applied_live(use_replay):
    """The replayed clusters run what their changes pushed, as after a verified change; the
    rollback then has something to restore."""

    def apply(change: Change) -> None:
        serve = ray_fixture("serve_applications_two_apps.json")
        for app in change.new_config["applications"]:
            serve["applications"][app["name"]]["deployed_app_config"] = app
        use_replay.routes["/api/serve/applications/"] = serve

    return apply


def succeed(change: Change, *, requests: int, failed: int) -> None:
    """The worker's end of a change: verified, with what its proxy counted."""
    impact = {
        "measured": True,
        "requests": requests,
        "failed": failed,
        "share": failed / requests if requests else None,
        "by_application": {"demo": {"requests": requests, "failed": failed, "by_code": {"500": failed}}},
    }
    Change.objects.filter(pk=change.pk).update(state=ChangeState.SUCCEEDED, client_impact=impact)


@pytest.mark.django_db
def test_a_wave_within_its_budget_moves_on(fleet, people):
    operator = Actor(user=people["operator"])
    rollout = planned(operator)
    assert rollout.client_error_budget == 0.001
    rollouts.start(operator, rollout)
    succeed(rollout.changes.get(wave=0), requests=10_000, failed=10)  # 0.1 %: at the budget, not over
    rollouts.advance(rollout.pk)
    assert set(rollout.changes.filter(wave=1).values_list("state", flat=True)) == {ChangeState.QUEUED}


@pytest.mark.django_db
def test_a_canary_over_its_client_error_budget_stops_the_rollout_and_is_rolled_back(fleet, people, applied_live):
    operator = Actor(user=people["operator"])
    rollout = planned(operator, client_error_budget=0.005)
    rollouts.start(operator, rollout)
    canary = rollout.changes.get(wave=0)
    succeed(canary, requests=600, failed=6)  # 1 %, over 0.5 %
    applied_live(canary)

    rollouts.advance(rollout.pk)
    rollouts.advance(rollout.pk)  # the tick after the signal: one rollback, not two

    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.FAILED
    restore = Change.objects.get(restores=canary)
    assert restore.kind == Change.Kind.RESTORE and restore.state == ChangeState.QUEUED
    assert rollout.error == (
        f"eu-prod: change #{canary.pk} verified, but clients saw 6 of 600 requests fail at the proxy (the wave: "
        f"1.00 %, over the 0.5 % budget), rolled back by change #{restore.pk}"
    )
    assert set(rollout.changes.filter(wave=1).values_list("state", flat=True)) == {ChangeState.CANCELLED}


@pytest.mark.django_db
def test_a_wave_is_judged_by_all_its_clusters_together_and_unmeasured_ones_are_not_counted(fleet, people, applied_live):
    operator = Actor(user=people["operator"])
    rollout = planned(operator)
    rollouts.start(operator, rollout)
    succeed(rollout.changes.get(wave=0), requests=1000, failed=0)
    rollouts.advance(rollout.pk)
    us, ap = rollout.changes.filter(wave=1).order_by("cluster__name")
    succeed(us, requests=1000, failed=3)
    applied_live(us)  # the replay answers every cluster alike
    Change.objects.filter(pk=ap.pk).update(
        state=ChangeState.SUCCEEDED, client_impact={"measured": False, "why": "no metrics endpoint"}
    )
    rollouts.advance(rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.FAILED  # 3 of 1000 over 0.1 %; ap-prod's clients unknown
    assert Change.objects.filter(restores__in=[us, ap]).count() == 2
    assert rollouts.wave_impact(list(rollout.changes.filter(wave=1))) == {
        "measured": True,
        "windows": 1,
        "unmeasured": 1,
        "requests": 1000,
        "failed": 3,
        "share": 0.003,
    }


@pytest.mark.django_db
def test_a_budget_outside_zero_to_one_is_refused(fleet, people, api_as):
    with pytest.raises(Exception, match="between 0 and 1"):
        planned(Actor(user=people["operator"]), client_error_budget=5)
    response = api_as("operator").post(
        "/api/v1/rollouts/",
        {"selection": {"deployment": "Model"}, "preset": "heavy-gpu-model", "reason": "r", "client_error_budget": 2},
        format="json",
    )
    assert response.status_code == 400 and "client_error_budget" in response.json()
    assert not Rollout.objects.exists()
