"""Computed values for the config remedies (R1, R2, R10), the token-sum batch limit (R4) and the
input caps (R3) of a deployment that reads them from its user_config: from
measured memory, the memory budget, the resources the cluster can schedule and the measured
service time, never from constants. Pure functions; every value comes with the reason it has that
value, and the same inputs always give the same values.

Memory: `baseline` is a replica at rest (model, runtime), and a replica taking `c` requests at
once peaks at `peak(c)`: the calibration curve where one was measured, else baseline + c ×
per_request. The budget is what this deployment's replicas may use on one node, with a safety
margin below the point where Ray's memory monitor (or the kernel) kills. A figure that can only be
a lower bound (memory from a kill message divided by the requests admitted) is labelled as one and
never sizes anything: the wizard calibrates first.

The choice: among the concurrencies the calibration measured, the one whose replicas, as many as
memory and schedulable resources allow, serve the most requests per second (c / service time per
replica); ties go to the lower concurrency, whose peak is lower. The queue bound is what those
replicas serve within the latency objective, from the measured service time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from apps.changes.serve_options import parse_version
from apps.incidents.oom import ReplicaMemory

SAFETY_MARGIN = 0.8
# Ray's default memory_usage_threshold: the monitor kills above 95 % of node memory.
RAY_MEMORY_THRESHOLD = 0.95
MIB = 2**20
GIB = 2**30
MAX_QUEUE_BOUND = 10_000
# A batch limit may extrapolate the curve's last step this far past the largest calibrated sum;
# further out a straight line is a guess, and a calibration of larger sums is the answer.
MAX_EXTRAPOLATION = 4
# Serve's own default when a deployment sets no num_cpus.
SERVE_DEFAULT_CPUS = 1.0
# A replica is added once its peers average this share of the concurrency they hold safely, so a
# new one is starting before the others are full.
SCALE_OUT_AT = 0.5
# The queue is sized to finish within this share of the latency objective: the last request in a
# full queue would otherwise meet it exactly, and any slower service would break it.
LATENCY_MARGIN = 0.8
# Throughputs this close to the best are the same within what a calibration can tell apart.
EQUIVALENT = 0.95


@dataclass(frozen=True)
class Memory:
    baseline_bytes: int
    per_request_bytes: int
    source: str  # "calibration", "oom-kill"
    reason: str
    # Only a lower bound (requests admitted are not requests resident): shown, never sized from.
    lower_bound: bool = False
    curve: object | None = None  # a concurrency-axis calibration curve, when one was measured
    # What traffic showed a request holds at least: it can only raise a peak, so lower concurrency.
    per_request_floor_bytes: int = 0

    def peak(self, concurrency: int) -> int:
        """One replica's peak holding `concurrency` requests at once."""
        floor = self.baseline_bytes + concurrency * self.per_request_floor_bytes
        if self.curve is not None:
            # The curve's own baseline may be below a replica's (a Ray worker's runtime): lift it.
            lift = max(self.baseline_bytes - self.curve.baseline_bytes, 0)
            return max(self.curve.peak_at(concurrency) + lift, floor)
        return max(self.baseline_bytes + concurrency * self.per_request_bytes, floor)

    @property
    def measured_levels(self) -> list[int]:
        if self.curve is None:
            return []
        return sorted({int(x) for x, _ in self.curve.points if float(x).is_integer() and x >= 1})

    def service_s(self, concurrency: int) -> float | None:
        """Seconds one request takes at this concurrency, from the calibration; past the largest
        measured level a replica is taken to be saturated (no more throughput, only more memory)."""
        times = dict(getattr(self.curve, "service_s", None) or {}) if self.curve is not None else {}
        times = {float(x): float(t) for x, t in times.items() if t and t > 0}
        if not times:
            return None
        xs = sorted(times)
        if concurrency <= xs[0]:
            return times[xs[0]]
        for x0, x1 in zip(xs, xs[1:]):
            if concurrency <= x1:
                return times[x0] + (times[x1] - times[x0]) * (concurrency - x0) / (x1 - x0)
        return times[xs[-1]] * concurrency / xs[-1]


@dataclass(frozen=True)
class Budget:
    bytes_per_node: int  # margin already applied
    nodes: int
    reason: str


