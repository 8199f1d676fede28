"""A scaler in control: turned on and off as changes through the push protocol, acting on its
decisions through Ray 2.60's scale API, and handing the deployment back to Serve's autoscaler
when its decisions or their signals go stale.

Safe by construction. Taking control is one verified change: the application's
external_scaler_enabled on, the deployment's autoscaling_config out and a fixed num_replicas in,
the count running now within the scaler's bounds and the memory ceiling. From then on every
config the protocol pushes carries the scaler's last target (`pin_targets`), since a push resets
the count to the config's. When the worker was down or the metrics stopped, the watchdog plans
the change that hands back the sized autoscaling_config. If Fleetdeck is gone altogether, Serve
keeps the last count sent, which is never above what memory holds."""

from __future__ import annotations

import copy

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.changes import protocol
from apps.changes.models import ACTIVE_STATES, Change, ChangeState
from apps.changes.serve_options import autoscaling_defaults, parse_version
from apps.clusters.models import Cluster
from apps.clusters.services import dashboard_for
from apps.remediation.sizing import SCALE_OUT_AT
from apps.scaler import policy as policies
from apps.scaler.models import Scaler, ScalerDecision
from integrations.ray.dashboard import SCALE_API_SINCE
from integrations.ray.errors import RayError, RayExternalScalerDisabled

# Turning a scaler on or off changes the cluster's config: an operator's act, as any change is.
CONTROL = Permission(Role.OPERATOR, "turn scalers on and off")
# An active scaler whose last decision is older than this many sync intervals was not watched:
# the worker or the tick was down, and the count it left may no longer fit the load.
STALE_AFTER_INTERVALS = 4
# A scaler in these modes sets the count: every push carries its target.
CONTROLLING = (Scaler.Mode.ACTIVE, Scaler.Mode.HANDING_BACK)


class ScalerRefused(ValidationError):
    """The scaler cannot be turned on or off now; nothing was planned."""


# --- turning on and off ----------------------------------------------------------------------


def activate(actor: Actor, scaler: Scaler) -> Change:
    """Plan and queue the change that hands the deployment's replica count to the scaler; the
    scaler turns active when that change succeeds."""
    deployment = scaler.deployment
    cluster = deployment.application.cluster
    if scaler.mode not in (Scaler.Mode.SHADOW, Scaler.Mode.OFF):
        raise ScalerRefused(f"The scaler is {scaler.get_mode_display().lower()}: only a shadow or off one turns on.")
    if cluster.ray_version and parse_version(cluster.ray_version) < SCALE_API_SINCE:
        raise ScalerRefused(
            f"{cluster.name} runs Ray {cluster.ray_version}: a scaler in control needs Ray 2.60's scale API "
            "(and its external_scaler_enabled). Nothing was changed."
        )
    _refuse_if_changing(scaler)
    count = handover_count(scaler)
    effective = deployment.effective_config or {}
    recorded = _without_defaults(effective.get("autoscaling_config"))
    change = protocol.plan_scaler(
        actor,
        cluster,
        application=deployment.application.name,
        deployment=deployment.name,
        external=True,
        options={"num_replicas": count},
        reason=f"Scaler #{scaler.pk} takes control of {deployment.application.name}/{deployment.name}'s replica "
        f"count, starting at {count}.",
    )
    _hand_change(actor, scaler, change, Scaler.Purpose.ACTIVATE, (Scaler.Mode.SHADOW, Scaler.Mode.OFF), recorded)
    return change


def deactivate(actor: Actor, scaler: Scaler) -> Change:
    """Plan and queue the change that gives the count back to Serve's autoscaler with the sized
    autoscaling_config; the scaler turns off when it succeeds."""
    if scaler.mode != Scaler.Mode.ACTIVE:
        raise ScalerRefused(f"The scaler is {scaler.get_mode_display().lower()}, not active: nothing to turn off.")
    _refuse_if_changing(scaler)
    change = _plan_hand_back(actor, scaler, f"Scaler #{scaler.pk} turned off by {actor.name}")
    _hand_change(actor, scaler, change, Scaler.Purpose.DEACTIVATE, (Scaler.Mode.ACTIVE,), scaler.autoscaling_config)
    return change


