"""Maintenance's part of the periodic tick."""

from __future__ import annotations

from collections.abc import Iterator

from apps.core import jobs
from apps.core.jobs import Job
from apps.maintenance import dispatch, recovery


def due_runs() -> Iterator[Job]:
    """Slots now due and runs whose message was lost are sent; runs no worker finished are failed."""
    for run_id in dispatch.claim_due() + recovery.requeue_lost():
        yield Job(jobs.RUN_MAINTENANCE, (run_id,))
    recovery.abandon_stale()
