"""Maintenance: schedule writes, guards, recycles (ordinary changes) and warmups."""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.changes import protocol
from apps.changes.models import ACTIVE_STATES, Change, ChangeState
from apps.clusters.models import Reachability
from apps.clusters.services import dashboard_for
from apps.fleet.models import Deployment
from apps.maintenance import schedule as timing
from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile
from integrations import serve_http
from integrations.ray.errors import RayError

GENERATION_VAR = "FLEETDECK_RECYCLE_GENERATION"
METHODS = {"GET", "POST", "PUT", "HEAD"}
MAX_REQUESTS, MAX_CONCURRENCY = 1000, 64
# Longest gap between heartbeats of a running run (shorter still when FLEETDECK_CHANGE_STALE_S is small).
HEARTBEAT_S = 5.0

log = logging.getLogger(__name__)

# --- schedules and profiles ----------------------------------------------------------------


def _window_fields(data: dict) -> tuple:
    return (
        data.get("window_days", []),
        data.get("window_start_hour", 0),
        data.get("window_end_hour", 24),
        data.get("timezone", "UTC"),
    )


def save_schedule(actor: Actor, deployment: Deployment, data: dict) -> RecycleSchedule:
    timing.validate_timing(data.get("every_hours"), data.get("cron", ""))
    timing.validate_window(*_window_fields(data))
    warmup = data.get("warmup")
    if warmup is not None and warmup.application_id != deployment.application_id:
        raise ValidationError("The warmup profile must belong to the deployment's application.")
    schedule = RecycleSchedule.objects.filter(deployment=deployment).first() or RecycleSchedule(
        deployment=deployment, created_by=actor.user
    )
    for key, value in data.items():
        setattr(schedule, key, value)
    schedule.next_run_at = _next(schedule, timezone.now()) if schedule.enabled else None
    if schedule.enabled and schedule.next_run_at is None:
        raise ValidationError(
            "This timing never falls inside the maintenance window: widen the window or change the timing."
        )
    with transaction.atomic():
        schedule.save()
        record(
            actor,
            "recycle_schedule.save",
            schedule,
            team=deployment.application.cluster.team,
            changes={k: str(v) for k, v in data.items()},
        )
    return schedule


def _next(item, after):
    return timing.next_slot(
        after=after,
        every_hours=item.every_hours,
        cron=getattr(item, "cron", ""),
        days=item.window_days,
        start_hour=item.window_start_hour,
        end_hour=item.window_end_hour,
        tz=item.timezone,
    )


def validate_profile(application, data: dict) -> None:
    problems = []
    root = (application.route_prefix or "/").rstrip("/")
    path = data.get("path", "").split("?", 1)[0]
    if not path.startswith("/") or not (not root or path == root or path.startswith(root + "/")):
        problems.append(f"The path must be under the application's route prefix {application.route_prefix or '/'!r}.")
    if data.get("method", "GET").upper() not in METHODS:
        problems.append(f"Method must be one of {', '.join(sorted(METHODS))}.")
    if not 1 <= data.get("requests", 20) <= MAX_REQUESTS:
        problems.append(f"Requests must be between 1 and {MAX_REQUESTS}.")
    if not 1 <= data.get("concurrency", 2) <= MAX_CONCURRENCY:
        problems.append(f"Concurrency must be between 1 and {MAX_CONCURRENCY}.")
    if not 0 < data.get("timeout_s", 10.0) <= 300:
        problems.append("The per-request timeout must be above 0 and at most 300 s.")
    if not isinstance(data.get("headers", {}), dict) or any(
        not isinstance(v, str) for v in data.get("headers", {}).values()
    ):
        problems.append("Headers must be an object of strings.")
    if data.get("every_hours") is not None and not 1 <= data["every_hours"] <= 720:
        problems.append("every_hours must be between 1 and 720.")
    if problems:
        raise ValidationError(problems)
    timing.validate_window(*_window_fields(data))


def save_profile(actor: Actor, application, data: dict, profile: WarmupProfile | None = None) -> WarmupProfile:
    validate_profile(application, data)
    profile = profile or WarmupProfile(application=application)
    for key, value in data.items():
        setattr(profile, key, value.upper() if key == "method" else value)
    profile.next_run_at = _next(profile, timezone.now()) if profile.every_hours and profile.enabled else None
    with transaction.atomic():
        profile.save()
        record(
            actor,
            "warmup_profile.save",
            profile,
            team=application.cluster.team,
            changes={k: str(v) for k, v in data.items()},
        )
    return profile