def hand_back(scaler: Scaler, why: str) -> Change | None:
    """The watchdog: give an active scaler's deployment back to Serve's autoscaler, through the
    protocol, queued to the worker, and record why. At most one hand-back at a time: the mode
    moves to handing_back first, and only from active. None when none was made."""
    if not Scaler.objects.filter(pk=scaler.pk, mode=Scaler.Mode.ACTIVE, attention="").update(
        mode=Scaler.Mode.HANDING_BACK
    ):
        return None
    deployment = scaler.deployment
    current = scaler.target if scaler.target is not None else deployment.running_replicas
    row = ScalerDecision.objects.create(
        scaler=scaler,
        at=timezone.now(),
        target=current,
        current=current,
        kind=ScalerDecision.Kind.HAND_BACK,
        reason=f"Handed back to Serve's autoscaler: {why}",
        inputs={"watchdog": True},
    )
    actor = Actor.system()
    try:
        change = _plan_hand_back(actor, scaler, f"Watchdog of scaler #{scaler.pk}: {why}")
        try:
            protocol.request_apply(actor, change)
        except protocol.ChangeBusy:
            protocol.cancel(actor, change)
            raise
    except (ValidationError, protocol.ChangeBusy) as exc:
        # The count stays where it is (within memory); the next tick tries again.
        Scaler.objects.filter(pk=scaler.pk, mode=Scaler.Mode.HANDING_BACK).update(mode=Scaler.Mode.ACTIVE)
        row.error = _message(exc)
        row.save(update_fields=["error"])
        return None
    Scaler.objects.filter(pk=scaler.pk).update(change=change, change_purpose=Scaler.Purpose.HAND_BACK)
    row.applied = True
    row.save(update_fields=["applied"])
    return change


def on_change_finished(sender, change: Change, **kwargs) -> None:
    """A scaler's change ended: it takes control, lets go, or stays as it was."""
    ok = change.state == ChangeState.SUCCEEDED
    for scaler in Scaler.objects.filter(change=change):
        if scaler.change_purpose == Scaler.Purpose.ACTIVATE:
            if ok:
                Scaler.objects.filter(pk=scaler.pk).update(
                    mode=Scaler.Mode.ACTIVE,
                    target=(change.patch or {}).get("num_replicas"),
                    attention="",
                    # Its watch starts now, not at its last shadow decision.
                    evaluated_at=timezone.now(),
                )
        elif ok:
            Scaler.objects.filter(pk=scaler.pk).update(mode=Scaler.Mode.OFF, target=None, attention="")
        elif scaler.change_purpose == Scaler.Purpose.HAND_BACK:
            # Rolled back or drifted: the scaler's count still runs. A person decides now, rather
            # than the watchdog planning the same failing change every tick.
            Scaler.objects.filter(pk=scaler.pk).update(
                mode=Scaler.Mode.ACTIVE,
                attention=f"The hand-back change #{change.pk} {change.get_state_display().lower()}: "
                f"{change.error or 'see the change'}. The scaler does not act until it is turned off.",
            )


def _refuse_if_changing(scaler: Scaler) -> None:
    if scaler.change_id and Change.objects.filter(pk=scaler.change_id, state__in=ACTIVE_STATES).exists():
        raise ScalerRefused(f"Change #{scaler.change_id} of this scaler is still running: wait for it to finish.")


def _plan_hand_back(actor: Actor, scaler: Scaler, reason: str) -> Change:
    deployment = scaler.deployment
    return protocol.plan_scaler(
        actor,
        deployment.application.cluster,
        application=deployment.application.name,
        deployment=deployment.name,
        external=False,
        options={"autoscaling_config": sized_autoscaling(scaler)},
        reason=reason,
    )


def _hand_change(
    actor: Actor, scaler: Scaler, change: Change, purpose: str, modes: tuple, autoscaling: dict | None
) -> None:
    """Tie the planned change to the scaler (only from `modes`, and only while no other change of
    it runs), then queue it; a change that cannot be tied or queued is cancelled."""
    with transaction.atomic():
        tied = (
            Scaler.objects.filter(pk=scaler.pk, mode__in=modes)
            .exclude(change__state__in=ACTIVE_STATES)
            .update(change=change, change_purpose=purpose, autoscaling_config=autoscaling)
        )
        if tied:
            record(
                actor,
                f"scaler.{purpose}",
                scaler,
                team=scaler.deployment.application.cluster.team,
                changes={"change": change.pk},
            )
    if not tied:
        protocol.cancel(actor, change)
        raise ScalerRefused("The scaler changed meanwhile (another change of it was started): nothing was queued.")
    try:
        protocol.request_apply(actor, change)
    except protocol.ChangeBusy:
        protocol.cancel(actor, change)
        raise


# --- sizing the hand-over --------------------------------------------------------------------


def handover_count(scaler: Scaler) -> int:
    """The fixed num_replicas the scaler starts from: what runs now, within its bounds and never
    above what memory and schedulable resources hold."""
    deployment = scaler.deployment
    running = max(deployment.running_replicas, deployment.target_replicas or 0)
    count = min(max(running, scaler.min_replicas), scaler.max_replicas)
    built = policies.build(scaler)
    ceiling = built.policy.memory_ceiling if built.policy is not None else None
    if ceiling is not None:
        count = min(count, ceiling)
    return max(count, 1)


