"""Config revisions are kept by a retention, each application's newest always, pruned in batches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core import retention as core_retention
from apps.fleet import retention
from apps.fleet.models import Application, ConfigRevision
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def _revisions(app, count: int, age_days: int) -> None:
    for n in range(count):
        revision = ConfigRevision.objects.create(
            application=app, cluster=app.cluster, config_hash=f"{app.name}-{age_days}-{n}", config={"n": n}
        )
        ConfigRevision.objects.filter(pk=revision.pk).update(observed_at=timezone.now() - timedelta(days=age_days))


def test_old_revisions_go_but_each_application_keeps_its_newest(settings, team):
    settings.FLEETDECK_REVISION_RETENTION_DAYS = 30
    cluster = ClusterFactory(team=team)
    busy = Application.objects.create(cluster=cluster, name="busy", import_path="a:b")
    quiet = Application.objects.create(cluster=cluster, name="quiet", import_path="a:b")
    _revisions(busy, 50, age_days=60)  # 50 old revisions: 20 stay, the newest
    _revisions(busy, 5, age_days=1)  # recent ones always stay
    _revisions(quiet, 3, age_days=400)  # an application that never changes keeps what it has
    newest_old = list(ConfigRevision.objects.filter(application=busy).order_by("-id").values_list("id", flat=True))
    assert retention.prune_revisions() == 35
    left = set(ConfigRevision.objects.filter(application=busy).values_list("id", flat=True))
    assert left == set(newest_old[:20])
    assert ConfigRevision.objects.filter(application=quiet).count() == 3
    assert retention.prune_revisions() == 0


def test_a_large_backlog_is_pruned_a_batch_per_tick(settings, team, monkeypatch):
    settings.FLEETDECK_REVISION_RETENTION_DAYS = 30
    monkeypatch.setattr(core_retention, "BATCH", 10)
    app = Application.objects.create(cluster=ClusterFactory(team=team), name="busy", import_path="a:b")
    _revisions(app, 45, age_days=60)
    assert [retention.prune_revisions() for _ in range(4)] == [10, 10, 5, 0]
