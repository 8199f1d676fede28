"""R11, "Let Fleetdeck scale it": offered where the incident's load varied more than one fixed
config serves, with this deployment's calibration and load as the reason. No queries: it reads the signal
window's readings and the wizard's sizing, and says what a shadow scaler's bounds would be.

Varied means the busiest reading needs at least VARIATION times the replicas the calm (the median
reading) needs at the calibrated concurrency, and more requests than the calm's replicas and the
queue bound hold. A fixed count sized for the calm then sheds the peak; one sized for the peak
leaves at least half its replicas idle in the calm. Below that, R2's sized autoscaling serves it."""

from __future__ import annotations

import itertools
import math

from apps.changes.serve_options import parse_version
from apps.remediation import scaler_replay
from apps.remediation.measurements import mib
from apps.remediation.models import WizardStep
from integrations.ray.dashboard import SCALE_API_SINCE

REMEDY = "R11"
# Twice the calm's replicas: a fixed count for the peak idles half of them or more the rest of the time.
VARIATION = 2
# Too few readings tell no calm from a peak.
MIN_READINGS = 3
# Serve's own defaults where the deployment's autoscaling_config sets none.
SERVE_UPSCALE_DELAY_S = 30.0
SERVE_LOOK_BACK_S = 30.0
# A replica's start where no recycle measured it: Ray's scheduling and a small model's load.
DEFAULT_START_S = 20.0


