"""Computed values for the config remedies (R1, R2, R10), chosen together with the token caps
(R3, R4, in `token_caps.py`): from measured memory, the memory budget (`measurements.py`), the
resources the cluster can schedule (`schedulable.py`) and the measured service time, never from
constants. Pure functions; every value comes with the reason it has that value, and the same inputs
always give the same values.

The choice of concurrency and replicas is `plan_choice.py`'s. The queue bound is what those
replicas serve within the latency objective, from the measured service time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from apps.changes.serve_options import parse_version
from apps.remediation import token_caps
from apps.remediation.measurements import Budget, Load, Memory, mib
from apps.remediation.objectives import LATENCY_MARGIN, queue_for
from apps.remediation.plan_choice import Plan, choose
from apps.remediation.schedulable import Resources, amount_text

# A replica is added once its peers average this share of the concurrency they hold safely, so a
# new one is starting before the others are full.
SCALE_OUT_AT = 0.5


@dataclass(frozen=True)
class Current:
    """The deployment's settings now, from its effective config."""

    max_ongoing_requests: int | None
    max_queued_requests: int | None
    autoscaling: dict | None
    num_replicas: int | None
    ray_version: str
    user_config: dict | None = None

    @classmethod
    def of(cls, effective: dict, ray_version: str) -> Current:
        auto = effective.get("autoscaling_config")
        replicas = effective.get("num_replicas")
        user_config = effective.get("user_config")
        return cls(
            effective.get("max_ongoing_requests"),
            effective.get("max_queued_requests"),
            auto if isinstance(auto, dict) else None,
            replicas if isinstance(replicas, int) else None,
            ray_version,
            user_config if isinstance(user_config, dict) else None,
        )


class RemedyValues(TypedDict):
    """A remedy's computed values, kept on its wizard step as JSON."""

    patch: dict | None
    reasons: dict[str, str]  # option -> why it has its value
    warnings: list[str]
    # No values yet: they wait for a calibration or a budget.
    waiting: NotRequired[bool]
    why_waiting: NotRequired[str]
    # Nothing this remedy sets can help here (too old a Ray, not even the smallest request fits).
    not_applicable: NotRequired[bool]
    # R3 and R4: the values computed, also where no patch can set them and they are guidance.
    value: NotRequired[dict[str, int | None]]
    largest_fitting_tokens: NotRequired[int | None]
    # R1: what its concurrency was sized with.
    replica_peak_bytes: NotRequired[int]
    replicas_per_node: NotRequired[int]
    sized_at_concurrency: NotRequired[int]
    binding: NotRequired[str]


@dataclass
class Sizing:
    values: dict[str, RemedyValues] = field(default_factory=dict)  # by remedy
    # Nothing trustworthy to size from: the wizard's first step is a calibration.
    needs_calibration: bool = False
    why_not_sized: str = ""
    plan: dict | None = None

    @property
    def conservative(self) -> bool:
        return self.needs_calibration or bool(self.why_not_sized)

    def patch(self, remedy: str) -> dict | None:
        values = self.values.get(remedy)
        return values["patch"] if values is not None else None


