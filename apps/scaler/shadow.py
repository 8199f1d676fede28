"""The tick's scalers: for each one due, build its policy and signals, decide, and record the
decision. A shadow scaler stops there. An active one sends a new target through the scale API
(apps.scaler.control), and hands the deployment back to Serve's autoscaler when its signals or its
watch went stale. Deciding reads the database only (what the sync and its metrics reading stored),
so a tick with many scalers costs queries; only an active scaler's changed target calls a cluster."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.scaler import control
from apps.scaler import policy as policies
from apps.scaler.decision import Decision, Inputs, Kind, decide
from apps.scaler.models import Scaler, ScalerDecision
from apps.scaler.readings import signals_for

log = logging.getLogger(__name__)

# Scalers decided per tick: each costs a handful of queries; the rest wait for the next tick.
BATCH = 200
DECIDING = (Scaler.Mode.SHADOW, Scaler.Mode.ACTIVE)


def decide_shadows() -> None:
    """The tick's handler. A scaler is due once per sync interval, when a new metrics reading can
    have arrived; those that waited longest go first."""
    now = timezone.now()
    due_before = now - timedelta(seconds=settings.FLEETDECK_SYNC_INTERVAL_S)
    ids = list(
        Scaler.objects.filter(
            mode__in=DECIDING,
            deployment__removed_at__isnull=True,
            deployment__application__removed_at__isnull=True,
        )
        .filter(Q(evaluated_at__isnull=True) | Q(evaluated_at__lt=due_before))
        .order_by(F("evaluated_at").asc(nulls_first=True), "id")
        .values_list("id", flat=True)[:BATCH]
    )
    for scaler_id in ids:
        try:
            evaluate(scaler_id)
        except Exception:
            # One scaler's bad row must not stop the others; the next tick tries it again.
            log.exception("Shadow scaler %s failed to decide.", scaler_id)
            Scaler.objects.filter(pk=scaler_id).update(evaluated_at=timezone.now())


def evaluate(scaler_id: int, *, now: float | None = None) -> ScalerDecision | None:
    """Decide for one scaler and record it, and act on it if the scaler is active; None when the
    scaler is gone or neither shadow nor active, or when nothing changed since its last decision
    (no newer reading, the same outcome) and there is nothing to send."""
    scaler = (
        Scaler.objects.filter(pk=scaler_id, mode__in=DECIDING)
        .select_related("deployment__application__cluster")
        .first()
    )
    if scaler is None:
        return None
    acting = scaler.mode == Scaler.Mode.ACTIVE and not scaler.attention
    if acting and (lapsed := control.watch_lapsed(scaler)):
        control.hand_back(scaler, lapsed)
        return None
    now = time.time() if now is None else now
    built = policies.build(scaler)
    if built.policy is None:
        decision = not_decidable(scaler, built.why_not)
    else:
        decision = decide(signals_for(scaler, built.policy, now), built.policy)
    if acting and decision.kind == Kind.HAND_BACK:
        Scaler.objects.filter(pk=scaler.pk).update(evaluated_at=timezone.now())
        control.hand_back(scaler, decision.reason)
        return None
    sending = acting and decision.target != (scaler.target if scaler.target is not None else decision.current)
    with transaction.atomic():
        Scaler.objects.filter(pk=scaler.pk).update(evaluated_at=timezone.now())
        if _repeats(scaler, decision) and not sending:
            return None
        row = ScalerDecision.objects.create(
            scaler=scaler,
            at=timezone.now(),
            target=decision.target,
            current=decision.current,
            kind=decision.kind.value,
            reason=decision.reason,
            inputs={**decision.inputs.as_dict(), "ceiling_reason": built.ceiling_reason},
            signals_at=decision.inputs.signals_at,
            applied=False,
        )
    if sending:
        control.scale(scaler, row)
        row.refresh_from_db()
    return row


def not_decidable(scaler: Scaler, why: str) -> Decision:
    deployment = scaler.deployment
    current = deployment.target_replicas if deployment.target_replicas is not None else deployment.running_replicas
    inputs = Inputs(
        signals_at=None,
        signals_age_s=None,
        current=current,
        running=deployment.running_replicas,
        starting=deployment.waiting_replicas,
        min_replicas=scaler.min_replicas,
        max_replicas=scaler.max_replicas,
    )
    return Decision(current, current, Kind.HAND_BACK, why, inputs)


def _repeats(scaler: Scaler, decision: Decision) -> bool:
    """The same reading and the same outcome as the last record: a row would say nothing new (a
    stale window is handed back once, not every tick)."""
    last = scaler.decisions.order_by("-at", "-id").values("signals_at", "kind", "target", "current").first()
    return last is not None and last == {
        "signals_at": decision.inputs.signals_at,
        "kind": decision.kind.value,
        "target": decision.target,
        "current": decision.current,
    }