@dataclass(frozen=True)
class Resources:
    """What one replica asks Ray for, and what the cluster can still schedule for this
    deployment: the nodes' totals minus what every other deployment's replicas hold."""

    per_replica: dict[str, float]
    free: dict[str, float] | None  # None: the cluster's resources could not be read
    reason: str

    def replicas(self) -> tuple[int | None, str]:
        """How many replicas the resources schedule, and the resource that binds."""
        if self.free is None:
            return None, ""
        best: tuple[int, str] | None = None
        for name, need in sorted(self.per_replica.items()):
            if need <= 0:
                continue
            fits = int(math.floor(self.free.get(name, 0.0) / need + 1e-9))
            if best is None or fits < best[0]:
                best = (fits, name)
        if best is None:
            return None, ""
        return max(best[0], 0), best[1]


@dataclass(frozen=True)
class Load:
    peak_in_flight: float | None = None  # requests in flight plus queued, at the worst point
    p50_ms: float | None = None
    peak_rps: float | None = None
    cold_starts: bool = False


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


@dataclass
class Sizing:
    values: dict[str, dict] = field(default_factory=dict)  # remedy -> {"patch", "reasons", "warnings"}
    # Nothing trustworthy to size from: the wizard's first step is a calibration.
    needs_calibration: bool = False
    why_not_sized: str = ""
    plan: dict | None = None

    @property
    def conservative(self) -> bool:
        return self.needs_calibration or bool(self.why_not_sized)

    def patch(self, remedy: str) -> dict | None:
        return self.values.get(remedy, {}).get("patch")


# --- where memory figures come from --------------------------------------------------------


INPUT_CAPS = ("max_prompt_tokens", "max_tokens_cap")


def request_tokens(user_config: dict | None) -> tuple[int | None, str]:
    """The most tokens one request can bring to a batch: the deployment's own caps, when its
    user_config sets both (max_prompt_tokens + max_tokens_cap); else None, with the reason."""
    config = user_config or {}
    caps = {name: config.get(name) for name in INPUT_CAPS}
    missing = [name for name, value in caps.items() if not _is_cap(value)]
    if missing:
        return None, f"the user_config caps no {' and no '.join(missing)}"
    tokens = sum(caps.values())
    return tokens, (
        f"a request brings at most {tokens} tokens (user_config max_prompt_tokens {caps['max_prompt_tokens']} + "
        f"max_tokens_cap {caps['max_tokens_cap']})"
    )


def memory_from_curve(
    curve,
    tokens_per_request: int | None = None,
    tokens_reason: str = "",
    replica_floor_bytes: int | None = None,
    floor_reason: str = "",
) -> Memory | None:
    """A calibration curve (peak bytes against concurrency, or against batch token sum). On the
    token-sum axis a request costs `tokens_per_request` tokens (`tokens_reason` says why), or,
    unknown, as much as the largest calibrated batch. `replica_floor_bytes` is what a real replica
    of the deployment was seen using at rest (its Ray worker runtime included), which the job's own
    process may not show: the baseline is the larger of the two."""
    if curve is None:
        return None
    baseline = max(curve.baseline_bytes, replica_floor_bytes or 0)
    lifted = (
        f" A replica was seen at {_mib(replica_floor_bytes)} ({floor_reason}), more than the job measured at rest: the "
        "baseline is lifted to it."
        if replica_floor_bytes and replica_floor_bytes > curve.baseline_bytes
        else ""
    )
    if curve.axis == "concurrency":
        levels = ", ".join(f"{_mib(peak)} at {x:g}" for x, peak in curve.points)
        return Memory(
            baseline,
            max(curve.per_unit_bytes, 1),
            "calibration",
            f"Calibration #{curve.calibration_id} ({curve.device}, {curve.measured_at:%Y-%m-%d %H:%M}): "
            f"{_mib(curve.baseline_bytes)} at rest; peaks of {levels} request(s) at once "
            f"(+{_mib(curve.per_unit_bytes)} per request at the steepest step).{lifted}",
            curve=curve,
        )
    largest = int(max(x for x, _ in curve.points))
    tokens = tokens_per_request or largest
    if tokens_per_request:
        tokens_reason = tokens_reason or f"a request of {tokens} tokens"
    else:
        tokens_reason = (
            f"{tokens_reason or 'no request size is known'}, so a request is taken to be as large as the largest "
            f"calibrated batch, {largest} tokens (conservative)"
        )
    per_request = max(int(curve.per_unit_bytes * tokens), 1)
    return Memory(
        baseline,
        per_request,
        "calibration",
        f"Calibration #{curve.calibration_id} ({curve.device}, token sums up to {largest}): {_mib(curve.baseline_bytes)} at "
        f"rest, +{curve.per_unit_bytes / 1024:.0f} KiB per token (steepest step); {tokens_reason}: {_mib(per_request)} per "
        f"request.{lifted}",
    )


