"""Incidents to an Alertmanager and to Slack: the bodies those receivers take, a resolution sent
when the incident resolves, an open incident's alert re-sent so Alertmanager keeps it."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.core import jobs
from apps.incidents import actions, services, webhooks
from apps.incidents.models import Incident, Webhook, WebhookDelivery
from tests.unit.incidents.test_webhooks import endpoint, oom_cluster  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def opened(oom_cluster, team, people, url, kind):
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=url, kind=kind)
    [incident_id] = services.detect(oom_cluster.pk)
    return Incident.objects.get(pk=incident_id)


def sent(hook) -> list:
    return [(path, json.loads(body)) for path, (headers, body) in zip(hook.paths, hook.received, strict=True)]


def test_alertmanager_gets_the_alert_with_routing_labels_then_its_end(
    oom_cluster,
    team,
    people,
    endpoint,
    settings,
):
    settings.FLEETDECK_BASE_URL = "https://fleetdeck.example.com"
    hook = endpoint(200, 200)
    incident = opened(oom_cluster, team, people, hook.url, Webhook.Kind.ALERTMANAGER)
    webhooks.deliver(WebhookDelivery.objects.get(incident=incident).pk)

    actions.set_status(Actor(user=people["operator"]), incident, Incident.Status.RESOLVED)
    webhooks.deliver(WebhookDelivery.objects.get(incident=incident, event="resolved").pk)

    (path, [firing]), (_, [ended]) = sent(hook)
    assert path == "/hooks/fleetdeck/api/v2/alerts"  # the webhook's URL is Alertmanager's base
    assert firing["labels"] == {
        "alertname": "FleetdeckIncident",
        "team": team.slug,
        "cluster": "gpu-prod",
        "application": incident.application_name,
        "deployment": "Model",
        "kind": "oom_kill",
        "severity": incident.severity,
        "cause": "OOM-2",
        "incident": str(incident.pk),
    }
    link = f"https://fleetdeck.example.com/incidents/{incident.pk}/"
    assert firing["annotations"]["summary"] == incident.title and firing["annotations"]["incident_url"] == link
    assert "endsAt" not in firing and firing["generatorURL"] == link
    incident.refresh_from_db()
    assert ended["labels"] == firing["labels"] and ended["endsAt"] == incident.resolved_at.isoformat()


def test_slack_gets_a_readable_message_with_the_link_and_the_resolution(
    oom_cluster,
    team,
    people,
    endpoint,
    settings,
):
    settings.FLEETDECK_BASE_URL = "https://fleetdeck.example.com"
    hook = endpoint(200, 200)
    incident = opened(oom_cluster, team, people, hook.url, Webhook.Kind.SLACK)
    webhooks.deliver(WebhookDelivery.objects.get(incident=incident).pk)
    Incident.objects.filter(pk=incident.pk).update(last_signal_at=timezone.now() - timedelta(days=1))
    services.resolve_quiet()
    webhooks.deliver(WebhookDelivery.objects.get(incident=incident, event="resolved").pk)

    (_, opened_message), (_, resolved_message) = sent(hook)
    link = f"https://fleetdeck.example.com/incidents/{incident.pk}/"
    assert (
        f"<{link}|{incident.title}>" in opened_message["text"]
        and f"gpu-prod {incident.application_name}/Model" in opened_message["text"]
    )
    assert "• OOM-2" in opened_message["text"]
    assert resolved_message["text"].startswith(
        f":white_check_mark: Resolved on gpu-prod {incident.application_name}/Model"
    )


def test_the_json_webhook_hears_of_the_resolution_too(oom_cluster, team, people, endpoint):
    hook = endpoint(200, 200)
    incident = opened(oom_cluster, team, people, hook.url, Webhook.Kind.JSON)
    actions.set_status(Actor(user=people["operator"]), incident, Incident.Status.RESOLVED)
    for delivery in WebhookDelivery.objects.filter(incident=incident).order_by("pk"):
        webhooks.deliver(delivery.pk)
    assert [body["event"] for _, body in sent(hook)] == ["incident.opened", "incident.resolved"]
    assert sent(hook)[1][1]["incident"]["resolved_at"]


def test_an_open_incident_is_re_sent_to_alertmanager_and_a_resolved_one_is_not(
    oom_cluster,
    team,
    people,
    endpoint,
    settings,
):
    settings.FLEETDECK_ALERTMANAGER_RESEND_S = 60
    hook = endpoint(*[200] * 5)
    incident = opened(oom_cluster, team, people, hook.url, Webhook.Kind.ALERTMANAGER)
    assert list(webhooks.alerts_still_open()) == []  # just sent

    WebhookDelivery.objects.update(created_at=timezone.now() - timedelta(seconds=61))
    [job] = list(webhooks.alerts_still_open())
    assert job.name == jobs.DELIVER_WEBHOOK and list(webhooks.alerts_still_open()) == []
    reminder = WebhookDelivery.objects.get(pk=job.args[0])
    assert reminder.event == "still_open"

    # Resolved before the reminder went out: it is not sent, or it would open the alert again.
    actions.set_status(Actor(user=people["operator"]), incident, Incident.Status.RESOLVED)
    webhooks.deliver(reminder.pk)
    reminder.refresh_from_db()
    assert reminder.state == "delivered" and "resolved meanwhile" in reminder.last_error and hook.received == []
    WebhookDelivery.objects.update(created_at=timezone.now() - timedelta(seconds=61))
    assert list(webhooks.alerts_still_open()) == []


def test_the_api_takes_the_kind_and_refuses_one_it_does_not_know(api_as, team, endpoint):
    api = api_as("admin")
    url = endpoint(200).url
    made = api.post("/api/v1/webhooks/", {"team": team.slug, "url": url, "kind": "alertmanager"}, format="json")
    assert made.status_code == 201 and made.json()["kind"] == "alertmanager"
    bad = api.post("/api/v1/webhooks/", {"team": team.slug, "url": url, "kind": "pagerduty"}, format="json")
    assert bad.status_code == 400 and list(bad.json()) == ["kind"]
