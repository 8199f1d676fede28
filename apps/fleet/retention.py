"""Config revisions kept by a retention, so a cluster whose config changes at every sync cannot grow the database
without limit: revisions older than FLEETDECK_REVISION_RETENTION_DAYS go, except each application's newest
REVISIONS_ALWAYS_KEPT, which the history page and a rollback's diff read. Pruned by the tick in batches, so one
tick never holds a long delete."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from apps.core.retention import delete_batch
from apps.fleet.models import ConfigRevision

REVISIONS_ALWAYS_KEPT = 20


def prune_revisions() -> int:
    """Delete a batch of revisions past the retention; returns how many went."""
    cutoff = timezone.now() - timedelta(days=settings.FLEETDECK_REVISION_RETENTION_DAYS)
    # The id of each application's REVISIONS_ALWAYS_KEPT-th newest revision: anything older than it may go.
    keep_from = (
        ConfigRevision.objects.filter(application=OuterRef("application"))
        .order_by("-id")
        .values("id")[REVISIONS_ALWAYS_KEPT - 1 : REVISIONS_ALWAYS_KEPT]
    )
    return delete_batch(
        ConfigRevision.objects.filter(observed_at__lt=cutoff)
        .annotate(keep_from=Subquery(keep_from))
        .exclude(keep_from__isnull=True)
        .filter(id__lt=F("keep_from"))
    )