def delete_schedule(actor: Actor, schedule: RecycleSchedule) -> None:
    with transaction.atomic():
        # Recorded before the delete: the row's id and name are gone after it.
        record(
            actor,
            "recycle_schedule.delete",
            schedule,
            team=schedule.deployment.application.cluster.team,
            changes={"deployment": str(schedule.deployment)},
        )
        schedule.delete()


def delete_profile(actor: Actor, profile: WarmupProfile) -> None:
    with transaction.atomic():
        record(
            actor,
            "warmup_profile.delete",
            profile,
            team=profile.application.cluster.team,
            changes={"application": str(profile.application), "name": profile.name},
        )
        profile.delete()


# --- scheduling ----------------------------------------------------------------------------


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
            if not model.objects.filter(pk=item.pk, next_run_at=slot).update(next_run_at=_next(item, now)):
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
    """Serve replaces replicas when ray_actor_options (or the app's runtime_env) change."""
    if change.kind == Change.Kind.RESTORE:
        return True
    return "ray_actor_options" in (change.patch or {})


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
    from controlplane.celery import send

    send("maintenance.run", [run_id])


def requeue_lost(now=None) -> list[int]:
    """Queued runs no worker took up within FLEETDECK_CHANGE_STALE_S of being sent: the broker
    refused or lost the message (a Redis restarted without persistence keeps no queue). Each is
    claimed before it is sent again, so two ticks send it once; a late original finds it claimed
    by `execute` and does nothing."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.FLEETDECK_CHANGE_STALE_S)
    lost = MaintenanceRun.objects.filter(state=MaintenanceRun.State.QUEUED, enqueued_at__lt=cutoff)
    requeued = []
    for run in lost.order_by("pk"):
        if MaintenanceRun.objects.filter(pk=run.pk, state=MaintenanceRun.State.QUEUED, enqueued_at__lt=cutoff).update(
            enqueued_at=now
        ):
            _log(
                run,
                f"No worker took this run up within {settings.FLEETDECK_CHANGE_STALE_S} s; sent to the workers again.",
            )
            requeued.append(run.pk)
    return requeued


def abandon_stale(now=None) -> list[int]:
    """Fail running runs whose worker stopped: no heartbeat for FLEETDECK_CHANGE_STALE_S. A recycle
    is not run again (it would stop replicas a second time without anyone deciding to); the record
    says how far it got, and failing it frees the cluster for the next recycle. Each run is claimed
    with a conditional UPDATE, so two ticks fail it once."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.FLEETDECK_CHANGE_STALE_S)
    # A run claimed by a worker of a release before heartbeats has none: its start stands in.
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    stale = MaintenanceRun.objects.select_related("cluster", "deployment__application", "change").filter(
        silent, state=MaintenanceRun.State.RUNNING
    )
    abandoned = []
    for run in stale.order_by("pk"):
        if run.change is not None and run.change.state in ACTIVE_STATES:
            # The change's own reconciler finishes it; its outcome is what this run's record should say.
            continue
        try:
            message = _abandoned(run)
        except Exception as exc:  # one unreadable cluster must not stop the tick's other work
            log.exception("maintenance run %s: reading how far it got failed", run.pk)
            message = (
                f"The worker stopped during the run (no heartbeat for {settings.FLEETDECK_CHANGE_STALE_S} s); how far it "
                f"got could not be read ({exc}): check the deployment before recycling it again."
            )
        if _end(run, MaintenanceRun.State.FAILED, message, only_if=silent, error=message):
            abandoned.append(run.pk)
    return abandoned


def _abandoned(run: MaintenanceRun) -> str:
    lead = f"The worker stopped during the run (no heartbeat for {settings.FLEETDECK_CHANGE_STALE_S} s)"
    if run.kind == MaintenanceRun.Kind.WARMUP:
        return f"{lead}; its results were lost. A warmup changes nothing on the cluster: run it again if needed."
    if run.change is None:
        return f"{lead} before it started its change; no replica was recycled."
    change = f"change #{run.change.pk} {run.change.get_state_display().lower()}"
    before = run.replicas_before
    try:
        if run.deployment is None:
            raise LookupError("the deployment is no longer known")
        if run.cluster.reachability != Reachability.OK:
            raise LookupError(f"{run.cluster.name} is not reachable")
        now_running, _ = _replicas(run.cluster, run.deployment)
    except (LookupError, RayError) as exc:
        return (
            f"{lead}; {change}, and the running replicas could not be read ({getattr(exc, 'message', exc)}), so how many "
            f"of the {len(before)} replica(s) were recycled is unknown: check the deployment before recycling it again."
        )
    kept = sorted(set(before) & set(now_running))
    return f"{lead}; {len(before) - len(kept)} of {len(before)} replica(s) had been recycled ({change})" + (
        f"; still running from before: {', '.join(kept)}." if kept else "."
    )


