"""Fleetdeck's own /metrics: the fleet's state in Prometheus's format, behind its own bearer token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.changes.models import ChangeState
from tests.factories import ChangeFactory, ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db
TOKEN = "s3cret-metrics-token"


@pytest.fixture
def token(settings):
    settings.FLEETDECK_METRICS_TOKEN = TOKEN
    return TOKEN


def _scrape(client, token):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families.values()
        for sample in family.samples
    }


def test_the_fleet_as_prometheus_reads_it(client, team, token):
    now = timezone.now()
    fresh = ClusterFactory(team=team, name="fresh", reachability="ok", last_sync_at=now - timedelta(seconds=10))
    ClusterFactory(team=team, name="late", reachability="unreachable", last_sync_at=now - timedelta(seconds=600))
    IncidentFactory(cluster=fresh, severity="critical")
    IncidentFactory(cluster=fresh, severity="warning", deployment_name="Other", status="resolved")
    ChangeFactory(cluster=fresh, state=ChangeState.ROLLED_BACK, started_at=now - timedelta(seconds=40), finished_at=now)
    samples = _scrape(client, token)
    name = team.name
    assert samples[("fleetdeck_clusters", (("reachability", "ok"), ("team", name)))] == 1
    assert samples[("fleetdeck_clusters", (("reachability", "unreachable"), ("team", name)))] == 1
    # Sync lag: one cluster 10 s behind, one 600 s.
    assert samples[("fleetdeck_sync_lag_seconds_bucket", (("le", "15"), ("team", name)))] == 1
    assert samples[("fleetdeck_sync_lag_seconds_bucket", (("le", "900"), ("team", name)))] == 2
    assert samples[("fleetdeck_open_incidents", (("kind", "oom_kill"), ("severity", "critical"), ("team", name)))] == 1
    assert not any(k[0] == "fleetdeck_open_incidents" and ("severity", "warning") in k[1] for k in samples)
    assert samples[("fleetdeck_changes_last_day", (("kind", "patch"), ("state", "rolled_back")))] == 1
    assert samples[("fleetdeck_change_duration_seconds_count", ())] == 1
    assert samples[("fleetdeck_change_duration_seconds_bucket", (("le", "60"),))] == 1
    assert samples[("fleetdeck_wizards_last_day", (("state", "open"),))] == 0


def test_without_the_token_the_scrape_is_refused(client, token):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics")["WWW-Authenticate"].startswith("Bearer")


def test_metrics_are_off_until_a_token_is_set(client, settings):
    settings.FLEETDECK_METRICS_TOKEN = ""
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything")
    assert response.status_code == 404 and b"FLEETDECK_METRICS_TOKEN" in response.content


def test_sync_durations_and_the_adapters_whose_last_request_failed(client, team, token):
    from apps.incidents.models import ScrapeState, Webhook, WebhookDelivery
    from apps.kubernetes.models import KubeConnection

    now = timezone.now()
    quick = ClusterFactory(team=team, name="quick", last_sync_at=now, last_sync_duration_ms=80)
    slow = ClusterFactory(team=team, name="slow", last_sync_at=now, last_sync_duration_ms=4000, last_error="")
    down = ClusterFactory(team=team, name="down", last_error="connection refused", reachability="unreachable")
    prom = ClusterFactory(team=team, name="prom", prometheus_url="http://prometheus.example:9090")
    ScrapeState.objects.create(cluster=slow, at=0, error="metrics endpoint answered 500")
    ScrapeState.objects.create(cluster=prom, at=0, error="Prometheus answered 503")
    ScrapeState.objects.create(cluster=quick, at=0)
    KubeConnection.objects.create(team=team, name="prod", last_error="401 Unauthorized")
    hook = Webhook.objects.create(team=team, kind=Webhook.Kind.SLACK, url="https://hooks.example/x")
    incident = IncidentFactory(cluster=down)
    WebhookDelivery.objects.create(webhook=hook, incident=incident, state=WebhookDelivery.State.FAILED)
    WebhookDelivery.objects.create(webhook=hook, incident=incident, state=WebhookDelivery.State.DELIVERED)

    samples = _scrape(client, token)
    name = team.name
    # A cluster never synced has no duration: two of the four are counted.
    assert samples[("fleetdeck_sync_duration_seconds_count", (("team", name),))] == 2
    assert samples[("fleetdeck_sync_duration_seconds_bucket", (("le", "0.1"), ("team", name)))] == 1
    assert samples[("fleetdeck_sync_duration_seconds_bucket", (("le", "5"), ("team", name)))] == 2
    assert samples[("fleetdeck_sync_duration_seconds_sum", (("team", name),))] == pytest.approx(4.08)
    failing = {k[1][0][1]: v for k, v in samples.items() if k[0] == "fleetdeck_outbound_failing_targets"}
    assert failing == {"ray_dashboard": 1, "metrics_scrape": 1, "prometheus": 1, "kubernetes": 1}
    assert samples[("fleetdeck_webhook_deliveries_last_day", (("kind", "slack"), ("state", "failed")))] == 1
    assert samples[("fleetdeck_webhook_deliveries_last_day", (("kind", "slack"), ("state", "delivered")))] == 1