def replica_floor_from_kill(replicas: list[ReplicaMemory], app: str, dep: str) -> tuple[int | None, str]:
    """The least a replica of this deployment used in a kill message's list: a replica is at least
    that big at rest plus whatever it held, so a baseline taken from it is never understated."""
    mine = [r.used_bytes for r in replicas if (r.application, r.deployment) == (app, dep) and not r.killed]
    if not mine:
        return None, ""
    return min(mine), f"the least of its {len(mine)} peer(s) in Ray's kill message"


def memory_from_kill(
    replicas: list[ReplicaMemory], app: str, dep: str, in_flight: float | None, cap: int | None, observed=None
) -> Memory | None:
    """A LOWER BOUND from Ray's kill message: the killed replica's memory above its idle peers'
    (or, none listed, above the baseline traffic showed), spread over the most requests it may have
    held. Requests admitted near the kill are not requests resident (a handler that allocates on
    its event loop holds one at a time until the others reach their allocation), so dividing by
    them can understate per-request memory several times over: the figure is shown, never sized
    from. `observed` (`apps.remediation.observed.Observed`) may raise the bound: the larger of two
    lower bounds is still one."""
    mine = [r for r in replicas if (r.application, r.deployment) == (app, dep)]
    killed = [r.used_bytes for r in mine if r.killed]
    if not killed:
        return None
    peak = max(killed)
    idle = [r.used_bytes for r in mine if not r.killed]
    seen_at_rest = observed.baseline_bytes if observed is not None and observed.baseline_bytes else None
    baseline = min(idle) if idle else min(seen_at_rest or 0, peak)
    held = max(min(in_flight, cap or in_flight), 1) if in_flight else max(cap or 1, 1)
    per_request = max(int((peak - baseline) / held), 1)
    if idle:
        base_text = f"its idle peers used {_mib(baseline)}"
    elif seen_at_rest:
        base_text = f"no idle peer was listed; traffic showed {_mib(baseline)} per replica at rest"
    else:
        base_text = "no idle peer was listed, so its size at rest is unknown"
    if observed is not None and (observed.per_request_bytes or 0) > per_request:
        per_request = observed.per_request_bytes
        base_text += f"; traffic since showed at least {_mib(per_request)} per request"
    return Memory(
        baseline,
        per_request,
        "oom-kill",
        f"Lower bound only: the killed replica used {_mib(peak)}; {base_text}; spread over up to {held:.0f} requests "
        f"admitted it is at least {_mib(per_request)} per request. Requests admitted are not requests resident, so the "
        "real figure may be several times larger: a calibration measures it.",
        lower_bound=True,
    )


def memory_from_traffic(observed) -> Memory | None:
    """Without a calibration or a kill: what traffic showed, a lower bound shown, never sized from."""
    if observed is None or not observed.per_request_bytes:
        return None
    return Memory(
        observed.baseline_bytes or 0,
        observed.per_request_bytes,
        "metrics",
        f"Lower bound only. {observed.reason} A calibration measures the real figure.",
        lower_bound=True,
    )


def with_traffic_floor(memory: Memory, observed) -> Memory:
    """A calibrated figure that traffic has since outgrown (heavier requests than the representative
    one): peaks are priced at least at what traffic showed, which can only lower the values."""
    floor = (observed.per_request_bytes or 0) if observed is not None else 0
    if memory.lower_bound or floor <= memory.per_request_bytes:
        return memory
    return replace(
        memory,
        per_request_floor_bytes=floor,
        reason=(
            f"{memory.reason} Traffic since showed at least {_mib(floor)} per request, more than the calibration's "
            f"{_mib(memory.per_request_bytes)}: peaks are priced at the larger. Calibrate with a heavier representative request."
        ),
    )


def budget_from_kill(
    used_bytes: int | None, threshold_bytes: int | None, replicas: list[ReplicaMemory], app: str, dep: str, nodes: int
) -> Budget | None:
    """Room for this deployment on the node that killed it: the kill threshold minus what
    everything else on the node used at that moment."""
    if not used_bytes or not threshold_bytes:
        return None
    mine = sum(r.used_bytes for r in replicas if (r.application, r.deployment) == (app, dep))
    others = max(used_bytes - mine, 0)
    room = threshold_bytes - others
    if room <= 0:
        return None
    return Budget(
        int(room * SAFETY_MARGIN),
        max(nodes, 1),
        f"Ray kills above {_mib(threshold_bytes)} on the node; everything else used {_mib(others)}; "
        f"{int(SAFETY_MARGIN * 100)} % of the {_mib(room)} left is this deployment's budget per node.",
    )