# --- execution -----------------------------------------------------------------------------


def execute(run_id: int) -> None:
    """Run a queued run once: the claim is a conditional UPDATE, so a message sent twice (see
    `requeue_lost`) or delivered twice finds the run taken and returns."""
    run = (
        MaintenanceRun.objects.select_related(
            "cluster", "deployment__application", "schedule__warmup", "profile__application"
        )
        .filter(pk=run_id, state=MaintenanceRun.State.QUEUED)
        .first()
    )
    if run is None:
        return
    started = timezone.now()
    try:
        with transaction.atomic():
            claimed = MaintenanceRun.objects.filter(pk=run.pk, state=MaintenanceRun.State.QUEUED).update(
                state=MaintenanceRun.State.RUNNING, started_at=started, heartbeat_at=started
            )
    except IntegrityError:
        return _end(
            run,
            MaintenanceRun.State.SKIPPED,
            "Skipped: another recycle is running on this cluster.",
            skip_reason="recycle running",
        )
    if not claimed:
        return
    # `_end` saves the whole row: keep what the UPDATE wrote.
    run.state, run.started_at, run.heartbeat_at = MaintenanceRun.State.RUNNING, started, started
    try:
        with _keepalive(run):
            if run.kind == MaintenanceRun.Kind.RECYCLE:
                _recycle(run)
            else:
                _warmup(run)
    except Exception as exc:
        # Recorded as what it was, not left for the reaper to call a dead worker.
        _end(
            run, MaintenanceRun.State.FAILED, f"Failed: {getattr(exc, 'message', None) or exc!r}", error=str(exc)[:2000]
        )
        raise


def _longest_s(run: MaintenanceRun) -> float:
    """The longest a live run can take: past it, a run whose calls never return is stuck, and its
    heartbeat stops so the reaper can fail it."""
    if run.kind == MaintenanceRun.Kind.WARMUP:
        profile = run.profile
        if profile is None:
            return 60.0
        return math.ceil(profile.requests / max(profile.concurrency, 1)) * profile.timeout_s + 60
    # The inline change run (verification, then a rollback's), then the wait for a change run elsewhere.
    return 4 * settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S + 300


@contextmanager
def _keepalive(run: MaintenanceRun):
    """Touch the heartbeat from a thread while the run executes: the inline change run and a
    warmup's requests block for longer than FLEETDECK_CHANGE_STALE_S without logging or polling,
    and the reaper must not fail a run whose worker is alive. Only for as long as the run can
    take (`_longest_s`). Not inside a caller's transaction (tests, eager tasks): another connection
    could not see the row, or would wait on its lock until this one's transaction ends; log lines
    and polls touch it there."""
    if connection.in_atomic_block:
        yield
        return
    stop = threading.Event()
    interval = min(HEARTBEAT_S, settings.FLEETDECK_CHANGE_STALE_S / 4)
    give_up = time.monotonic() + _longest_s(run)

    def beat():
        try:
            while not stop.wait(interval) and time.monotonic() < give_up:
                try:
                    MaintenanceRun.objects.filter(pk=run.pk, state=MaintenanceRun.State.RUNNING).update(
                        heartbeat_at=timezone.now()
                    )
                except DatabaseError as exc:
                    log.warning("heartbeat of maintenance run %s not written: %s", run.pk, exc)
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"maintenance-run-{run.pk}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


OPEN = [MaintenanceRun.State.QUEUED, MaintenanceRun.State.RUNNING]


def _log(run: MaintenanceRun, message: str, *, final: bool = False) -> None:
    """Append to the log. Only an open run's, unless this is its last line: a worker that wakes
    after the reaper failed its run must not write over the reaper's record."""
    now = timezone.now()
    run.log = [*run.log, {"at": now.isoformat(), "message": message}]
    fields = {"log": run.log}
    if run.state == MaintenanceRun.State.RUNNING:
        run.heartbeat_at = fields["heartbeat_at"] = now
    rows = MaintenanceRun.objects.filter(pk=run.pk)
    (rows if final else rows.filter(state__in=OPEN)).update(**fields)


