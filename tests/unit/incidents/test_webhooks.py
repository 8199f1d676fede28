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
from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster, ClusterEvent
from apps.core import secrets
from apps.fleet import sync
from apps.incidents import services, webhooks
from apps.incidents.models import Webhook, WebhookDelivery
from integrations import webhook_client
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


class Endpoint:
    """A real HTTP endpoint on loopback that answers the statuses it is given, in order."""

    def __init__(self, statuses):
        self.statuses, self.received, self.paths = list(statuses), [], []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.received.append((dict(self.headers), body))
                endpoint.paths.append(self.path)
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


# Where a Slack-style webhook keeps its secret: in the path.
SECRET_PATH = "/services/T0001/B0002/path-s3cret-42"


def test_a_webhook_url_is_stored_encrypted_and_never_shown_past_its_host(api_as, endpoint):
    hook = endpoint()
    base = hook.url.removesuffix("/hooks/fleetdeck")
    admin = api_as("admin")

    created = admin.post("/api/v1/webhooks/", {"team": "vision", "url": base + SECRET_PATH}, format="json")
    assert created.status_code == 201, created.content
    webhook_id = created.json()["id"]
    changed = admin.patch(
        f"/api/v1/webhooks/{webhook_id}/", {"url": base + SECRET_PATH + "-2", "enabled": False}, format="json"
    )
    assert changed.status_code == 200, changed.content
    listed = admin.get("/api/v1/webhooks/")
    detail = admin.get(f"/api/v1/webhooks/{webhook_id}/")
    audit = admin.get("/api/v1/audit-events/", {"action": "webhook.save"})

    assert [r.status_code for r in (listed, detail, audit)] == [200, 200, 200]
    assert all("path-s3cret" not in r.content.decode() for r in (created, changed, listed, detail, audit))
    assert detail.json()["url"] == f"{base}/…" and listed.json()["results"][0]["url"] == f"{base}/…"
    events = audit.json()["results"]
    assert [event["changes"]["url"] for event in events] == [f"{base}/…", f"{base}/…"]
    assert all(event["object_repr"] == f"Vision → {base}/…" for event in events)
    stored = Webhook.objects.get()
    assert "path-s3cret" not in stored.url_ciphertext + stored.url_shown
    assert secrets.decrypt(stored.url_ciphertext) == base + SECRET_PATH + "-2"


def test_a_change_that_leaves_the_url_out_keeps_it(api_as, endpoint):
    hook = endpoint()
    admin = api_as("admin")
    webhook_id = admin.post("/api/v1/webhooks/", {"team": "vision", "url": hook.url}, format="json").json()["id"]

    assert admin.patch(f"/api/v1/webhooks/{webhook_id}/", {"enabled": False}, format="json").status_code == 200

    assert secrets.decrypt(Webhook.objects.get().url_ciphertext) == hook.url
    assert AuditEvent.objects.filter(action="webhook.save").latest("pk").changes["url"] == "unchanged"


def test_delivery_posts_to_the_full_url_and_its_errors_name_only_the_host(oom_cluster, team, people, endpoint):
    hook = endpoint(503, 200)
    url = hook.url.removesuffix("/hooks/fleetdeck") + SECRET_PATH
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=url)
    [incident_id] = services.detect(oom_cluster.pk)
    delivery = WebhookDelivery.objects.get(incident_id=incident_id)

    with pytest.raises(webhook_client.DeliveryError) as failed:
        webhooks.deliver(delivery.pk)
    webhooks.deliver(delivery.pk)

    assert hook.paths == [SECRET_PATH, SECRET_PATH]
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered"
    assert "path-s3cret" not in str(failed.value) and "answered HTTP 503" in str(failed.value)


def test_a_delivery_whose_url_no_key_opens_fails_at_once_saying_so(oom_cluster, team, people, endpoint, settings):
    settings.FLEETDECK_ENCRYPTION_KEYS = ["lost-key"]
    hook = endpoint()
    webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=hook.url)
    [incident_id] = services.detect(oom_cluster.pk)
    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key"]

    webhooks.deliver(WebhookDelivery.objects.get(incident_id=incident_id).pk)

    delivery = WebhookDelivery.objects.get(incident_id=incident_id)
    assert delivery.state == "failed" and "Put the old key back" in delivery.last_error
    assert hook.received == []


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_webhook_urls_already_stored():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("incidents", "0007_window_recent_and_summaries")], [("incidents", "0008_webhook_url_encrypted")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    team = old.get_model("accounts", "Team").objects.create(name="Vision", slug="vision")
    old.get_model("incidents", "Webhook").objects.create(team=team, url="https://hooks.slack.com" + SECRET_PATH)

    migrated = MigrationExecutor(connection)
    migrated.migrate(after)

    webhook = migrated.loader.project_state(after).apps.get_model("incidents", "Webhook").objects.get()
    assert webhook.url_shown == "https://hooks.slack.com/…" and "path-s3cret" not in webhook.url_ciphertext
    assert secrets.decrypt(webhook.url_ciphertext) == "https://hooks.slack.com" + SECRET_PATH
    # The later tests need the schema as it is now.
    latest = MigrationExecutor(connection)
    latest.migrate(latest.loader.graph.leaf_nodes("incidents"))