def budget_from_nodes(node_points: list[dict]) -> Budget | None:
    """Without a kill: the headroom nodes have now below Ray's default kill threshold."""
    latest = [p for p in node_points if p.get("mem_total")]
    if not latest:
        return None
    rooms = [RAY_MEMORY_THRESHOLD * p["mem_total"] - p.get("mem_used", 0) for p in latest]
    room = min(rooms)
    if room <= 0:
        return None
    return Budget(
        int(room * SAFETY_MARGIN),
        len(latest),
        f"The tightest of {len(latest)} node(s) has {_mib(room)} below Ray's kill threshold now; "
        f"{int(SAFETY_MARGIN * 100)} % of it is the budget (replicas already running count against it).",
    )


def load_from_points(points: list[dict]) -> Load:
    in_flight = [(p.get("ongoing") or 0) + (p.get("queued") or 0) for p in points]
    steady = sorted(p["p50"] for p in points if p.get("p50") and not p.get("starts"))
    rps = [p["rps"] for p in points if p.get("rps")]
    return Load(
        peak_in_flight=max(in_flight) if any(in_flight) else None,
        p50_ms=steady[len(steady) // 2] if steady else None,
        peak_rps=max(rps) if rps else None,
        cold_starts=any(p.get("starts") for p in points),
    )


# --- the values ----------------------------------------------------------------------------


def resources_from(
    effective: dict, node_totals: list[dict[str, float]] | None, others: list[tuple[dict, int]]
) -> Resources:
    """Per-replica demand from the deployment's `ray_actor_options` (Serve's default of 1 CPU when
    it names none), against the alive nodes' totals minus `others`: (actor options, replicas) of
    every other deployment on the cluster."""
    per_replica = _demand(effective.get("ray_actor_options") or {})
    if node_totals is None:
        return Resources(
            per_replica, None, "The cluster's resources could not be read: replicas are not checked against them."
        )
    totals: dict[str, float] = {}
    for node in node_totals:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + float(amount)
    held: dict[str, float] = {}
    for options, replicas in others:
        for name, amount in _demand(options or {}).items():
            held[name] = held.get(name, 0.0) + amount * replicas
    free = {name: max(totals.get(name, 0.0) - held.get(name, 0.0), 0.0) for name in per_replica}
    wants = ", ".join(f"{_amount(v)} {k}" for k, v in sorted(per_replica.items()) if v > 0) or "no resources"
    has = ", ".join(
        f"{_amount(free[k])} of {_amount(totals.get(k, 0.0))} {k}" for k in sorted(per_replica) if per_replica[k] > 0
    )
    return Resources(
        per_replica,
        free,
        f"A replica asks for {wants}; the cluster has {has or 'nothing asked'} free for this "
        "deployment (its alive nodes' totals less what the other deployments' replicas hold).",
    )


def _demand(options: dict) -> dict[str, float]:
    cpus = options.get("num_cpus")
    demand = {"CPU": float(SERVE_DEFAULT_CPUS if cpus is None else cpus), "GPU": float(options.get("num_gpus") or 0)}
    if options.get("memory"):
        demand["memory"] = float(options["memory"])
    for name, amount in (options.get("resources") or {}).items():
        demand[str(name)] = float(amount)
    return {k: v for k, v in demand.items() if v > 0}


def _amount(value: float) -> str:
    return f"{value / GIB:.1f} GiB" if value >= MIB else f"{value:g}"


@dataclass(frozen=True)
class Plan:
    """The chosen concurrency and replica count, with every candidate weighed."""

    concurrency: int
    replicas: int
    per_node: int
    peak_bytes: int
    service_s: float | None
    throughput_rps: float | None
    binding: str
    candidates: list[dict]

    def as_dict(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "replicas": self.replicas,
            "per_node": self.per_node,
            "peak_bytes": self.peak_bytes,
            "service_s": self.service_s,
            "throughput_rps": self.throughput_rps,
            "binding": self.binding,
            "candidates": self.candidates,
        }


def compute(
    current: Current,
    memory: Memory | None,
    budget: Budget | None,
    load: Load,
    *,
    latency_objective_ms: int,
    curve=None,
    resources: Resources | None = None,
) -> Sizing:
    """R1, R2 and R10 chosen together; R4 when `curve` is a token-sum calibration. Without a
    measured memory figure and a budget nothing is computed: the values would be guesses."""
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
            sizing.values["R4"] = _batch_tokens(current, curve, budget, None, None)
        if reads_input_caps(current.user_config):
            sizing.values["R3"] = input_caps(current, memory, budget, None, curve, sizing.values.get("R4"))
        return sizing
    plan = choose(memory, budget, resources, latency_objective_ms)
    sizing.plan = plan.as_dict()
    sizing.values["R1"] = _concurrency(current, memory, budget, resources, plan)
    sizing.values["R2"] = _autoscaling(current, plan, memory, budget, resources, load)
    sizing.values["R10"] = _queue_bound(current, plan, load, latency_objective_ms)
    if curve is not None and curve.axis == "token_sum":
        sizing.values["R4"] = _batch_tokens(current, curve, budget, plan.per_node, plan.concurrency)
    if reads_input_caps(current.user_config):
        sizing.values["R3"] = input_caps(current, memory, budget, plan, curve, sizing.values.get("R4"))
    return sizing


def choose(memory: Memory, budget: Budget, resources: Resources | None, latency_objective_ms: int) -> Plan:
    """The concurrency whose replicas, as many as memory and resources hold, serve the most
    requests per second. Only measured concurrencies are candidates (past them the curve is a
    guess); a token-sum curve, which measures no concurrency, offers 1 and 2."""
    levels = memory.measured_levels or [1, 2]
    by_resources, resource = resources.replicas() if resources is not None else (None, "")
    candidates = []
    for c in levels:
        peak = memory.peak(c)
        per_node = budget.bytes_per_node // peak
        by_memory = per_node * budget.nodes
        replicas = by_memory if by_resources is None else min(by_memory, by_resources)
        service = memory.service_s(c)
        too_slow = service is not None and service * 1000 > latency_objective_ms
        throughput = (replicas * c / service) if service else None
        candidates.append(
            {
                "concurrency": c,
                "peak_bytes": peak,
                "per_node": per_node,
                "replicas_by_memory": by_memory,
                "replicas_by_resources": by_resources,
                "replicas": replicas,
                "service_s": service,
                "throughput_rps": round(throughput, 3) if throughput is not None else None,
                "slots": replicas * c,
                "too_slow": too_slow,
            }
        )
    usable = [c for c in candidates if c["replicas"] > 0 and not c["too_slow"]]
    if not usable:
        # Nothing is safe: the least harmful is one replica taking one request, with the whole
        # node's budget to itself, and a warning saying what it would take.
        first = candidates[0]
        return Plan(
            1,
            0,
            max(first["per_node"], 1),
            first["peak_bytes"],
            first["service_s"],
            0.0,
            "memory" if first["replicas_by_memory"] == 0 else (resource or "latency"),
            candidates,
        )

    # Requests per second where service times were measured, request slots otherwise. Service
    # times are noisy, so candidates within EQUIVALENT of the best count as tied, and the tie goes
    # to more replicas (one lost replica costs less), then to the lower concurrency (a lower peak).
    def rate(c: dict) -> float:
        return c["throughput_rps"] if c["throughput_rps"] is not None else c["slots"]

    top = max(rate(c) for c in usable)
    tied = [c for c in usable if rate(c) >= EQUIVALENT * top]
    best = max(tied, key=lambda c: (c["replicas"], -c["concurrency"]))
    binding = "memory" if by_resources is None or best["replicas_by_memory"] <= by_resources else resource
    return Plan(
        best["concurrency"],
        best["replicas"],
        best["per_node"],
        best["peak_bytes"],
        best["service_s"],
        best["throughput_rps"],
        binding,
        candidates,
    )


def _concurrency(current: Current, memory: Memory, budget: Budget, resources: Resources | None, plan: Plan) -> dict:
    warnings: list[str] = []
    c = plan.concurrency
    if plan.replicas == 0:
        if plan.binding == "memory":
            warnings.append(
                f"One request needs about {_mib(plan.peak_bytes)} on a replica but the budget per node is "
                f"{_mib(budget.bytes_per_node)}: no concurrency prevents the kill. Cap input sizes (R3) or give the "
                f"deployment {_mib(plan.peak_bytes - budget.bytes_per_node)} more memory per node."
            )
        elif plan.binding == "latency":
            warnings.append(
                f"One request takes {plan.service_s:.1f} s, longer than the latency objective: no setting meets it."
            )
        else:
            warnings.append(
                f"The cluster has no {plan.binding} free for even one replica of this deployment. {resources.reason}"
            )
    throughput = f"; its replicas then serve about {plan.throughput_rps:.2f} requests/s" if plan.throughput_rps else ""
    reason = (
        f"{c}: a replica holding {c} request(s) at once peaks at about {_mib(plan.peak_bytes)}; {plan.per_node} such replica(s) "
        f"fit the budget of {_mib(budget.bytes_per_node)} per node{throughput}. {_candidates_text(plan)} {memory.reason} {budget.reason}"
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
            f"{cand['concurrency']} at once: {cand['replicas']} replica(s) of {_mib(cand['peak_bytes'])}{rate}{slow}"
        )
    return "Weighed: " + "; ".join(parts) + "."


def _target(concurrency: int) -> int:
    return max(1, round(concurrency * SCALE_OUT_AT))


def _autoscaling(
    current: Current, plan: Plan, memory: Memory, budget: Budget, resources: Resources | None, load: Load
) -> dict:
    """R2: as many replicas as memory and resources hold, at least 2 kept warm, scaled out before
    replicas are full, fast up and slow down."""
    warnings: list[str] = []
    reasons: dict[str, str] = {}
    auto = current.autoscaling or {}
    max_replicas = max(plan.replicas, 1)
    if plan.binding == "memory":
        reasons["max_replicas"] = (
            f"{max_replicas}: the memory budget holds {plan.per_node} replica(s) of {_mib(plan.peak_bytes)} "
            f"per node on {budget.nodes} node(s); memory binds."
        )
    else:
        cpu_each = (resources.per_replica.get(plan.binding) if resources else None) or 0
        reasons["max_replicas"] = (
            f"{max_replicas}: the cluster schedules {_amount((resources.free or {}).get(plan.binding, 0))} "
            f"{plan.binding} at {_amount(cpu_each)} each; {plan.binding} binds (memory would hold "
            f"{plan.per_node * budget.nodes})."
        )
    if resources is not None and resources.free is None:
        warnings.append(resources.reason)
    needed = load.peak_in_flight
    slots = max_replicas * plan.concurrency
    if needed and needed > slots:
        more = math.ceil((needed - slots) / plan.concurrency)
        extra = f"{more} more replica(s): about {_mib(more * plan.peak_bytes)} more memory"
        if resources is not None and resources.per_replica.get("CPU"):
            extra += f" and {_amount(more * resources.per_replica['CPU'])} more CPU"
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


def _queue_bound(current: Current, plan: Plan, load: Load, objective_ms: int) -> dict:
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
        throughput = slots / service_s
        wait_s = LATENCY_MARGIN * objective_ms / 1000 - service_s
        bound = max(1, min(MAX_QUEUE_BOUND, int(throughput * wait_s))) if wait_s > 0 else 1
        if wait_s <= 0:
            warnings.append(
                f"A request takes {service_s:.1f} s, as long as the {objective_ms / 1000:.0f} s objective: queueing at all breaks it."
            )
        reason = (
            f"{bound}: {slots} request slots ({replicas} replica(s) × {plan.concurrency}) at {service_s:.2f} s per request "
            f"({source}) serve about {throughput:.1f} requests/s; a request queued behind {bound} others still finishes "
            f"within {int(LATENCY_MARGIN * 100)} % of the {objective_ms / 1000:.0f} s objective (service under load runs "
            "slower than calibrated)."
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
        f"At the incident's busiest moment {peak:.0f} requests were in flight or queued; {slots} slots and a queue of {bound} hold "
        f"{slots + bound}, so about {peak - slots - bound:.0f} at once would be shed with 503: at that load a p99 within "
        f"{objective_ms / 1000:.0f} s and no failed requests cannot both be had. Serving it within the objective takes about "
        f"{extra} more replica(s) of {_mib(plan.peak_bytes)} ({_mib(extra * plan.peak_bytes)} more memory than the budget, "
        f"or another node), or a longer latency objective."
    ]


def _batch_tokens(
    current: Current, curve, budget: Budget | None, per_node: int | None, concurrency: int | None
) -> dict:
    """R4: the largest batch token sum whose measured peak fits one replica's share of the node
    budget (the budget ÷ the replicas per node that R1 sized at its concurrency, which R2 keeps
    to). A patch only
    where the deployment reads the limit from its user_config (a `max_batch_tokens` key);
    elsewhere the limit lives in code and the value is guidance."""
    config = current.user_config or {}
    if budget is None or not per_node:
        return {
            "patch": None,
            "value": {"max_batch_tokens": None},
            "largest_fitting_tokens": None,
            "warnings": [],
            "reasons": {
                "max_batch_tokens": "Not computed: there is no memory budget (no kill message and no node reading) to fit "
                "a batch into. Collect metrics or wait for a kill, then re-plan."
            },
        }
    share = budget.bytes_per_node // per_node
    largest = int(max(x for x, _ in curve.points))
    ceiling = MAX_EXTRAPOLATION * largest
    limit = largest_token_sum(curve, share, ceiling)
    share_text = (
        f"one replica's share of the budget is {_mib(share)} ({_mib(budget.bytes_per_node)} per node ÷ {per_node} replica(s) "
        f"per node at max_ongoing_requests {concurrency}; the safety margin is already in the budget)"
    )
    warnings: list[str] = []
    if limit == 0:
        warnings.append(
            f"The replica at rest ({_mib(curve.baseline_bytes)}) already needs more than its share ({_mib(share)}): no "
            "batch fits. Give the deployment more memory per node or fewer replicas per node."
        )
        return {
            "patch": None,
            "value": {"max_batch_tokens": None},
            "largest_fitting_tokens": 0,
            "warnings": warnings,
            "reasons": {"max_batch_tokens": f"Not computed: {share_text}, and nothing fits it."},
        }
    reason = (
        f"{limit}: a batch of {limit} tokens peaks at about {_mib(curve.peak_at(limit))} on calibration #{curve.calibration_id} "
        f"({curve.device}); {share_text}."
    )
    if limit == ceiling:
        reason += (
            f" Capped at {MAX_EXTRAPOLATION} × the largest calibrated sum ({largest}): the budget may hold more, but that far "
            "out the curve is a straight-line guess. Calibrate larger token sums to go further."
        )
    value = limit
    existing = config.get("max_batch_tokens")
    if isinstance(existing, int) and not isinstance(existing, bool) and 1 <= existing < limit:
        value = existing
        reason += f" It is already {existing}, lower than computed: kept."
    if largest < value < ceiling:
        warnings.append(
            f"{value} tokens is beyond the largest calibrated sum ({largest}): the curve's last step is extrapolated. "
            f"Calibrate up to {value} tokens to confirm it."
        )
    tokens, _ = request_tokens(config)
    if tokens is not None and tokens > value:
        warnings.append(
            f"One request may bring {tokens} tokens (its caps) but a batch holds at most {value}: larger requests would "
            "be refused. Lower the input caps (R3) or give the replica more memory."
        )
    patch = {"user_config": {"max_batch_tokens": value}} if "max_batch_tokens" in config else None
    return {
        "patch": patch,
        "value": {"max_batch_tokens": value},
        "largest_fitting_tokens": limit,
        "reasons": {"max_batch_tokens": reason},
        "warnings": warnings,
    }


def reads_input_caps(user_config: dict | None) -> bool:
    """Whether the deployment takes an input cap from its user_config, so that R3 is a config change."""
    return any(name in (user_config or {}) for name in INPUT_CAPS)


def input_caps(
    current: Current, memory: Memory | None, budget: Budget | None, plan: Plan | None, curve, batch: dict | None
) -> dict:
    """R3 where the deployment reads its caps from user_config: the most tokens one request may
    bring (prompt plus requested) so that a replica holding as many requests as R1 sized fits its
    share of the memory budget, each token priced at the token-sum calibration's steepest step,
    and no more than the batch limit the deployment enforces (a larger request could never join a
    batch). Caps are only lowered, in their own proportion; caps that fit are kept, and without a
    per-token measurement and a budget nothing is computed."""
    config = current.user_config or {}
    caps = {name: config.get(name) for name in INPUT_CAPS}
    unusable = [name for name, value in caps.items() if not _is_cap(value)]
    if unusable:
        return {
            "patch": None,
            "value": {},
            "reasons": {},
            "warnings": [
                f"The user_config has no usable {' and no '.join(unusable)} (a whole number of tokens, at least 1): a request's size has "
                "no bound Fleetdeck can set. Read both caps from user_config and the wizard computes them from measured memory."
            ],
        }
    if curve is None or curve.axis != "token_sum":
        measured = (
            f"calibration #{curve.calibration_id} measured memory per request, not per token"
            if curve is not None
            else "memory per token is not measured"
        )
        return _caps_waiting(
            f"No caps are computed: {measured}, and a cap sized without it could be a guess that lets requests "
            "use more memory. Calibrate on the token-sum axis (a calibration_batch(token_sum) method), then re-plan."
        )
    if budget is None or plan is None or memory is None:
        return _caps_waiting(
            "No caps are computed: there is no memory budget to fit a request into (no kill message and no node "
            "reading). Collect metrics or wait for a kill, then re-plan."
        )
    per_token = max(curve.per_unit_bytes, 1)
    per_node = max(plan.per_node, 1)
    share = budget.bytes_per_node // per_node
    room = share - memory.baseline_bytes
    fit = int(room // (plan.concurrency * per_token)) if room > 0 else 0
    why = (
        f"one replica's share of the budget is {_mib(share)} ({_mib(budget.bytes_per_node)} per node ÷ {per_node} replica(s)); "
        f"less its {_mib(memory.baseline_bytes)} at rest, {_mib(max(room, 0))} holds {plan.concurrency} request(s) at once "
        f"(max_ongoing_requests {plan.concurrency}) of at most {fit} tokens at {per_token / 1024:,.0f} KiB per token (calibration "
        f"#{curve.calibration_id}'s steepest step)"
    )
    batch_limit = (batch or {}).get("value", {}).get("max_batch_tokens") if "max_batch_tokens" in config else None
    if batch_limit and batch_limit < fit:
        fit = batch_limit
        why += f"; a request larger than the batch limit of {batch_limit} tokens (R4) could never join a batch"
    total = caps["max_prompt_tokens"] + caps["max_tokens_cap"]
    if fit < 2:
        return {
            "patch": None,
            "not_applicable": True,
            "value": {},
            "reasons": {name: f"Not computed: {why}." for name in INPUT_CAPS},
            "warnings": [
                f"Not even a request of two tokens fits: {why}. No input cap prevents the kill: give the deployment more "
                "memory per node or fewer replicas per node."
            ],
        }
    if total <= fit:
        kept = f"kept: a request brings at most {total} tokens and up to {fit} fit ({why})."
        return {
            "patch": {"user_config": dict(caps)},
            "value": dict(caps),
            "warnings": [],
            "reasons": {name: f"{value}, {kept}" for name, value in caps.items()},
        }
    prompt = max(1, min(caps["max_prompt_tokens"], fit * caps["max_prompt_tokens"] // total))
    generated = max(1, min(caps["max_tokens_cap"], fit - prompt))
    split = f"{prompt + generated} tokens a request, split as the current caps are ({caps['max_prompt_tokens']} + {caps['max_tokens_cap']})"
    warnings = []
    largest = int(max(x for x, _ in curve.points))
    if prompt + generated > largest:
        warnings.append(
            f"{prompt + generated} tokens is beyond the largest calibrated sum ({largest}): the curve's last step is "
            "extrapolated. Calibrate larger token sums to confirm it."
        )
    new = {"max_prompt_tokens": prompt, "max_tokens_cap": generated}
    return {
        "patch": {"user_config": new},
        "value": new,
        "warnings": warnings,
        "reasons": {name: f"{value}, down from {caps[name]}: {split}; {why}." for name, value in new.items()},
    }


def _caps_waiting(why: str) -> dict:
    return {
        "patch": None,
        "waiting": True,
        "why_waiting": why,
        "value": {},
        "reasons": {name: why for name in INPUT_CAPS},
        "warnings": [],
    }


def _is_cap(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def largest_token_sum(curve, limit_bytes: int, ceiling: int) -> int:
    """The largest whole token sum up to `ceiling` whose peak on `curve`, and that of every smaller
    sum, stays within `limit_bytes`; 0 when not even the replica at rest fits. Smaller sums count
    too because a dip in a measured curve is noise, not room."""

    def fits(token_sum: int) -> bool:
        worst = max((peak for x, peak in curve.points if x <= token_sum), default=0)
        return max(curve.peak_at(token_sum), worst) <= limit_bytes

    if not fits(0):
        return 0
    low, high = 0, ceiling
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _mib(value: float) -> str:
    return f"{value / MIB:,.0f} MiB"