def _end(run: MaintenanceRun, state: str, message: str, *, only_if: Q | None = None, **fields) -> bool:
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
    _log(run, message, final=True)
    record(Actor.system(), f"{run.kind}.{state}", run, team=run.cluster.team, changes={"message": message[:1000]})
    return True


def _replicas(cluster, deployment) -> tuple[list[str], dict]:
    with dashboard_for(cluster) as ray:
        app = ray.serve_applications().applications.get(deployment.application.name)
    dep = app.deployments.get(deployment.name) if app else None
    if dep is None:
        raise LookupError(f"{deployment} is not on the cluster any more.")
    return sorted(r.replica_id for r in dep.replicas if r.state == "RUNNING"), dep.deployment_config


def recycle_guards(run: MaintenanceRun, running: list[str], effective: dict) -> list[str]:
    """Why a recycle must not run now; empty when it may."""
    blocked = []
    cluster = run.cluster
    active = Change.objects.filter(cluster=cluster, state__in=ACTIVE_STATES).first()
    if active:
        blocked.append(f"Change #{active.pk} is in progress on {cluster.name}.")
    from apps.incidents.services import open_for

    incident = open_for(run.deployment)
    if incident:
        blocked.append(f"Incident #{incident.pk} ({incident.title}) is open on this deployment.")
    surge = effective.get("max_surge_percent") or 0
    if len(running) < 2 and not surge:
        blocked.append(
            f"Only {len(running)} running replica(s) and no surge (max_surge_percent 0): the deployment would have "
            "no replica for about 2–3 s. Keep min_replicas at 2 or more, enable surge, or override."
        )
    if surge:
        per_replica = (effective.get("ray_actor_options") or {}).get(
            "memory"
        ) or settings.FLEETDECK_RECYCLE_REPLICA_MEMORY_MB * 2**20
        needed = math.ceil(len(running) * surge / 100) * per_replica
        try:
            with dashboard_for(cluster) as ray:
                available = sum(node.available_bytes for node in ray.node_memory())
        except RayError as exc:
            blocked.append(f"Cannot read the cluster's free memory for the surge: {exc.message}")
        else:
            if available < needed:
                blocked.append(
                    f"Surge starts new replicas before stopping old ones and needs about {needed / 2**30:.1f} GiB free; "
                    f"the cluster has {available / 2**30:.1f} GiB."
                )
    return blocked


def _recycle(run: MaintenanceRun) -> None:
    cluster, deployment = run.cluster, run.deployment
    if deployment is None or deployment.removed_at is not None:
        return _end(
            run,
            MaintenanceRun.State.FAILED,
            "The deployment no longer exists on the cluster.",
            error="deployment vanished",
        )
    if cluster.reachability != Reachability.OK:
        return _end(
            run,
            MaintenanceRun.State.SKIPPED,
            f"Skipped: {cluster.name} is not reachable ({cluster.last_error or cluster.reachability}).",
            skip_reason="cluster unreachable",
        )
    try:
        before, effective = _replicas(cluster, deployment)
    except (LookupError, RayError) as exc:
        return _end(run, MaintenanceRun.State.FAILED, f"Failed: {getattr(exc, 'message', exc)}", error=str(exc))
    run.replicas_before = before
    blocked = recycle_guards(run, before, effective)
    if blocked and not run.override_guards:
        return _end(run, MaintenanceRun.State.SKIPPED, "Skipped: " + " ".join(blocked), skip_reason=" ".join(blocked))
    if blocked:
        _log(run, f"Guards overridden ({run.override_reason}): " + " ".join(blocked))
    env = ((effective.get("ray_actor_options") or {}).get("runtime_env") or {}).get("env_vars") or {}
    generation = int(env.get(GENERATION_VAR, "0") or 0) + 1
    actor = Actor(user=run.requested_by, via="worker")
    try:
        change = protocol.plan_change(
            actor,
            cluster,
            targets=[{"application": deployment.application.name, "deployment": deployment.name}],
            options={"ray_actor_options": {"runtime_env": {"env_vars": {GENERATION_VAR: str(generation)}}}},
            reason=f"Rolling recycle of {deployment} (run #{run.pk}, generation {generation})",
        )
        # Recorded before it is applied: a worker dying right after must leave a run that names
        # the change, or the reaper would think no replica could have been touched.
        run.change = change
        run.save(update_fields=["change", "replicas_before"])
        protocol.request_apply(actor, change)
    except ValidationError as exc:
        return _end(
            run,
            MaintenanceRun.State.FAILED,
            "Failed to start the change: " + " ".join(exc.messages),
            error=" ".join(exc.messages),
        )
    _log(run, f"Change #{change.pk} bumps {GENERATION_VAR} to {generation}.")
    protocol.run(change.pk)  # a worker may have claimed it first; then this returns at once
    change = _wait_final(run, change)
    if change.state != ChangeState.SUCCEEDED:
        return _end(
            run,
            MaintenanceRun.State.FAILED,
            f"Change #{change.pk} {change.get_state_display().lower()}: {change.error}",
            error=change.error,
        )
    after, _ = _replicas(cluster, deployment)
    cold = (change.finished_at - change.pushed_at).total_seconds() if change.pushed_at and change.finished_at else None
    kept = sorted(set(before) & set(after))
    took = f" in {cold:.1f} s" if cold is not None else ""
    message = (
        f"Recycled: {len(before)} replica(s) replaced by {len(after)} new ones{took}."
        if not kept
        else (f"Recycle verified but replica(s) {', '.join(kept)} were not replaced.")
    )
    _end(
        run,
        MaintenanceRun.State.SUCCEEDED if not kept else MaintenanceRun.State.FAILED,
        message,
        replicas_after=after,
        cold_start_s=cold,
    )
    warmup = run.schedule.warmup if run.schedule else None
    if warmup is not None and warmup.enabled:
        # Run here, so created running: a queued one would look lost to `requeue_lost` and run twice.
        now = timezone.now()
        follow = MaintenanceRun.objects.create(
            kind=MaintenanceRun.Kind.WARMUP,
            trigger=MaintenanceRun.Trigger.AFTER_RECYCLE,
            cluster=cluster,
            profile=warmup,
            after=run,
            state=MaintenanceRun.State.RUNNING,
            started_at=now,
            heartbeat_at=now,
        )
        with _keepalive(follow):
            _warmup(follow)


