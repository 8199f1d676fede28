"""Creating maintenance runs and sending them to the workers: due slots claimed exactly once,
runs asked for by hand, and the warmups a change that replaced replicas calls for."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.changes import serve_options
from apps.changes.models import Change, ChangeState
from apps.core import jobs
from apps.fleet.models import Deployment
from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile
from apps.maintenance.schedules import next_run

RECYCLE = Permission(Role.OPERATOR, "recycle deployments")
# Worded as the API has always refused it, with the schedule and profile writes.
WARM_UP = Permission(Role.OPERATOR, "manage maintenance")


def claim_due(now=None) -> list[int]:
    """Runs for every due schedule and profile, each slot exactly once: the schedule row is
    claimed with a conditional UPDATE and the run is unique per (schedule, slot)."""
    now = now or timezone.now()
    runs = []
    for item in RecycleSchedule.objects.filter(enabled=True, next_run_at__lte=now).select_related(
        "deployment__application__cluster"
    ):
        run = _claim(
            item,
            now,
            RecycleSchedule,
            kind=MaintenanceRun.Kind.RECYCLE,
            schedule=item,
            deployment=item.deployment,
            cluster=item.deployment.application.cluster,
        )
        runs += [run] if run else []
    for item in WarmupProfile.objects.filter(enabled=True, next_run_at__lte=now).select_related("application__cluster"):
        run = _claim(
            item, now, WarmupProfile, kind=MaintenanceRun.Kind.WARMUP, profile=item, cluster=item.application.cluster
        )
        runs += [run] if run else []
    return runs


def _claim(item, now, model, **run_fields) -> int | None:
    slot = item.next_run_at
    try:
        with transaction.atomic():
            if not model.objects.filter(pk=item.pk, next_run_at=slot).update(next_run_at=next_run(item, now)):
                return None
            run = MaintenanceRun.objects.create(trigger=MaintenanceRun.Trigger.SCHEDULE, slot=slot, **run_fields)
    except IntegrityError:
        return None
    return run.pk


def request_recycle(actor: Actor, deployment: Deployment, *, override_reason: str = "") -> MaintenanceRun:
    run = MaintenanceRun.objects.create(
        kind=MaintenanceRun.Kind.RECYCLE,
        trigger=MaintenanceRun.Trigger.MANUAL,
        cluster=deployment.application.cluster,
        deployment=deployment,
        schedule=getattr(deployment, "recycle_schedule", None),
        requested_by=actor.user,
        override_guards=bool(override_reason),
        override_reason=override_reason,
    )
    record(
        actor,
        "recycle.request",
        run,
        team=run.cluster.team,
        changes={"deployment": str(deployment), "override": override_reason or None},
    )
    transaction.on_commit(lambda: _enqueue(run.pk))
    return run


def request_warmup(actor: Actor, profile: WarmupProfile) -> MaintenanceRun:
    run = MaintenanceRun.objects.create(
        kind=MaintenanceRun.Kind.WARMUP,
        trigger=MaintenanceRun.Trigger.MANUAL,
        cluster=profile.application.cluster,
        profile=profile,
        requested_by=actor.user,
    )
    record(actor, "warmup.request", run, team=run.cluster.team, changes={"profile": str(profile)})
    transaction.on_commit(lambda: _enqueue(run.pk))
    return run


def replaces_replicas(change: Change) -> bool:
    """Whether the change started new replicas of an application it touched (Serve applies most
    options in place; apps.changes.serve_options says which)."""
    if change.kind == Change.Kind.RESTORE:
        return True
    return any(
        serve_options.replaces_replicas(change.base_config, change.new_config, application)
        for application in change.touched_applications
    )


def warm_after_change(sender, change: Change, **kwargs) -> None:
    """Queue the enabled warmups of every application whose replicas a succeeded change replaced.
    Recycles chain their own schedule's warmup instead."""
    if change.state != ChangeState.SUCCEEDED or not replaces_replicas(change) or change.maintenance_runs.exists():
        return
    profiles = WarmupProfile.objects.filter(
        enabled=True, application__cluster_id=change.cluster_id, application__name__in=change.touched_applications
    )
    for profile in profiles:
        run = MaintenanceRun.objects.create(
            kind=MaintenanceRun.Kind.WARMUP,
            trigger=MaintenanceRun.Trigger.AFTER_CHANGE,
            cluster_id=change.cluster_id,
            profile=profile,
            change=change,
        )
        transaction.on_commit(lambda run_id=run.pk: _enqueue(run_id))


def _enqueue(run_id: int) -> None:
    jobs.enqueue(jobs.RUN_MAINTENANCE, run_id)