def compute(
    current: Current,
    memory: Memory | None,
    budget: Budget | None,
    load: Load,
    *,
    latency_objective_ms: int,
    curve=None,
    resources: Resources | None = None,
    kept_bytes: int = 0,
) -> Sizing:
    """R1, R2 and R10 chosen together; R4 when `curve` is a token-sum calibration. Without a
    measured memory figure and a budget nothing is computed: the values would be guesses.
    `kept_bytes`: how much more than the sized baseline the running replicas hold at rest."""
    sizing = Sizing()
    if memory is None or memory.lower_bound:
        sizing.needs_calibration = True
        known = f" {memory.reason}" if memory is not None else ""
        sizing.why_not_sized = (
            "Memory per request is not measured, so no value is computed: run the calibration step first "
            f"(it measures this deployment's memory at rising concurrency without touching its traffic).{known}"
        )
    elif budget is None:
        sizing.why_not_sized = (
            "There is no memory budget to size against: no kill message and no node memory reading. "
            "Check that the cluster's dashboard answers, then re-plan."
        )
    if sizing.why_not_sized:
        for remedy, option in (
            ("R1", "max_ongoing_requests"),
            ("R2", "autoscaling_config"),
            ("R10", "max_queued_requests"),
        ):
            sizing.values[remedy] = {
                "patch": None,
                "waiting": True,
                "reasons": {option: sizing.why_not_sized},
                "warnings": [],
            }
        if curve is not None and curve.axis == "token_sum":
            sizing.values["R4"] = token_caps.batch_tokens(current.user_config, curve, budget, None, None)
        if token_caps.reads_input_caps(current.user_config):
            sizing.values["R3"] = token_caps.input_caps(
                current.user_config, memory, budget, None, curve, sizing.values.get("R4")
            )
        return sizing
    # why_not_sized is set whenever either is missing.
    assert memory is not None and budget is not None
    plan = choose(memory, budget, resources, latency_objective_ms)
    sizing.plan = plan.as_dict()
    sizing.values["R1"] = _concurrency(current, memory, budget, resources, plan)
    if warning := _kept_memory(plan, budget, kept_bytes):
        sizing.values["R1"]["warnings"].append(warning)
    sizing.values["R2"] = _autoscaling(current, plan, memory, budget, resources, load)
    sizing.values["R10"] = _queue_bound(current, plan, load, latency_objective_ms)
    if curve is not None and curve.axis == "token_sum":
        sizing.values["R4"] = token_caps.batch_tokens(
            current.user_config, curve, budget, plan.per_node, plan.concurrency
        )
    if token_caps.reads_input_caps(current.user_config):
        sizing.values["R3"] = token_caps.input_caps(
            current.user_config, memory, budget, plan, curve, sizing.values.get("R4")
        )
    return sizing


def _concurrency(
    current: Current, memory: Memory, budget: Budget, resources: Resources | None, plan: Plan
) -> RemedyValues:
    warnings: list[str] = []
    c = plan.concurrency
    if plan.replicas == 0:
        if plan.binding == "memory":
            warnings.append(
                f"One request needs about {mib(plan.peak_bytes)} on a replica but the budget per node is "
                f"{mib(budget.bytes_per_node)}: no concurrency prevents the kill. Cap input sizes (R3) or give the "
                f"deployment {mib(plan.peak_bytes - budget.bytes_per_node)} more memory per node."
            )
        elif plan.binding == "latency":
            warnings.append(
                f"One request takes {plan.service_s:.1f} s, longer than the latency objective: no setting meets it."
            )
        else:
            why = resources.reason if resources else ""
            warnings.append(f"The cluster has no {plan.binding} free for even one replica of this deployment. {why}")
    throughput = f"; its replicas then serve about {plan.throughput_rps:.2f} requests/s" if plan.throughput_rps else ""
    reason = (
        f"{c}: a replica holding {c} request(s) at once peaks at about {mib(plan.peak_bytes)}; {plan.per_node} such "
        f"replica(s) fit the budget of {mib(budget.bytes_per_node)} per node{throughput}. {_candidates_text(plan)} "
        f"{memory.reason} {budget.reason}"
    )
    patch: dict = {"max_ongoing_requests": c}
    reasons = {"max_ongoing_requests": reason}
    target = (current.autoscaling or {}).get("target_ongoing_requests")
    if isinstance(target, (int, float)) and target > c:
        # A cap below the autoscaling target would stop the deployment from ever scaling up.
        patch["autoscaling_config"] = {"target_ongoing_requests": _target(c)}
        reasons["target_ongoing_requests"] = (
            f"{_target(c)}, down from {target:g}: replicas never carry more than {c}, so a higher "
            "target would never be reached."
        )
    return {
        "patch": patch,
        "reasons": reasons,
        "warnings": warnings,
        "replica_peak_bytes": plan.peak_bytes,
        "replicas_per_node": plan.per_node,
        "sized_at_concurrency": c,
        "binding": plan.binding,
    }


