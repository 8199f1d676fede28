"""A metrics reading is a job of its own: one queued or running per cluster, released whatever
happens, taken over when its worker died, and stopped by its time limit with a message."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from apps.core import jobs
from apps.incidents import ingest, metrics_jobs
from apps.incidents.models import ScrapeState
from tests.factories import ClusterFactory
from workers import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(team):
    return ClusterFactory(team=team, metrics_url="http://ray.test:8080/metrics")


@pytest.fixture
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr(jobs, "enqueue", lambda job, *args, **options: sent.append((job, *args)) or True)
    return sent


def test_one_reading_per_cluster_is_queued_until_it_has_run(cluster, sent, monkeypatch):
    monkeypatch.setattr(ingest, "collect_metrics", lambda cluster_id: [])

    assert metrics_jobs.request(cluster.pk) is True
    assert metrics_jobs.request(cluster.pk) is False  # the next syncs, while it waits or runs
    assert sent == [(jobs.COLLECT_METRICS, cluster.pk)]

    tasks.collect_metrics(cluster.pk)
    assert metrics_jobs.request(cluster.pk) is True and len(sent) == 2


def test_a_reading_that_raises_still_releases_its_claim(cluster, sent, monkeypatch):
    def broken(cluster_id):
        raise RuntimeError("boom")

    monkeypatch.setattr(ingest, "collect_metrics", broken)
    metrics_jobs.request(cluster.pk)
    with pytest.raises(RuntimeError):
        metrics_jobs.run(cluster.pk)
    assert ScrapeState.objects.get(cluster=cluster).claimed_at is None


def test_a_claim_older_than_the_hard_limit_is_taken_over(cluster, sent):
    metrics_jobs.request(cluster.pk)
    # The worker that held it was killed, or the broker lost the message.
    ScrapeState.objects.filter(cluster=cluster).update(
        claimed_at=timezone.now() - timedelta(seconds=metrics_jobs.hard_limit_s() + 1)
    )
    assert metrics_jobs.request(cluster.pk) is True and len(sent) == 2


def test_a_broker_that_refuses_the_job_leaves_no_claim(cluster, monkeypatch):
    monkeypatch.setattr(jobs, "enqueue", lambda job, *args, **options: False)
    assert metrics_jobs.request(cluster.pk) is False
    assert ScrapeState.objects.get(cluster=cluster).claimed_at is None


def test_the_time_limit_stops_the_reading_and_says_so(cluster, sent, monkeypatch, settings):
    settings.FLEETDECK_METRICS_TIME_LIMIT_S = 20

    def slow(cluster_id):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(ingest, "collect_metrics", slow)
    metrics_jobs.request(cluster.pk)
    tasks.collect_metrics(cluster.pk)

    state = ScrapeState.objects.get(cluster=cluster)
    assert state.claimed_at is None
    assert "longer than 20 s (FLEETDECK_METRICS_TIME_LIMIT_S)" in state.error


def test_the_task_carries_the_time_limits_and_its_own_queue(settings):
    task = tasks.collect_metrics
    assert (task.soft_time_limit, task.time_limit) == (metrics_jobs.soft_limit_s(), metrics_jobs.hard_limit_s())
    assert settings.CELERY_TASK_ROUTES[jobs.COLLECT_METRICS] == {"queue": "metrics"}
