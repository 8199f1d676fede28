"""Change step logs kept by a retention: a fleet with scheduled recycles and rollouts makes changes
every day, each with its log. Steps of changes that ended more than FLEETDECK_CHANGE_LOG_RETENTION_DAYS
ago go, except those of each cluster's newest CHANGES_ALWAYS_KEPT changes; the change itself (its
state, error, configs and who applied it) stays, as the history of what was done."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from apps.changes.models import Change, ChangeStep
from apps.core.retention import delete_batch

CHANGES_ALWAYS_KEPT = 50


def prune_step_logs() -> int:
    cutoff = timezone.now() - timedelta(days=settings.FLEETDECK_CHANGE_LOG_RETENTION_DAYS)
    # The id of each cluster's CHANGES_ALWAYS_KEPT-th newest change: older ones may lose their logs.
    keep_from = (
        Change.objects.filter(cluster=OuterRef("cluster"))
        .order_by("-id")
        .values("id")[CHANGES_ALWAYS_KEPT - 1 : CHANGES_ALWAYS_KEPT]
    )
    old = (
        Change.objects.filter(finished_at__lt=cutoff)
        .annotate(keep_from=Subquery(keep_from))
        .exclude(keep_from__isnull=True)
        .filter(id__lt=F("keep_from"))
    )
    return delete_batch(ChangeStep.objects.filter(change__in=old.values("id")))
