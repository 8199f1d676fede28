"""The push protocol: plan, guard, re-check, push, verify, roll back.

Every step persists the change's state *before* it acts, so a worker killed at any point leaves
a row that says what may have happened, and the reconciler can finish the job."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import cast

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.changes import lifecycle, planner
from apps.changes.app_validation import validate_application
from apps.changes.config_pins import pinned
from apps.changes.config_writers import ReadBackWriter, WriterUnavailable, owner_waiting_for, writer_for
from apps.changes.llm_validation import changed_llm_problems
from apps.changes.models import ACTIVE_STATES, Change, ChangeState, ChangeStep, Preset
from apps.changes.signals import change_finished
from apps.changes.validation import preset_or_options, validate_options
from apps.clusters.models import Cluster
from apps.clusters.services import dashboard_for
from apps.core import jobs
from apps.core.errors import Conflict
from apps.core.jobs import Job
from apps.core.redaction import redact_config, redact_quoted_input
from apps.fleet import client_impact
from apps.fleet.configs import config_hash, unified_diff
from integrations.errors import AdapterConflict, AdapterError
from integrations.ray.errors import RayError, RayValidationError
from integrations.ray.payloads import ServeStatus

log = logging.getLogger(__name__)


class ChangeRefused(ValidationError):
    """A change cannot be planned or applied; nothing was pushed."""


class ChangeBusy(Conflict):
    """The change is no longer planned, or another change holds its cluster; nothing was pushed."""


class ConfirmationMismatch(ChangeRefused):
    """A deletion's apply did not carry the application's name, typed as confirmation."""


# --- planning ------------------------------------------------------------------------------


def read_live(cluster: Cluster) -> ServeStatus:
    with dashboard_for(cluster) as ray:
        return ray.serve_applications()


def plan_change(
    actor: Actor,
    cluster: Cluster,
    *,
    targets: list[dict],
    reason: str,
    options: dict | None = None,
    preset: Preset | None = None,
) -> Change:
    if not (reason or "").strip():
        raise ChangeRefused("Say why: every change records its reason.")
    if not targets:
        raise ChangeRefused("Name at least one application/deployment to change.")
    options = preset_or_options(preset, options)
    validate_options(options)
    plan = _make_plan(
        cluster,
        lambda live: planner.plan_patch(live, targets, options, cluster.ray_version),
        "The targets already run with these options: there is nothing to change.",
    )
    return _save_plan(actor, cluster, plan, Change.Kind.PATCH, targets, reason, patch=options, preset=preset)


def plan_restore(
    actor: Actor, cluster: Cluster, *, app_configs: dict[str, dict], reason: str, restores: Change | None = None
) -> Change:
    if not (reason or "").strip():
        raise ChangeRefused("Say why: every change records its reason.")
    plan = _make_plan(
        cluster,
        lambda live: planner.plan_restore(live, app_configs),
        "The cluster already runs exactly that config: there is nothing to restore.",
    )
    return _save_plan(actor, cluster, plan, Change.Kind.RESTORE, sorted(app_configs), reason, restores=restores)


def plan_create_app(actor: Actor, cluster: Cluster, *, app: dict, reason: str) -> Change:
    """Plan adding a new application: its config is checked on its own (Fleetdeck's checks, then
    Serve's schema), then against the live applications (name and route prefix taken)."""
    if not (reason or "").strip():
        raise ChangeRefused("Say why: every change records its reason.")
    app = validate_application(app)
    plan = _make_plan(cluster, lambda live: lifecycle.plan_create(live, app), "The cluster already runs it.")
    return _save_plan(actor, cluster, plan, Change.Kind.CREATE_APP, [app["name"]], reason)


def plan_delete_app(actor: Actor, cluster: Cluster, *, application: str, reason: str) -> Change:
    """Plan removing one application; its apply takes the application's name as confirmation."""
    if not (reason or "").strip():
        raise ChangeRefused("Say why: every change records its reason.")
    plan = _make_plan(cluster, lambda live: lifecycle.plan_delete(live, application), "It is already gone.")
    return _save_plan(actor, cluster, plan, Change.Kind.DELETE_APP, [application], reason)


def plan_scaler(
    actor: Actor, cluster: Cluster, *, application: str, deployment: str, external: bool, options: dict, reason: str
) -> Change:
    """Plan handing a deployment's replica count to an outside scaler (`external`) or back to
    Serve's autoscaler: the application's external_scaler_enabled and the deployment's `options`."""
    plan = _make_plan(
        cluster,
        lambda live: planner.plan_scaler(live, application, deployment, external=external, options=options),
        "The deployment already runs that way: there is nothing to change.",
    )
    targets = [{"application": application, "deployment": deployment}]
    return _save_plan(actor, cluster, plan, Change.Kind.SCALER, targets, reason, patch=options)


def _make_plan(cluster: Cluster, build, nothing_to_do: str) -> planner.Plan:
    try:
        plan = build(read_live(cluster))
    except RayError as exc:
        raise ChangeRefused(f"Could not read the cluster's live config: {exc.message}") from exc
    except planner.PlanError as exc:
        raise ChangeRefused(str(exc)) from exc
    new, notes = pinned(cluster, plan.new_config)
    if notes:
        plan = planner.finish_plan(plan.base_config, new, [*plan.warnings, *notes], deleting=_deleted(plan))
    if not plan.changes_anything:
        raise ChangeRefused(nothing_to_do)
    if problems := changed_llm_problems(plan.base_config, plan.new_config):
        raise ChangeRefused(problems)
    return plan


def _deleted(plan: planner.Plan) -> frozenset[str]:
    before = {app["name"] for app in plan.base_config.get("applications", [])}
    return frozenset(before - {app["name"] for app in plan.new_config.get("applications", [])})


def roll_back_change(actor: Actor, change: Change) -> Change:
    """Restore the applications `change` touched to their config before it, as a new change
    through the same protocol, and queue it."""
    before = {app["name"]: app for app in change.base_config.get("applications", [])}
    configs = {name: before[name] for name in change.touched_applications if name in before}
    restore = plan_restore(
        actor,
        change.cluster,
        app_configs=configs,
        reason=f"Roll back change #{change.pk}: {change.reason}",
        restores=change,
    )
    return request_apply(actor, restore)


def _save_plan(actor, cluster, plan, kind, targets, reason, **extra) -> Change:
    with transaction.atomic():
        change = Change.objects.create(
            cluster=cluster,
            kind=kind,
            targets=targets,
            reason=reason.strip(),
            ray_version=cluster.ray_version,
            base_hash=plan.base_hash,
            base_config=plan.base_config,
            new_config=plan.new_config,
            new_hash=plan.new_hash,
            json_patch=plan.json_patch,
            warnings=plan.warnings,
            created_by=actor.user,
            **extra,
        )
        _step(
            change,
            f"Planned against live config {plan.base_hash[:12]}: {len(plan.json_patch)} JSON Patch operation(s).",
        )
        record(
            actor,
            "change.plan",
            change,
            team=cluster.team,
            changes={"reason": change.reason, "targets": targets, "kind": kind},
        )
    return change


# --- applying ------------------------------------------------------------------------------


def request_apply(actor: Actor, change: Change, *, confirm: str | None = None) -> Change:
    """Queue a planned change. The database allows one active change per cluster. Deleting an
    application takes its name typed as `confirm`: nothing brings a deleted application's replicas back."""
    typed = (confirm or "").strip()
    if change.kind == Change.Kind.DELETE_APP and typed != change.targets[0]:
        raise ConfirmationMismatch(
            f"Type the application's name, {change.targets[0]}, to confirm its deletion"
            + (f" ({typed!r} does not match)." if typed else ".")
        )
    try:
        with transaction.atomic():
            claimed = Change.objects.filter(pk=change.pk, state=ChangeState.PLANNED).update(
                state=ChangeState.QUEUED, applied_by=actor.user, heartbeat_at=timezone.now()
            )
            if not claimed:
                raise ChangeBusy(f"Change #{change.pk} is {change.get_state_display().lower()}, not planned.")
            change.refresh_from_db()
            _step(change, f"Apply requested by {actor.name}.")
            record(actor, "change.apply", change, team=change.cluster.team, changes={"reason": change.reason})
            transaction.on_commit(lambda: _enqueue(jobs.RUN_CHANGE, change.pk))
    except IntegrityError as exc:
        active = Change.objects.filter(cluster_id=change.cluster_id, state__in=ACTIVE_STATES).first()
        raise ChangeBusy(
            f"Change #{active.pk if active else '?'} is already in progress on {change.cluster.name}; "
            "changes to one cluster never interleave. Apply this one when it has finished."
        ) from exc
    return change


def cancel(actor: Actor, change: Change) -> Change:
    if not Change.objects.filter(pk=change.pk, state=ChangeState.PLANNED).update(
        state=ChangeState.CANCELLED, finished_at=timezone.now()
    ):
        raise ChangeBusy("Only a planned change can be cancelled.")
    change.refresh_from_db()
    _step(change, f"Cancelled by {actor.name}.")
    record(actor, "change.cancel", change, team=change.cluster.team)
    return change


def run(change_id: int) -> None:
    """The worker's side: claim a queued change and take it to a final state."""
    if not Change.objects.filter(pk=change_id, state=ChangeState.QUEUED).update(
        state=ChangeState.CHECKING, started_at=timezone.now(), heartbeat_at=timezone.now()
    ):
        return  # already taken (a duplicate delivery) or gone
    change = Change.objects.select_related("cluster").get(pk=change_id)
    # Read before the drift check, not between it and the push: the reading waits on the metrics
    # endpoint (within the outbound deadline), and a config changed by hand in that wait would be
    # overwritten. The heartbeat after it keeps the reconciler off a change whose worker is alive.
    change.client_impact = {"opening": client_impact.opening(change.cluster)}
    change.heartbeat_at = timezone.now()
    change.save(update_fields=["client_impact", "heartbeat_at"])
    _step(change, "Re-reading the live config to check for drift.")
    try:
        live = read_live(change.cluster)
        current = planner.live_config(live)
    except (RayError, planner.PlanError) as exc:
        return _finish(
            change,
            ChangeState.FAILED,
            f"Could not re-read the cluster before pushing: {_message(exc)} Nothing was pushed.",
        )
    if config_hash(current) != change.base_hash:
        # Shown to every reader: the placeholders' digests still tell a changed secret.
        change.drift = unified_diff(
            redact_config(change.base_config), redact_config(current), old_label="planned against", new_label="live now"
        )
        change.save(update_fields=["drift"])
        return _finish(
            change,
            ChangeState.DRIFTED,
            "The cluster's config changed outside this change since it was planned; nothing was pushed. Re-plan.",
        )
    deleting = set(change.targets) if change.kind == Change.Kind.DELETE_APP else set()
    dropped = planner.dropped_applications(current, change.new_config, named=deleting)
    if dropped:
        return _finish(change, ChangeState.FAILED, f"Refused: the push would delete {', '.join(dropped)}.")
    change.base_deploy_times = {
        name: live.applications[name].last_deployed_time_s
        for name in change.touched_applications
        if name in live.applications
    }
    change.save(update_fields=["base_deploy_times"])
    _push_and_verify(change)


def _push_and_verify(change: Change) -> None:
    try:
        writer = writer_for(change.cluster, planned_base=change.base_config)
    except WriterUnavailable as exc:
        return _finish(change, ChangeState.FAILED, str(exc))
    _transition(change, ChangeState.PUSHING, "Pushing the full config (every application) to the cluster.")
    try:
        writer.push(change.new_config)
    except RayValidationError as exc:
        said = redact_quoted_input(exc.message)
        return _finish(change, ChangeState.FAILED, f"Ray refused the config; nothing changed. Ray said:\n{said}")
    except RayError as exc:
        if exc.transient and _live_hash(change) == change.base_hash:
            return _finish(change, ChangeState.FAILED, f"The push did not reach Ray ({exc.message}); nothing changed.")
        _step(change, f"The push answered with an error ({exc.message}); verifying what the cluster runs.")
    # Only the RayService writer raises these (a cluster whose config a KubeRay RayService owns).
    except AdapterConflict as exc:
        # serveConfigV2 changed since the plan, or kept changing under the writer: nothing was written.
        return _finish(
            change, ChangeState.DRIFTED, f"{exc.message} The RayService changed outside this change: re-plan."
        )
    except AdapterError as exc:
        # As with a Ray timeout, a patch whose answer was lost may have landed: only a read-back
        # without the new config lets the change end as "nothing changed".
        if not getattr(exc, "transient", False) or not cast(ReadBackWriter, writer).may_hold(change.new_config):
            return _finish(change, ChangeState.FAILED, f"The RayService was not changed: {_message(exc)}")
        _step(change, f"The patch answered with an error ({_message(exc)}); verifying what the cluster runs.")
    change.pushed_at = timezone.now()
    change.save(update_fields=["pushed_at"])
    _verify_or_roll_back(change)


def _verify_or_roll_back(change: Change) -> None:
    _transition(change, ChangeState.VERIFYING, "Waiting for the touched applications to run the new config.")
    if change.kind == Change.Kind.DELETE_APP:
        verdict = _wait(change, _gone_check(change.touched_applications, change.new_config), [])
        done = f"Verified: {change.targets[0]} is gone and every other application runs as before."
    else:
        expected = planner.expected_deployments(change.new_config, change.targets, change.kind)
        times = change.base_deploy_times
        if change.kind == Change.Kind.CREATE_APP:
            # A new application with no deployment options listed is still waited for: it has no
            # deploy stamp before the push, so any stamp Ray reports is its own.
            times = {**{name: None for name in change.targets}, **times}
        check = _present_check(
            expected, times, planner.expected_applications(change.new_config, change.touched_applications)
        )
        if change.kind == Change.Kind.CREATE_APP:
            check = _and_unchanged(check, change.new_config, frozenset(change.targets))
        verdict = _wait(change, check, _owner_apps(expected, times))
        done = "Verified: applications RUNNING, effective configs hold the new values."
    if verdict.done:
        return _finish(change, ChangeState.SUCCEEDED, done)
    why = verdict.failure or f"Not verified within {settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S} s: " + "; ".join(
        verdict.waiting_for
    )
    roll_back(change, why)


def roll_back(change: Change, why: str) -> None:
    _transition(change, ChangeState.ROLLING_BACK, f"Rolling back to the base config: {why}")
    change.error = why
    change.save(update_fields=["error"])
    try:
        live = read_live(change.cluster)
        times = {
            name: live.applications[name].last_deployed_time_s
            for name in change.touched_applications
            if name in live.applications
        }
    except RayError:
        # The base config goes back even when the cluster cannot be read now; verification then
        # goes by statuses and effective configs alone, without Ray's deploy stamps.
        times = {}
    # The base config as the live config read it, with what the pins hold now: a scaler's count
    # set since the plan is not reset by the way back either.
    base, _ = pinned(change.cluster, change.base_config)
    try:
        writer_for(change.cluster).push(base)
    except (AdapterError, WriterUnavailable) as exc:
        return _finish(
            change, ChangeState.ROLLBACK_FAILED, f"{why}\nThe rollback push failed too: {_message(exc)}", error=True
        )
    if change.kind == Change.Kind.CREATE_APP:
        # Rolling back a new application is removing it, every other application left as it runs.
        verdict = _wait(change, _gone_check(change.touched_applications, base), [])
        done = f"Rolled back: {change.targets[0]} was removed; every other application runs as before."
    else:
        expected = planner.expected_deployments(base, change.touched_applications, Change.Kind.RESTORE)
        check = _present_check(expected, times, planner.expected_applications(base, change.touched_applications))
        verdict = _wait(change, check, _owner_apps(expected, times))
        done = "Rolled back: the base config runs again."
    if verdict.done:
        return _finish(change, ChangeState.ROLLED_BACK, done, error=True)
    _finish(
        change,
        ChangeState.ROLLBACK_FAILED,
        f"{why}\nThe rollback was not verified: {verdict.failure or '; '.join(verdict.waiting_for)}",
        error=True,
    )


Check = Callable[[ServeStatus], planner.Verdict]


def _present_check(expected: dict, base_deploy_times: dict, applications: dict | None = None) -> Check:
    return lambda serve: planner.verify(serve, expected, base_deploy_times, applications)


def _gone_check(gone: list[str], remaining: dict) -> Check:
    return lambda serve: lifecycle.verify_gone(serve, gone, remaining)


def _and_unchanged(check: Check, config: dict, touched: frozenset[str]) -> Check:
    def both(serve: ServeStatus) -> planner.Verdict:
        verdict = check(serve)
        others = lifecycle.others_unchanged(serve, config, besides=touched)
        if verdict.failure or not others:
            return verdict
        return planner.Verdict(done=False, waiting_for=[*verdict.waiting_for, *others])

    return both


def _owner_apps(expected: dict, base_deploy_times: dict) -> list[str]:
    return sorted({app for app, _ in expected} | set(base_deploy_times))


def _wait(change: Change, check: Check, owner_apps: list[str]) -> planner.Verdict:
    """Poll `check` until it is done or failed, or the deadline passes. `owner_apps` are the
    applications the config's owner must report healthy too (none for a deletion: KubeRay has
    then only to have reconciled the new generation)."""
    deadline = time.monotonic() + settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S
    verdict = planner.Verdict(done=False, waiting_for=["no answer yet"])
    while time.monotonic() < deadline:
        try:
            verdict = check(read_live(change.cluster))
        except RayError as exc:
            verdict = planner.Verdict(done=False, waiting_for=[f"cluster not answering: {exc.message}"])
        if verdict.done:
            # A RayService-owned cluster is verified once KubeRay agrees too: it has reconciled the
            # new generation and reports the applications healthy. Empty for any other cluster.
            waiting = owner_waiting_for(change.cluster, owner_apps)
            if waiting:
                verdict = planner.Verdict(done=False, waiting_for=waiting)
        Change.objects.filter(pk=change.pk).update(heartbeat_at=timezone.now())
        if verdict.done or verdict.failure:
            return verdict
        time.sleep(settings.FLEETDECK_CHANGE_POLL_S)
    return verdict


# --- crash recovery ------------------------------------------------------------------------


def due_reconciles() -> Iterator[Job]:
    for change_id in stale_changes():
        yield Job(jobs.RECONCILE_CHANGE, (change_id,))


def stale_changes(now=None) -> list[int]:
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.FLEETDECK_CHANGE_STALE_S)
    return list(Change.objects.filter(state__in=ACTIVE_STATES, heartbeat_at__lt=cutoff).values_list("pk", flat=True))


