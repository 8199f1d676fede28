"""A webhook that fails once is retried by the Celery task through the configured broker."""

from __future__ import annotations

import time

import pytest
from celery.contrib.testing.worker import start_worker

from apps.accounts.audit import Actor
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents import services, webhooks
from apps.incidents.models import WebhookDelivery
from controlplane.celery import app as celery_app
from tests.unit.incidents.test_webhooks import Endpoint

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_delivery_is_retried_with_backoff_until_it_lands(team, people, use_replay):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_oom_t1_modelonly_after_recovery.json"
    use_replay.routes["/api/v0/actors"] = "state_actors_dead_oom_t1_modelonly_detail.json"
    cluster = Cluster.objects.create(
        name="gpu-prod", team=team, dashboard_url="http://ray.test:8265", ray_version="2.60.0"
    )
    sync.sync_cluster(cluster.pk)
    endpoint = Endpoint([502, 200])
    celery_app.control.purge()
    try:
        webhooks.save_webhook(Actor(user=people["admin"]), team=team, url=endpoint.url)
        with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            services.detect(cluster.pk)
            deadline = time.monotonic() + 30
            while not WebhookDelivery.objects.filter(state="delivered").exists():
                assert time.monotonic() < deadline, list(
                    WebhookDelivery.objects.values("state", "attempts", "last_error")
                )
                time.sleep(0.2)
    finally:
        endpoint.close()
    delivery = WebhookDelivery.objects.get()
    assert delivery.attempts == 2 and len(endpoint.received) == 2
