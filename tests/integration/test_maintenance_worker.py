"""Scheduled recycles through the real broker: two concurrent ticks on a worker pool with two
threads produce exactly one run for a due slot, and its guard records a skipped run."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.maintenance import schedules
from apps.maintenance.models import MaintenanceRun, RecycleSchedule
from controlplane.celery import app as celery_app
from workers import tasks

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]


def test_two_ticks_at_once_run_a_due_slot_exactly_once_and_the_guard_skips_it(ray_head, team, people):
    cluster = Cluster.objects.create(
        name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0"
    )
    sync.sync_cluster(cluster.pk)
    # echo2/Echo has a fixed num_replicas of 1, so the single-replica guard applies.
    echo = Deployment.objects.get(application__cluster=cluster, application__name="echo2", name="Echo")
    schedule = schedules.save_schedule(Actor(user=people["operator"]), echo, {"every_hours": 6, "cron": ""})
    RecycleSchedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now() - timedelta(hours=13))
    Cluster.objects.filter(pk=cluster.pk).update(next_sync_at=timezone.now() + timedelta(hours=1))
    celery_app.control.purge()

    with start_worker(celery_app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30):
        tasks.tick.delay()
        tasks.tick.delay()
        deadline = time.monotonic() + 60
        while not MaintenanceRun.objects.filter(schedule=schedule, state=MaintenanceRun.State.SKIPPED).exists():
            assert time.monotonic() < deadline, list(MaintenanceRun.objects.values("state", "log"))
            time.sleep(0.2)
        time.sleep(1)

    runs = MaintenanceRun.objects.filter(schedule=schedule)
    assert runs.count() == 1
    run = runs.get()
    assert run.trigger == MaintenanceRun.Trigger.SCHEDULE
    assert "Only 1 running replica(s) and no surge" in run.skip_reason
    assert RecycleSchedule.objects.get(pk=schedule.pk).next_run_at > timezone.now()