def reconcile(change_id: int) -> None:
    """Finish a change whose worker died, from what the cluster runs now."""
    cutoff = timezone.now() - timedelta(seconds=settings.FLEETDECK_CHANGE_STALE_S)
    change = Change.objects.select_related("cluster").filter(pk=change_id, state__in=ACTIVE_STATES).first()
    if change is None:
        return
    # Claim: only one reconciler acts, and only if the worker is really silent.
    if not Change.objects.filter(pk=change.pk, state=change.state, heartbeat_at__lt=cutoff).update(
        heartbeat_at=timezone.now()
    ):
        return
    prefix = f"Reconciler: the worker stopped during '{change.get_state_display().lower()}'"
    if change.state == ChangeState.QUEUED:
        _step(
            change,
            f"Reconciler: no worker took this change up within {settings.FLEETDECK_CHANGE_STALE_S} s; sent to the "
            "workers again.",
        )
        return _enqueue(jobs.RUN_CHANGE, change.pk)
    if change.state == ChangeState.CHECKING:
        Change.objects.filter(pk=change.pk).update(state=ChangeState.QUEUED)
        _step(change, f"{prefix} before anything was pushed; queued again.")
        return _enqueue(jobs.RUN_CHANGE, change.pk)
    if change.state == ChangeState.ROLLING_BACK:
        return roll_back(change, f"{prefix}; resuming the rollback. {change.error}")
    try:
        current = planner.live_config(read_live(change.cluster))
    except (RayError, planner.PlanError) as exc:
        # Nothing is pushed blind: the next reconcile (the heartbeat was just taken) reads again.
        _step(change, f"{prefix}; the cluster cannot be read ({_message(exc)}): trying again later.")
        return
    live = config_hash(current)
    if live == change.base_hash:
        return _finish(
            change, ChangeState.FAILED, f"{prefix}; the cluster still runs the base config, so nothing changed."
        )
    if live == change.new_hash:
        _step(change, f"{prefix}; the cluster runs the new config, resuming verification.")
        return _verify_or_roll_back(change)
    # Someone changed the cluster meanwhile, perhaps to fix it by hand: pushing the base config
    # back would undo that. A person decides, with the difference in front of them.
    change.drift = unified_diff(
        redact_config(change.new_config), redact_config(current), old_label="this change's config", new_label="live now"
    )
    change.save(update_fields=["drift"])
    _finish(
        change,
        ChangeState.DRIFTED,
        f"{prefix}; the cluster now runs neither the base nor this change's config: it was changed outside this "
        "change. Nothing was pushed back; compare the live config below and re-plan from it.",
        error=True,
    )


