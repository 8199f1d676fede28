"""Scaler decisions kept for FLEETDECK_SCALER_DECISION_DAYS: a shadow scaler records one per metrics
reading, ~2,900 a day per deployment, so the table is bounded by days, not by the fleet's age.
Pruned by the tick in batches, so one tick never holds a long delete."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from apps.scaler.models import ScalerDecision

BATCH = 1000


def prune_decisions() -> None:
    """The tick's handler: it yields no jobs (the tick iterates what a handler returns)."""
    prune()


def prune(batch: int = BATCH) -> int:
    """Delete up to `batch` decisions past the retention, oldest first; returns how many went."""
    cutoff = timezone.now() - timedelta(days=settings.FLEETDECK_SCALER_DECISION_DAYS)
    doomed = list(
        ScalerDecision.objects.filter(at__lt=cutoff).order_by("at", "id").values_list("id", flat=True)[:batch]
    )
    if not doomed:
        return 0
    ScalerDecision.objects.filter(id__in=doomed).delete()
    return len(doomed)