def _candidates_text(plan: Plan) -> str:
    parts = []
    for cand in plan.candidates:
        rate = (
            f", {cand['throughput_rps']:.2f} req/s"
            if cand["throughput_rps"] is not None
            else f", {cand['slots']} slots"
        )
        slow = " (slower than the objective)" if cand["too_slow"] else ""
        parts.append(
            f"{cand['concurrency']} at once: {cand['replicas']} replica(s) of {mib(cand['peak_bytes'])}{rate}{slow}"
        )
    return "Weighed: " + "; ".join(parts) + "."


# Below this, what the replicas hold beyond the sized baseline is noise in Ray's sampled RSS.
KEPT_NOISE_BYTES = 64 * 2**20


def _kept_memory(plan: Plan, budget: Budget, kept_bytes: int) -> str | None:
    """R1, R2 and R10 set options Serve applies to the running replicas, which keep what their
    allocator held from the old concurrency's peaks; sized from the calibrated baseline, a replica
    that keeps it can cross the budget at the new concurrency until it restarts."""
    if kept_bytes < KEPT_NOISE_BYTES or plan.replicas == 0 or plan.per_node == 0:
        return None
    room = budget.bytes_per_node // plan.per_node
    if plan.peak_bytes + kept_bytes <= room:
        return None
    return (
        f"The running replicas hold up to {mib(kept_bytes)} more at rest than the {mib(plan.peak_bytes)} peak is "
        "sized from (memory their allocator kept from the old concurrency's peaks). These values are options Serve "
        "applies in place, so the replicas keep it: at the new concurrency one could peak at "
        f"{mib(plan.peak_bytes + kept_bytes)} against the {mib(room)} each has. Recycle the replicas once the change "
        "is applied (the deployment's rolling recycle in Maintenance), so they start from the sized baseline."
    )


def _target(concurrency: int) -> int:
    return max(1, round(concurrency * SCALE_OUT_AT))


def _autoscaling(
    current: Current, plan: Plan, memory: Memory, budget: Budget, resources: Resources | None, load: Load
) -> RemedyValues:
    """R2: as many replicas as memory and resources hold, at least 2 kept warm, scaled out before
    replicas are full, fast up and slow down."""
    warnings: list[str] = []
    reasons: dict[str, str] = {}
    auto = current.autoscaling or {}
    max_replicas = max(plan.replicas, 1)
    if plan.binding == "memory":
        reasons["max_replicas"] = (
            f"{max_replicas}: the memory budget holds {plan.per_node} replica(s) of {mib(plan.peak_bytes)} "
            f"per node on {budget.nodes} node(s); memory binds."
        )
    else:
        cpu_each = (resources.per_replica.get(plan.binding) if resources else None) or 0
        free = ((resources.free if resources else None) or {}).get(plan.binding, 0)
        reasons["max_replicas"] = (
            f"{max_replicas}: the cluster schedules {amount_text(free)} "
            f"{plan.binding} at {amount_text(cpu_each)} each; {plan.binding} binds (memory would hold "
            f"{plan.per_node * budget.nodes})."
        )
    if resources is not None and resources.free is None:
        warnings.append(resources.reason)
    needed = load.peak_in_flight
    slots = max_replicas * plan.concurrency
    if needed and needed > slots:
        more = math.ceil((needed - slots) / plan.concurrency)
        extra = f"{more} more replica(s): about {mib(more * plan.peak_bytes)} more memory"
        if resources is not None and resources.per_replica.get("CPU"):
            extra += f" and {amount_text(more * resources.per_replica['CPU'])} more CPU"
        warnings.append(
            f"The busiest moment had {needed:.0f} requests in flight or queued, but {max_replicas} replica(s) × "
            f"{plan.concurrency} hold {slots} at once within memory and resources. The rest waits in the bounded queue "
            f"(R10) or is shed with 503. Serving that peak takes {extra}."
        )
    min_replicas = min(2, max_replicas)
    reasons["min_replicas"] = (
        "2: a recycle, change or crash of one replica never leaves the deployment cold."
        if min_replicas == 2
        else "1: only one replica fits this cluster."
    )
    if min_replicas < 2:
        warnings.append("Only one replica fits: every restart is an outage (LAT-1). Give the deployment more memory.")
    target = _target(plan.concurrency)
    reasons["target_ongoing_requests"] = (
        f"{target}: add a replica once replicas average {target} of the {plan.concurrency} "
        "request(s) each holds safely, so it is starting before the others are full."
    )
    downscale = max(int(auto.get("downscale_delay_s") or 0), 300)
    reasons["upscale_delay_s"] = "5 s: add replicas while the burst is still on, not 30 s later (Serve's default)."
    reasons["downscale_delay_s"] = (
        f"{downscale} s: slow to remove replicas that bursts need again, each return a cold start."
    )
    patch = {
        "autoscaling_config": {
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target,
            "upscale_delay_s": 5,
            "downscale_delay_s": downscale,
        }
    }
    return {"patch": patch, "reasons": reasons, "warnings": warnings}


