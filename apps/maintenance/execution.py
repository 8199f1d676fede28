"""Running a claimed maintenance run on its worker: a rolling recycle as an ordinary change, or a
warmup, with a heartbeat for as long as the run can take."""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Reachability
from apps.clusters.services import dashboard_for
from apps.maintenance.guards import recycle_guards
from apps.maintenance.models import MaintenanceRun
from apps.maintenance.run_log import end_run, log_line
from apps.maintenance.warmup_results import summarize
from integrations import serve_http
from integrations.ray.errors import RayError

GENERATION_VAR = "FLEETDECK_RECYCLE_GENERATION"

# Longest gap between heartbeats of a running run (shorter still when FLEETDECK_CHANGE_STALE_S is small).
HEARTBEAT_S = 5.0


log = logging.getLogger(__name__)


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
        return end_run(
            run,
            MaintenanceRun.State.SKIPPED,
            "Skipped: another recycle is running on this cluster.",
            skip_reason="recycle running",
        )
    if not claimed:
        return
    # `end_run` saves the whole row: keep what the UPDATE wrote.
    run.state, run.started_at, run.heartbeat_at = MaintenanceRun.State.RUNNING, started, started
    try:
        with _keepalive(run):
            if run.kind == MaintenanceRun.Kind.RECYCLE:
                _recycle(run)
            else:
                _warmup(run)
    except Exception as exc:
        # Recorded as what it was, not left for the reaper to call a dead worker.
        end_run(
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


def running_replicas(cluster, deployment) -> tuple[list[str], dict]:
    with dashboard_for(cluster) as ray:
        app = ray.serve_applications().applications.get(deployment.application.name)
    dep = app.deployments.get(deployment.name) if app else None
    if dep is None:
        raise LookupError(f"{deployment} is not on the cluster any more.")
    return sorted(r.replica_id for r in dep.replicas if r.state == "RUNNING"), dep.deployment_config


def _recycle(run: MaintenanceRun) -> None:
    cluster, deployment = run.cluster, run.deployment
    if deployment is None or deployment.removed_at is not None:
        return end_run(
            run,
            MaintenanceRun.State.FAILED,
            "The deployment no longer exists on the cluster.",
            error="deployment vanished",
        )
    if cluster.reachability != Reachability.OK:
        return end_run(
            run,
            MaintenanceRun.State.SKIPPED,
            f"Skipped: {cluster.name} is not reachable ({cluster.last_error or cluster.reachability}).",
            skip_reason="cluster unreachable",
        )
    try:
        before, effective = running_replicas(cluster, deployment)
    except (LookupError, RayError) as exc:
        return end_run(run, MaintenanceRun.State.FAILED, f"Failed: {getattr(exc, 'message', exc)}", error=str(exc))
    run.replicas_before = before
    blocked = recycle_guards(run, before, effective)
    if blocked and not run.override_guards:
        return end_run(
            run, MaintenanceRun.State.SKIPPED, "Skipped: " + " ".join(blocked), skip_reason=" ".join(blocked)
        )
    if blocked:
        log_line(run, f"Guards overridden ({run.override_reason}): " + " ".join(blocked))
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
        return end_run(
            run,
            MaintenanceRun.State.FAILED,
            "Failed to start the change: " + " ".join(exc.messages),
            error=" ".join(exc.messages),
        )
    log_line(run, f"Change #{change.pk} bumps {GENERATION_VAR} to {generation}.")
    protocol.run(change.pk)  # a worker may have claimed it first; then this returns at once
    change = _wait_final(run, change)
    if change.clients_seen:
        log_line(run, change.clients_seen)
    if change.state != ChangeState.SUCCEEDED:
        return end_run(
            run,
            MaintenanceRun.State.FAILED,
            f"Change #{change.pk} {change.get_state_display().lower()}: {change.error}",
            error=change.error,
        )
    after, _ = running_replicas(cluster, deployment)
    cold = (change.verified_at - change.pushed_at).total_seconds() if change.pushed_at and change.verified_at else None
    kept = sorted(set(before) & set(after))
    took = f" in {cold:.1f} s" if cold is not None else ""
    message = (
        f"Recycled: {len(before)} replica(s) replaced by {len(after)} new ones{took}."
        if not kept
        else (f"Recycle verified but replica(s) {', '.join(kept)} were not replaced.")
    )
    end_run(
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
        return end_run(run, MaintenanceRun.State.FAILED, "The warmup profile was deleted.")
    base = run.cluster.serve_endpoint
    log_line(
        run, f"Sending {profile.requests} {profile.method} {profile.path} to {base}, {profile.concurrency} at a time."
    )
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
    end_run(run, state, results["verdict"], results=results)
