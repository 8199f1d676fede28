"""A maintenance run's record as its worker writes it: log lines, and the one write that ends it."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.maintenance.models import MaintenanceRun

OPEN = [MaintenanceRun.State.QUEUED, MaintenanceRun.State.RUNNING]


def log_line(run: MaintenanceRun, message: str, *, final: bool = False) -> None:
    """Append to the log. Only an open run's, unless this is its last line: a worker that wakes
    after the reaper failed its run must not write over the reaper's record."""
    now = timezone.now()
    run.log = [*run.log, {"at": now.isoformat(), "message": message}]
    fields = {"log": run.log}
    if run.state == MaintenanceRun.State.RUNNING:
        run.heartbeat_at = fields["heartbeat_at"] = now
    rows = MaintenanceRun.objects.filter(pk=run.pk)
    (rows if final else rows.filter(state__in=OPEN)).update(**fields)


def end_run(run: MaintenanceRun, state: str, message: str, *, only_if: Q | None = None, **fields) -> bool:
    """End an open run once, with what the worker learned (`fields`, and the replicas and change it
    recorded on the way). False, and nothing written, when someone else ended it first."""
    values = {
        "state": state,
        "finished_at": timezone.now(),
        "started_at": run.started_at,
        "change": run.change,
        "replicas_before": run.replicas_before,
        **fields,
    }
    rows = MaintenanceRun.objects.filter(pk=run.pk, state__in=OPEN)
    if not (rows.filter(only_if) if only_if is not None else rows).update(**values):
        return False
    for key, value in values.items():
        setattr(run, key, value)
    log_line(run, message, final=True)
    record(Actor.system(), f"{run.kind}.{state}", run, team=run.cluster.team, changes={"message": message[:1000]})
    return True