def _live_hash(change: Change) -> str:
    try:
        return config_hash(planner.live_config(read_live(change.cluster)))
    except (RayError, planner.PlanError):
        return ""


# --- bookkeeping ---------------------------------------------------------------------------


def _step(change: Change, message: str, **data) -> None:
    ChangeStep.objects.create(change=change, state=change.state, message=message, data=data)


def _transition(change: Change, state: str, message: str) -> None:
    change.state = state
    change.heartbeat_at = timezone.now()
    change.save(update_fields=["state", "heartbeat_at"])
    _step(change, message)


def _finish(change: Change, state: str, message: str, *, error: bool = False) -> None:
    _measure_clients(change, pushed=bool(change.pushed_at) or change.state == ChangeState.ROLLING_BACK)
    change.state = state
    change.finished_at = timezone.now()
    if state in (ChangeState.FAILED, ChangeState.DRIFTED, ChangeState.ROLLBACK_FAILED) or error:
        change.error = change.error or message
    change.save(update_fields=["state", "finished_at", "error"])
    _step(change, message)
    record(Actor.system(), f"change.{state}", change, team=change.cluster.team, changes={"message": message[:2000]})
    change_finished.send(sender=Change, change=change)


def _measure_clients(change: Change, *, pushed: bool) -> None:
    """What the proxy answered while the change ran, kept on the change before it ends, so a
    rollout judges a wave by its clients. Nothing pushed, nothing to measure. The verdict's time
    is kept first: the reading waits out Ray's export interval, which is not the change's."""
    change.verified_at = timezone.now()
    change.save(update_fields=["verified_at"])
    opened = (change.client_impact or {}).get("opening")
    if opened is None or not pushed:
        return
    _step(change, "Reading what clients saw at the proxy while the change ran.")
    change.client_impact = client_impact.closing(change.cluster, opened)
    change.save(update_fields=["client_impact"])
    _step(change, client_impact.sentence(change.client_impact))


def _message(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc)


def _enqueue(job: str, change_id: int) -> None:
    # A message the broker refused or lost leaves the change queued: the reconciler queues it again.
    jobs.enqueue(job, change_id)
