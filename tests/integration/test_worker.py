"""The Celery path end to end: the configured broker (Redis in CI, the embedded SQLite broker
locally), a real worker, the periodic tick and the sync it enqueues."""

from __future__ import annotations

import time

import pytest
from celery.contrib.testing.worker import start_worker

from apps.clusters.models import Cluster
from apps.fleet.models import Application
from controlplane.celery import app as celery_app
from workers import tasks

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker():
    celery_app.control.purge()
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield


def wait_for(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def test_registering_enqueues_a_first_sync_that_the_worker_runs(api_as, ray_head, worker):
    response = api_as("admin").post(
        "/api/v1/clusters/", {"name": "local", "team": "vision", "dashboard_url": ray_head.dashboard_url}, format="json"
    )
    assert response.status_code == 201
    cluster_id = response.json()["id"]

    wait_for(lambda: not Cluster.objects.get(pk=cluster_id).sync_pending)

    assert set(Application.objects.filter(cluster_id=cluster_id).values_list("name", flat=True)) == {"demo", "echo2"}


def test_the_sync_action_answers_202_and_the_worker_completes_it(api_as, ray_head, worker, team):
    cluster = Cluster.objects.create(name="local", team=team, dashboard_url=ray_head.dashboard_url)

    response = api_as("operator").post(f"/api/v1/clusters/{cluster.pk}/sync/")

    assert response.status_code == 202 and response.json()["sync_pending"] is True
    wait_for(lambda: not Cluster.objects.get(pk=cluster.pk).sync_pending)
    cluster.refresh_from_db()
    assert cluster.reachability == "ok" and cluster.applications.count() == 2


def test_the_tick_enqueues_due_clusters_and_skips_them_until_due_again(ray_head, worker, team):
    cluster = Cluster.objects.create(name="local", team=team, dashboard_url=ray_head.dashboard_url)

    tasks.tick.delay()
    wait_for(lambda: Cluster.objects.get(pk=cluster.pk).last_sync_at is not None)
    first_sync = Cluster.objects.get(pk=cluster.pk).last_sync_at
    tasks.tick.delay()
    time.sleep(2)

    assert Cluster.objects.get(pk=cluster.pk).last_sync_at == first_sync
    assert cluster.applications.count() == 2
