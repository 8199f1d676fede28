"""Step logs, audit rows and idle signal windows are kept by a retention and pruned in batches;
what a person still reads (each cluster's newest changes, the last year of audit) stays."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts import retention as audit_retention
from apps.accounts.models import AuditEvent
from apps.changes import retention as change_retention
from apps.changes.models import ChangeState, ChangeStep
from apps.core import retention
from apps.incidents import retention as window_retention
from apps.incidents.models import NodeWindow, SignalWindow
from tests.factories import ChangeFactory, ClusterFactory

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def changes_with_logs(cluster, count: int, ended_days_ago: int) -> list:
    made = []
    for n in range(count):
        change = ChangeFactory(cluster=cluster, state=ChangeState.SUCCEEDED, new_hash=f"{ended_days_ago}-{n}")
        type(change).objects.filter(pk=change.pk).update(finished_at=NOW - timedelta(days=ended_days_ago))
        ChangeStep.objects.bulk_create(
            ChangeStep(change=change, state=ChangeState.SUCCEEDED, message=f"step {i}") for i in range(3)
        )
        made.append(change)
    return made


def test_old_change_logs_go_but_each_clusters_newest_changes_keep_theirs(settings, team):
    settings.FLEETDECK_CHANGE_LOG_RETENTION_DAYS = 30
    busy, quiet = ClusterFactory(team=team), ClusterFactory(team=team)
    old = changes_with_logs(busy, 60, ended_days_ago=90)
    recent = changes_with_logs(busy, 5, ended_days_ago=1)
    lonely = changes_with_logs(quiet, 2, ended_days_ago=400)

    assert change_retention.prune_step_logs() == 3 * 15  # 65 changes, the newest 50 keep their logs
    kept = set(ChangeStep.objects.values_list("change_id", flat=True))
    assert kept == {c.pk for c in old[15:] + recent + lonely}
    assert type(old[0]).objects.filter(pk=old[0].pk).exists()  # the change itself stays
    assert change_retention.prune_step_logs() == 0


def test_audit_rows_past_the_retention_go_a_batch_per_tick(settings, monkeypatch):
    settings.FLEETDECK_AUDIT_RETENTION_DAYS = 365
    monkeypatch.setattr(retention, "BATCH", 10)
    AuditEvent.objects.bulk_create(AuditEvent(action="change.apply") for _ in range(25))
    AuditEvent.objects.update(created_at=NOW - timedelta(days=400))
    AuditEvent.objects.create(action="change.plan")

    assert [audit_retention.prune_audit() for _ in range(4)] == [10, 10, 5, 0]
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["change.plan"]


def test_windows_no_reading_touched_for_two_days_go(team):
    cluster = ClusterFactory(team=team)
    for name in ("gone", "live"):
        SignalWindow.objects.create(cluster=cluster, application_name="demo", deployment_name=name)
    NodeWindow.objects.create(cluster=cluster, node_ip="10.0.0.9")
    SignalWindow.objects.filter(deployment_name="gone").update(updated_at=NOW - timedelta(days=3))
    NodeWindow.objects.update(updated_at=NOW - timedelta(days=3))

    assert window_retention.prune_windows() == 2
    assert list(SignalWindow.objects.values_list("deployment_name", flat=True)) == ["live"]
    assert not NodeWindow.objects.exists()
