"""Deleting history in batches: the tick prunes each kind of history a batch at a time, so one tick
never holds a long delete (nor a long lock) however far behind the retention is."""

from __future__ import annotations

from django.db.models import QuerySet

BATCH = 1000


def delete_batch(doomed: QuerySet) -> int:
    """Delete up to BATCH rows of `doomed`, oldest id first; returns how many went."""
    ids = list(doomed.order_by("id").values_list("id", flat=True)[:BATCH])
    if not ids:
        return 0
    doomed.model.objects.filter(id__in=ids).delete()
    return len(ids)