def _queue_bound(current: Current, plan: Plan, load: Load, objective_ms: int) -> RemedyValues:
    """R10: a queue no longer than what the replicas serve within the latency objective, from the
    measured service time; beyond that, failing fast beats answering late."""
    if parse_version(current.ray_version) < (2, 10):
        return {
            "patch": None,
            "reasons": {},
            "warnings": [
                f"max_queued_requests exists from Ray 2.10; this cluster runs "
                f"{current.ray_version}. Bound queues at the client or upgrade."
            ],
            "not_applicable": True,
        }
    replicas = max(plan.replicas, 1)
    slots = replicas * plan.concurrency
    warnings: list[str] = []
    service_s, source = plan.service_s, "measured by the calibration"
    if service_s is None and load.p50_ms:
        service_s, source = load.p50_ms / 1000, "the replicas' steady processing p50 (no service time was calibrated)"
    if service_s:
        # The queue is sized to finish within a margin of the objective: the last request in a full queue would
        # otherwise meet it exactly, and any slower service would break it.
        bound, wait_s, throughput = queue_for(slots, service_s, objective_ms)
        if wait_s <= 0:
            warnings.append(
                f"A request takes {service_s:.1f} s, as long as the {objective_ms / 1000:.0f} s objective: queueing "
                "at all breaks it."
            )
        reason = (
            f"{bound}: {slots} request slots ({replicas} replica(s) × {plan.concurrency}) at {service_s:.2f} s per "
            f"request ({source}) serve about {throughput:.1f} requests/s; a request queued behind {bound} others "
            f"still finishes within {int(LATENCY_MARGIN * 100)} % of the {objective_ms / 1000:.0f} s objective "
            "(service under load runs slower than calibrated)."
        )
        warnings += _shed_at_peak(plan, load, slots, bound, service_s, wait_s, objective_ms)
    else:
        bound = max(2 * slots, 4)
        reason = (
            f"{bound}: twice the {slots} request slots; no service time was measured to size it from the objective."
        )
    reason += " Serve applies it per caller (each proxy and handle), so the total queue is this bound per proxy."
    return {"patch": {"max_queued_requests": bound}, "reasons": {"max_queued_requests": reason}, "warnings": warnings}


def _shed_at_peak(
    plan: Plan, load: Load, slots: int, bound: int, service_s: float, wait_s: float, objective_ms: int
) -> list[str]:
    """The load the incident saw against what these replicas hold in flight and in the queue: past
    that, Serve sheds with 503, and no queue bound meets both the latency and the failure objective.
    Said with the replicas (and their memory) that would serve that load within the objective."""
    peak = load.peak_in_flight
    if not peak or peak <= slots + bound:
        return []
    # Each slot serves its request and the ones queued behind it within the objective.
    per_slot = 1 + max(wait_s, 0) / service_s
    needed = math.ceil(math.ceil(peak / per_slot) / plan.concurrency)
    extra = max(needed - plan.replicas, 1)
    return [
        f"At the incident's busiest moment {peak:.0f} requests were in flight or queued; {slots} slots and a queue of "
        f"{bound} hold {slots + bound}, so about {peak - slots - bound:.0f} at once would be shed with 503: at that "
        f"load a p99 within {objective_ms / 1000:.0f} s and no failed requests cannot both be had. Serving it within "
        f"the objective takes about {extra} more replica(s) of {mib(plan.peak_bytes)} ({mib(extra * plan.peak_bytes)} "
        "more memory than the budget, or another node), or a longer latency objective."
    ]
