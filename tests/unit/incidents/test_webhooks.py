"""Incident webhooks: registration, signed JSON delivery to a real local endpoint, retries."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError

from apps.accounts.audit import Actor
from apps.clusters.models import Cluster, ClusterEvent
from apps.fleet import sync
from apps.incidents import services, webhooks
from apps.incidents.models import WebhookDelivery
from integrations import webhook_client
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


class Endpoint:
    """A real HTTP endpoint on loopback that answers the statuses it is given, in order."""

    def __init__(self, statuses):
        self.statuses, self.received = list(statuses), []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.received.append((dict(self.headers), body))
                self.send_response(endpoint.statuses.pop(0) if endpoint.statuses else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/fleetdeck"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    made = []

    def make(*statuses):
        made.append(Endpoint(statuses))
        return made[-1]

    yield make
    for e in made:
        e.close()


@pytest.fixture
def oom_cluster(team, use_replay, monkeypatch):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_oom_t1_modelonly_after_recovery.json"
    use_replay.routes["/api/v0/actors"] = "state_actors_dead_oom_t1_modelonly_detail.json"
    cluster = ClusterFactory(name="gpu-prod", team=team)
    sync.sync_cluster(cluster.pk)
    return cluster


def test_a_new_incident_is_posted_signed_and_retried_until_delivered(oom_cluster, team, people, endpoint):
    hook = endpoint(503, 200)
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=hook.url, secret="s3cret")
    [incident_id] = services.detect(oom_cluster.pk)
    delivery = WebhookDelivery.objects.get(incident_id=incident_id)

    with pytest.raises(webhook_client.DeliveryError):
        webhooks.deliver(delivery.pk)  # 503: the task retries this
    delivery.refresh_from_db()
    assert delivery.state == "pending" and delivery.attempts == 1 and delivery.last_status == 503
    webhooks.deliver(delivery.pk)

    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 2
    headers, body = hook.received[-1]
    assert headers["X-Fleetdeck-Signature"] == "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    event = json.loads(body)
    assert event["event"] == "incident.opened" and event["incident"]["deployment"] == "Model"
    assert event["incident"]["suspected_causes"][0]["id"] == "OOM-2"


def test_a_4xx_is_final_and_never_retried(oom_cluster, team, people, endpoint):
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=endpoint(404).url)
    [incident_id] = services.detect(oom_cluster.pk)
    delivery = WebhookDelivery.objects.get(incident_id=incident_id)
    webhooks.deliver(delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state == "failed" and "not retried" in delivery.last_error


def test_delivery_gives_up_after_the_last_attempt(oom_cluster, team, people, endpoint):
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=endpoint(*[500] * 10).url)
    [incident_id] = services.detect(oom_cluster.pk)
    delivery = WebhookDelivery.objects.get(incident_id=incident_id)
    for _ in range(webhooks.MAX_ATTEMPTS - 1):
        with pytest.raises(webhook_client.DeliveryError):
            webhooks.deliver(delivery.pk)
    webhooks.deliver(delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state == "failed" and delivery.attempts == webhooks.MAX_ATTEMPTS


def test_a_delivery_whose_message_was_lost_is_sent_again_once(oom_cluster, team, people, endpoint, settings):
    from datetime import timedelta

    settings.FLEETDECK_CHANGE_STALE_S = 60
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=endpoint(503, 200).url)
    [incident_id] = services.detect(oom_cluster.pk)
    delivery = WebhookDelivery.objects.get(incident_id=incident_id)
    with pytest.raises(webhook_client.DeliveryError):
        webhooks.deliver(delivery.pk)  # the retry's message is then lost with the broker
    attempted = WebhookDelivery.objects.get(pk=delivery.pk).sent_at

    # A retry may wait up to the backoff cap: not lost yet.
    assert webhooks.requeue_lost(now=attempted + timedelta(seconds=webhooks.RETRY_BACKOFF_MAX_S)) == []
    later = attempted + timedelta(seconds=webhooks.RETRY_BACKOFF_MAX_S + 61)
    assert webhooks.requeue_lost(now=later) == [delivery.pk]
    assert webhooks.requeue_lost(now=later) == []  # claimed: a second tick does not send it again
    webhooks.deliver(delivery.pk)
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered"
    assert webhooks.requeue_lost(now=later + timedelta(days=1)) == []


def test_webhook_urls_follow_the_network_policy(team, people):
    with pytest.raises(ValidationError):
        webhooks.save_webhook(Actor(user=people["admin"]), team=team, url="http://169.254.169.254/latest")
    with pytest.raises(ValidationError):
        webhooks.save_webhook(Actor(user=people["admin"]), team=team, url="http://u:p@127.0.0.1:9/x")


def test_team_admins_manage_webhooks_and_the_secret_never_comes_back(api_as, endpoint):
    url = endpoint().url
    created = api_as("admin").post(
        "/api/v1/webhooks/", {"team": "vision", "url": url, "secret": "s3cret"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["has_secret"] is True and "s3cret" not in created.content.decode()
    assert (
        api_as("operator").post("/api/v1/webhooks/", {"team": "vision", "url": url}, format="json").status_code == 403
    )
    assert api_as("operator").get("/api/v1/webhooks/").json()["results"] == []
    bad = api_as("admin").post("/api/v1/webhooks/", {"team": "vision", "url": "http://169.254.169.254/"}, format="json")
    assert bad.status_code == 400 and "never calls" in str(bad.json())


def test_no_secret_reaches_a_log_line(oom_cluster, team, people, endpoint, api_as, use_replay, caplog):
    """Every logger, at DEBUG (httpx and httpcore included), through a registration, a sync that
    fails on the token, and a signed delivery that is retried."""
    import httpx

    for name in (None, "httpx", "httpcore", "celery", "apps"):
        caplog.set_level(logging.DEBUG, logger=name)
    body = {"name": "speech-prod", "team": "vision", "dashboard_url": "http://ray.test:8265/", "token": "tok-s3cret-91"}
    assert api_as("admin").post("/api/v1/clusters/", body, format="json").status_code == 201
    use_replay.routes["/api/serve/applications/"] = httpx.Response(401, text="token tok-s3cret-91 is not valid")
    sync.sync_cluster(Cluster.objects.get(name="speech-prod").pk)
    assert any(r.headers.get("authorization") == "Bearer tok-s3cret-91" for r in use_replay.requests)

    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=endpoint(503, 200).url, secret="hook-s3cret-17")
    [incident_id] = services.detect(oom_cluster.pk)
    delivery = WebhookDelivery.objects.get(incident_id=incident_id)
    with pytest.raises(webhook_client.DeliveryError) as failed:
        webhooks.deliver(delivery.pk)
    webhooks.deliver(delivery.pk)

    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "HTTP Request: POST" in logged and "send_request_headers" in logged, (
        "the HTTP clients logged nothing to check"
    )
    # What a worker would log for a failed task, and what the pages show.
    shown = [
        str(failed.value),
        *ClusterEvent.objects.values_list("message", flat=True),
        WebhookDelivery.objects.get().last_error,
    ]
    assert "s3cret" not in logged + "\n".join(shown)