def assess(
    points: list[dict],
    plan: dict | None,
    queue_bound: int | None,
    effective: dict,
    ray_version: str,
    *,
    autoscaling: dict | None = None,
    reading_s: float = 30.0,
    start_s: float | None = None,
    latency_objective_ms: int | None = None,
) -> dict:
    """{} where the load was steady (or too few readings show it); otherwise the step's values:
    `refused` says why it cannot be taken, else `min_replicas`, `max_replicas`, `reasons` and, with
    R2's `autoscaling` config, `replay`: the readings' load replayed through the scaler (deciding
    every `reading_s`) and through Serve's autoscaler with that config, replicas starting in
    `start_s` (measured by a recycle; None: DEFAULT_START_S, said so)."""
    readings = [(p.get("ongoing") or 0) + (p.get("queued") or 0) for p in points]
    if len(readings) < MIN_READINGS:
        return {}
    calm, peak = sorted(readings)[len(readings) // 2], max(readings)
    concurrency = (plan or {}).get("concurrency")
    service_s = (plan or {}).get("service_s")
    # Unsized, the readings alone say whether the load varied (one request a replica); what a
    # replica and the queue hold is known only from a calibration.
    calm_need, peak_need = _need(calm, concurrency or 1), _need(peak, concurrency or 1)
    bound = max(queue_bound or 0, 0)
    if peak_need < VARIATION * calm_need or (concurrency and peak <= calm_need * concurrency + bound):
        return {}
    load = {"calm_in_flight": calm, "peak_in_flight": peak}
    if ray_version and parse_version(ray_version) < SCALE_API_SINCE:
        return load | {
            "refused": f"Needs Ray 2.60's scale API: this cluster runs Ray {ray_version}. Upgrade Ray to let "
            "Fleetdeck scale it; until then R2's autoscaling is what serves the variation."
        }
    if not concurrency or not service_s:
        return load | {
            "refused": "No calibration to size from: the replicas the calm and the peak need come from the "
            "calibrated concurrency and service time. Run the calibration step, then re-plan."
        }
    assert plan is not None  # a concurrency comes only from a plan
    ceiling = max(int(plan["replicas"]), 1)
    figures = load | {
        "calm_replicas": calm_need,
        "peak_replicas": peak_need,
        "min_replicas": min(calm_need, ceiling),
        "max_replicas": ceiling,
        "idle_replica_s": _idle_replica_seconds(points, min(peak_need, ceiling), concurrency),
    }
    reasons = _reasons(plan, figures, bound, effective)
    if autoscaling:
        replay = _replay(points, plan, figures, bound, autoscaling, reading_s, start_s, latency_objective_ms)
        if replay:
            figures["replay"] = replay
            reasons.insert(-1, _replay_reason(replay))
    return figures | {"reasons": reasons}


def _replay(points, plan, figures, bound, autoscaling, reading_s, start_s, objective_ms) -> dict | None:
    start = start_s if start_s is not None else DEFAULT_START_S
    replay = scaler_replay.compare(
        scaler_replay.rates(points),
        concurrency=plan["concurrency"],
        service_s=plan["service_s"],
        min_replicas=figures["min_replicas"],
        max_replicas=figures["max_replicas"],
        peak_bytes=plan.get("peak_bytes"),
        queue_bound=bound,
        latency_objective_ms=objective_ms,
        autoscaling=autoscaling,
        reading_s=reading_s,
        start_s=start,
    )
    return replay | {"start_measured": start_s is not None} if replay else None


def _replay_reason(replay: dict) -> str:
    scaler, serve = replay["scaler"], replay["serve"]

    def arm(o: dict) -> str:
        p99 = f"p99 {o['p99_s']:.1f} s" if o["p99_s"] is not None else "no request served"
        shed = f"{o['failed_share']:.1%} of {o['arrived']:,} requests shed"
        return f"{shed}, {p99}, {o['replica_seconds']:,} replica-seconds"

    start = (
        f"replicas starting in {replay['start_s']:.0f} s as the last recycle measured"
        if replay["start_measured"]
        else f"replicas starting in {replay['start_s']:.0f} s (assumed: no recycle has measured it)"
    )
    return (
        f"Replayed on these {replay['seconds']:,} s of readings ({start}; a model of queueing at the calibrated "
        f"concurrency and service time, not a measurement): the scaler, deciding every {replay['reading_s']:.0f} s, "
        f"{arm(scaler)}; Serve's autoscaler with R2's config {arm(serve)}. {_verdict(replay)}"
    )


def _verdict(replay: dict) -> str:
    scaler, serve = replay["scaler"], replay["serve"]
    p99 = (scaler["p99_s"] or 0.0, serve["p99_s"] or 0.0)
    if scaler["failed"] <= serve["failed"] and p99[0] <= p99[1]:
        if scaler["failed"] < serve["failed"] or p99[0] < p99[1]:
            return "On this load the scaler serves better."
        return "On this load both serve alike: the scaler's gain is the replicas it gives back in the calm."
    if scaler["failed"] >= serve["failed"] and p99[0] >= p99[1]:
        return (
            f"On this load R2's autoscaling serves better: the scaler decides once a metrics reading "
            f"(every {replay['reading_s']:.0f} s, FLEETDECK_SYNC_INTERVAL_S), later than R2's upscale delay. Prefer "
            "R2 here, or shorten the interval and start the scaler in shadow mode to compare on live traffic."
        )
    return "Each is better on one figure: weigh the requests shed against p99 and the replica-seconds."


def _need(in_flight: float, concurrency: int) -> int:
    return max(1, math.ceil(in_flight / concurrency))


def _reasons(plan: dict, figures: dict, bound: int, effective: dict) -> list[str]:
    concurrency, service_s = plan["concurrency"], plan["service_s"]
    calm, peak = figures["calm_in_flight"], figures["peak_in_flight"]
    calm_need, peak_need, ceiling = figures["calm_replicas"], figures["peak_replicas"], figures["max_replicas"]
    sized, idle = min(peak_need, ceiling), figures["idle_replica_s"]
    auto = effective.get("autoscaling_config")
    auto = auto if isinstance(auto, dict) else {}
    delay = _or(auto.get("upscale_delay_s"), SERVE_UPSCALE_DELAY_S)
    look_back = _or(auto.get("look_back_period_s"), SERVE_LOOK_BACK_S)
    holds = "Memory" if plan.get("binding") == "memory" else f"{plan.get('binding')} (binding before memory)"
    return [
        f"The calm (median reading) had {calm:g} request(s) in flight or queued: {calm_need} replica(s) at the "
        f"calibrated {concurrency} per replica, {service_s:.2f} s a request.",
        f"The busiest moment had {peak:g}: {peak_need} replica(s), {peak_need / calm_need:.1f}× the calm's. A fixed "
        f"count for the calm holds {calm_need * concurrency} in flight and {bound} queued, and sheds the rest.",
        f"{holds} holds {ceiling} replica(s) of {mib(plan['peak_bytes'])}: the scaler's max_replicas."
        + (f" The peak needs {peak_need}: past {ceiling} it queues or sheds." if peak_need > ceiling else ""),
        f"A fixed count sized for the peak ({sized}) keeps {sized - calm_need} replica(s) idle in the calm"
        + (f", {idle:,.0f} replica-seconds over the readings." if idle else "."),
        f"Serve's autoscaler adds replicas only after upscale_delay_s ({delay:g} s) on ongoing requests averaged "
        f"over look_back_period_s ({look_back:g} s): a burst shorter than that is served by the replicas already up. "
        "The scaler sizes from the in-flight readings and the calibration directly.",
        f"Created in shadow mode with min {figures['min_replicas']} and max {ceiling}: it only records what it "
        "would do; taking control stays your act on the scaler's card.",
    ]


def _or(value: float | None, default: float) -> float:
    """A null is Serve's default; a 0 is the deployment's choice."""
    return default if value is None else value


def _idle_replica_seconds(points: list[dict], fixed: int, concurrency: int) -> float:
    """Replica-seconds a fixed count of `fixed` would have held beyond what each reading needed,
    each reading standing until the next."""
    timed = [p for p in points if isinstance(p.get("t"), (int, float))]
    total = 0.0
    for here, after in itertools.pairwise(timed):
        need = _need((here.get("ongoing") or 0) + (here.get("queued") or 0), concurrency)
        total += max(fixed - need, 0) * (after["t"] - here["t"])
    return total


def fill(step: WizardStep, offer: dict) -> None:
    """The step as the latest diagnosis reads: offered, refused with its reason, or no longer
    called for because the load since was steady."""
    step.kind, step.patch, step.values = WizardStep.Kind.SCALER, None, offer
    if not offer:
        step.status, step.note = (
            WizardStep.Status.NOT_APPLICABLE,
            "The load in the readings is steady now: R2 serves it.",
        )
    elif offer.get("refused"):
        step.status, step.note = WizardStep.Status.NOT_APPLICABLE, offer["refused"]
    else:
        step.status, step.note = WizardStep.Status.PENDING, ""
