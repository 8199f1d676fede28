"""Signal windows of deployments and nodes that are gone: a window keeps a day of points
(metric_readings.compact), so one no reading has touched for longer holds nothing a detector or a
chart reads. Deleted by the tick in batches; a deployment that comes back starts a new window."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.core.retention import delete_batch
from apps.incidents.models import NodeWindow, SignalWindow

# A day of points, and a day's grace for a cluster that was unreachable for a while.
IDLE_WINDOW = timedelta(days=2)


def prune_windows() -> int:
    cutoff = timezone.now() - IDLE_WINDOW
    return sum(delete_batch(model.objects.filter(updated_at__lt=cutoff)) for model in (SignalWindow, NodeWindow))