def _wait_final(run: MaintenanceRun, change: Change) -> Change:
    deadline = time.monotonic() + settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S * 2 + 60
    while time.monotonic() < deadline:
        change.refresh_from_db()
        if change.is_final:
            return change
        run.heartbeat_at = timezone.now()
        MaintenanceRun.objects.filter(pk=run.pk, state=MaintenanceRun.State.RUNNING).update(
            heartbeat_at=run.heartbeat_at
        )
        time.sleep(0.5)
    return change


def _warmup(run: MaintenanceRun) -> None:
    profile = run.profile
    if profile is None:
        return _end(run, MaintenanceRun.State.FAILED, "The warmup profile was deleted.")
    base = run.cluster.serve_endpoint
    _log(run, f"Sending {profile.requests} {profile.method} {profile.path} to {base}, {profile.concurrency} at a time.")
    samples = serve_http.send(
        base,
        method=profile.method,
        path=profile.path,
        headers=profile.headers,
        body=profile.body,
        requests=profile.requests,
        concurrency=profile.concurrency,
        timeout_s=profile.timeout_s,
    )
    results = summarize(samples, profile.p95_threshold_ms)
    state = MaintenanceRun.State.SUCCEEDED if results["passed"] else MaintenanceRun.State.FAILED
    _end(run, state, results["verdict"], results=results)


def summarize(samples: list[serve_http.Sample], p95_threshold_ms: float | None) -> dict:
    latencies = [s.latency_ms for s in samples]
    steady = latencies[1:] or latencies
    errors = [s for s in samples if not s.ok]
    p95 = _percentile(steady, 95)
    problems = []
    if errors:
        problems.append(f"{len(errors)} of {len(samples)} responses were not 2xx")
    if p95_threshold_ms is not None and p95 > p95_threshold_ms:
        problems.append(f"p95 {p95:.0f} ms is above {p95_threshold_ms:.0f} ms")
    return {
        "samples": [
            {"i": s.index, "status": s.status, "ms": round(s.latency_ms, 2), "error": s.error} for s in samples
        ],
        "first_ms": round(latencies[0], 2) if latencies else None,
        "steady_p50_ms": round(statistics.median(steady), 2) if steady else None,
        "steady_p95_ms": round(p95, 2),
        "max_ms": round(max(latencies), 2) if latencies else None,
        "errors": len(errors),
        "passed": not problems,
        "verdict": "Passed: all responses 2xx" + (f", p95 {p95:.0f} ms" if latencies else "")
        if not problems
        else "Failed: " + "; ".join(problems) + ".",
    }


def _percentile(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]