def sized_autoscaling(scaler: Scaler) -> dict:
    """What Serve's autoscaler gets back: sized from the calibration as the wizard sizes it (the
    scaler's bounds, never above the memory ceiling, scaling out at the wizard's share of the
    calibrated concurrency), else the autoscaling_config recorded at activation, else the bounds."""
    built = policies.build(scaler)
    policy = built.policy
    if policy is not None:
        most = scaler.max_replicas if policy.memory_ceiling is None else min(scaler.max_replicas, policy.memory_ceiling)
        return {
            "min_replicas": scaler.min_replicas,
            "max_replicas": max(most, scaler.min_replicas),
            "target_ongoing_requests": max(1, round(policy.concurrency * SCALE_OUT_AT)),
        }
    if scaler.autoscaling_config:
        return copy.deepcopy(scaler.autoscaling_config)
    return {"min_replicas": scaler.min_replicas, "max_replicas": scaler.max_replicas}


def _without_defaults(autoscaling) -> dict | None:
    """Re-sending Serve's defaults (such as `policy`) rebuilds the application's other deployments."""
    if not isinstance(autoscaling, dict):
        return None
    defaults = autoscaling_defaults()
    return {k: v for k, v in autoscaling.items() if defaults.get(k, object()) != v}


# --- every push keeps the target -------------------------------------------------------------


def pin_targets(cluster: Cluster, config: dict) -> tuple[dict, list[str]]:
    """The config_pins hook: each deployment a scaler controls keeps the scaler's count."""
    targets: dict[tuple[str, str], int] = {
        (app, dep): target
        for app, dep, target in Scaler.objects.filter(
            deployment__application__cluster=cluster, mode__in=CONTROLLING, target__isnull=False
        ).values_list("deployment__application__name", "deployment__name", "target")
        if target is not None
    }
    return pin(config, targets) if targets else (config, [])


def pin(config: dict, targets: dict[tuple[str, str], int]) -> tuple[dict, list[str]]:
    """`config` with each (application, deployment) in `targets` at its count, where the
    application is externally scaled and the deployment not given autoscaling by the config."""
    config = copy.deepcopy(config)
    notes = []
    for app in config.get("applications", []):
        if not app.get("external_scaler_enabled"):
            continue
        entries = app.setdefault("deployments", [])
        for (app_name, dep_name), target in sorted(targets.items()):
            if app_name != app["name"]:
                continue
            entry = next((e for e in entries if e.get("name") == dep_name), None)
            if entry is None:
                entry = {"name": dep_name}
                entries.append(entry)
            if isinstance(entry.get("autoscaling_config"), dict) or entry.get("num_replicas") == target:
                continue
            was = entry.get("num_replicas")
            entry["num_replicas"] = target
            notes.append(
                f"{app_name}/{dep_name}: num_replicas {target}, the count its scaler set (the config said {was}): "
                "a push resets the count to the config's."
            )
    return config, notes


# --- acting ----------------------------------------------------------------------------------


def watch_lapsed(scaler: Scaler) -> str:
    """Why the active scaler's watch lapsed (its last decision is too old), or ''."""
    if scaler.evaluated_at is None:
        return ""
    limit = STALE_AFTER_INTERVALS * settings.FLEETDECK_SYNC_INTERVAL_S
    age = (timezone.now() - scaler.evaluated_at).total_seconds()
    if age <= limit:
        return ""
    return (
        f"its last decision is {age:.0f} s old (more than {STALE_AFTER_INTERVALS} sync intervals, {limit} s): "
        "the worker was down, and the count it left may not fit the load now."
    )


def scale(scaler: Scaler, row: ScalerDecision) -> None:
    """Send the decision's target through the scale API and record the outcome on its row."""
    deployment = scaler.deployment
    cluster = deployment.application.cluster
    ceiling = (row.inputs or {}).get("memory_ceiling")
    # The decision caps at the ceiling; a target above it would trade queueing for OOM kills.
    assert ceiling is None or row.target <= ceiling, (row.target, ceiling)
    if Change.objects.filter(cluster=cluster, state__in=ACTIVE_STATES).exists():
        # Its config was planned with the current target; the next tick scales once it has finished.
        row.error = "A change is running on the cluster: the count is sent once it has finished."
        row.save(update_fields=["error"])
        return
    try:
        with dashboard_for(cluster) as ray:
            ray.scale_deployment(
                deployment.application.name, deployment.name, row.target, ray_version=cluster.ray_version
            )
    except RayExternalScalerDisabled as exc:
        # Someone pushed a config without the flag: sending again would be refused again.
        row.error = exc.message
        row.save(update_fields=["error"])
        Scaler.objects.filter(pk=scaler.pk).update(
            attention=f"Ray refused the count ({exc.message}). The scaler does not act until it is turned off "
            "and on again."
        )
        return
    except RayError as exc:
        row.error = exc.message
        row.save(update_fields=["error"])
        return
    row.applied = True
    row.save(update_fields=["applied"])
    Scaler.objects.filter(pk=scaler.pk).update(target=row.target)


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return " ".join(exc.messages)
    return getattr(exc, "message", None) or str(exc)
