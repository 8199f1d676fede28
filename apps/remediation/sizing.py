"""Computed values for the config remedies (R1, R2, R10) and the token-sum batch limit (R4): from
measured memory and load, not constants. Pure functions; every value comes with the reason it has
that value.

Memory: `baseline` is a replica at rest (model, runtime), `per_request` what one request in
flight adds at its peak. A replica taking `c` requests at once peaks at baseline + c × per_request.
The budget is what this deployment's replicas may use on one node, with a safety margin below
the point where Ray's memory monitor (or the kernel) kills. From a token-sum calibration, a
request costs its tokens times the curve's cost per token, and the batch limit is the largest
token sum whose measured peak fits one replica's share of the budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from apps.changes.fields import parse_version
from apps.incidents.oom import ReplicaMemory

SAFETY_MARGIN = 0.8
# Ray's default memory_usage_threshold: the monitor kills above 95 % of node memory.
RAY_MEMORY_THRESHOLD = 0.95
MIB = 2**20
MAX_QUEUE_BOUND = 10_000
# A batch limit may extrapolate the curve's last step this far past the largest calibrated sum;
# further out a straight line is a guess, and a calibration of larger sums is the answer.
MAX_EXTRAPOLATION = 4


@dataclass(frozen=True)
class Memory:
    baseline_bytes: int
    per_request_bytes: int
    source: str  # "calibration", "oom-kill"
    reason: str


@dataclass(frozen=True)
class Budget:
    bytes_per_node: int  # margin already applied
    nodes: int
    reason: str


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
        return cls(effective.get("max_ongoing_requests"), effective.get("max_queued_requests"),
                   auto if isinstance(auto, dict) else None, replicas if isinstance(replicas, int) else None, ray_version,
                   user_config if isinstance(user_config, dict) else None)


@dataclass
class Sizing:
    values: dict[str, dict] = field(default_factory=dict)  # remedy -> {"patch", "reasons", "warnings"}
    conservative: bool = False

    def patch(self, remedy: str) -> dict | None:
        return self.values.get(remedy, {}).get("patch")


# --- where memory figures come from --------------------------------------------------------


def request_tokens(user_config: dict | None) -> tuple[int | None, str]:
    """The most tokens one request can bring to a batch: the deployment's own caps, when its
    user_config sets both (max_prompt_tokens + max_tokens_cap); else None, with the reason."""
    config = user_config or {}
    caps = {name: config.get(name) for name in ("max_prompt_tokens", "max_tokens_cap")}
    missing = [name for name, value in caps.items() if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1)]
    if missing:
        return None, f"the user_config caps no {' and no '.join(missing)}"
    tokens = sum(caps.values())
    return tokens, (f"a request brings at most {tokens} tokens (user_config max_prompt_tokens {caps['max_prompt_tokens']} + "
                    f"max_tokens_cap {caps['max_tokens_cap']})")


def memory_from_curve(curve, tokens_per_request: int | None = None, tokens_reason: str = "") -> Memory | None:
    """A calibration curve (peak bytes against concurrency, or against batch token sum). On the
    token-sum axis a request costs `tokens_per_request` tokens (`tokens_reason` says why), or,
    unknown, as much as the largest calibrated batch."""
    if curve is None:
        return None
    if curve.axis == "concurrency":
        return Memory(curve.baseline_bytes, max(curve.per_unit_bytes, 1), "calibration",
                      f"Calibration #{curve.calibration_id} ({curve.device}, {curve.measured_at:%Y-%m-%d %H:%M}): "
                      f"{_mib(curve.baseline_bytes)} at rest, +{_mib(curve.per_unit_bytes)} per request in flight (steepest step).")
    largest = int(max(x for x, _ in curve.points))
    tokens = tokens_per_request or largest
    if tokens_per_request:
        tokens_reason = tokens_reason or f"a request of {tokens} tokens"
    else:
        tokens_reason = (f"{tokens_reason or 'no request size is known'}, so a request is taken to be as large as the largest "
                         f"calibrated batch, {largest} tokens (conservative)")
    per_request = max(int(curve.per_unit_bytes * tokens), 1)
    return Memory(curve.baseline_bytes, per_request, "calibration",
                  f"Calibration #{curve.calibration_id} ({curve.device}, token sums up to {largest}): {_mib(curve.baseline_bytes)} at "
                  f"rest, +{curve.per_unit_bytes / 1024:.0f} KiB per token (steepest step); {tokens_reason}: {_mib(per_request)} per "
                  "request.")


def memory_from_kill(replicas: list[ReplicaMemory], app: str, dep: str, in_flight: float | None, cap: int | None) -> Memory | None:
    """From Ray's kill message: the killed replica's memory and its idle peers', spread over the
    requests it held, as measured near the kill. Without that measurement there is no estimate:
    assuming the replica was full would understate per-request memory, which is the unsafe side."""
    mine = [r for r in replicas if (r.application, r.deployment) == (app, dep)]
    killed = [r.used_bytes for r in mine if r.killed]
    if not killed or not in_flight or in_flight < 1:
        return None
    peak = max(killed)
    idle = [r.used_bytes for r in mine if not r.killed]
    baseline = min(idle) if idle else 0
    held = min(in_flight, cap or in_flight)
    per_request = max(int((peak - baseline) / held), 1)
    base_text = f"idle peers used {_mib(baseline)}" if idle else "no idle peer was listed, so the baseline is taken as 0 (conservative)"
    return Memory(baseline, per_request, "oom-kill",
                  f"The killed replica used {_mib(peak)}; {base_text}; {held:.0f} requests in flight per replica were measured near "
                  f"the kill: about {_mib(per_request)} per request.")


def budget_from_kill(used_bytes: int | None, threshold_bytes: int | None, replicas: list[ReplicaMemory], app: str, dep: str,
                     nodes: int) -> Budget | None:
    """Room for this deployment on the node that killed it: the kill threshold minus what
    everything else on the node used at that moment."""
    if not used_bytes or not threshold_bytes:
        return None
    mine = sum(r.used_bytes for r in replicas if (r.application, r.deployment) == (app, dep))
    others = max(used_bytes - mine, 0)
    room = threshold_bytes - others
    if room <= 0:
        return None
    return Budget(int(room * SAFETY_MARGIN), max(nodes, 1),
                  f"Ray kills above {_mib(threshold_bytes)} on the node; everything else used {_mib(others)}; "
                  f"{int(SAFETY_MARGIN * 100)} % of the {_mib(room)} left is this deployment's budget per node.")


def budget_from_nodes(node_points: list[dict]) -> Budget | None:
    """Without a kill: the headroom nodes have now below Ray's default kill threshold."""
    latest = [p for p in node_points if p.get("mem_total")]
    if not latest:
        return None
    rooms = [RAY_MEMORY_THRESHOLD * p["mem_total"] - p.get("mem_used", 0) for p in latest]
    room = min(rooms)
    if room <= 0:
        return None
    return Budget(int(room * SAFETY_MARGIN), len(latest),
                  f"The tightest of {len(latest)} node(s) has {_mib(room)} below Ray's kill threshold now; "
                  f"{int(SAFETY_MARGIN * 100)} % of it is the budget (replicas already running count against it).")


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


def compute(current: Current, memory: Memory | None, budget: Budget | None, load: Load, *, latency_objective_ms: int,
            curve=None) -> Sizing:
    """R1, R2 and R10 always; R4 when `curve` is a token-sum calibration."""
    sizing = Sizing(conservative=memory is None or budget is None)
    concurrency, max_replicas, r1 = _concurrency(current, memory, budget)
    sizing.values["R1"] = r1
    r2, max_replicas = _autoscaling(current, concurrency, max_replicas, load)
    sizing.values["R2"] = r2
    sizing.values["R10"] = _queue_bound(current, concurrency, max_replicas, load, latency_objective_ms)
    if curve is not None and curve.axis == "token_sum":
        sizing.values["R4"] = _batch_tokens(current, curve, budget, r1.get("replicas_per_node"), r1.get("sized_at_concurrency"))
    return sizing


def _concurrency(current: Current, memory: Memory | None, budget: Budget | None) -> tuple[int, int | None, dict]:
    concurrency, replicas, values = _concurrency_alone(current, memory, budget)
    target = (current.autoscaling or {}).get("target_ongoing_requests")
    if isinstance(target, (int, float)) and target > concurrency:
        # A cap below the autoscaling target would stop the deployment from ever scaling up.
        values["patch"]["autoscaling_config"] = {"target_ongoing_requests": 1}
        values["reasons"]["target_ongoing_requests"] = (f"1, down from {target:g}: replicas never carry more than "
                                                        f"{concurrency}, so a higher target would never be reached.")
    return concurrency, replicas, values


def _concurrency_alone(current: Current, memory: Memory | None, budget: Budget | None) -> tuple[int, int | None, dict]:
    """R1: 1 or 2 requests at once, whichever gives the deployment more total capacity within
    the memory budget (ties go to 1: the lower peak)."""
    warnings: list[str] = []
    if memory is None or budget is None:
        missing = "no memory measurement (run a calibration)" if memory is None else "no memory budget (no kill or node reading)"
        reasons = {"max_ongoing_requests": f"Conservative default of 1: {missing}. One request per replica keeps the peak at its "
                                           "smallest; calibrate to learn whether two fit."}
        if memory is not None:
            reasons["max_ongoing_requests"] += " " + memory.reason
        return 1, None, {"patch": {"max_ongoing_requests": 1}, "reasons": reasons, "warnings": warnings, "conservative": True}

    def fits(c: int) -> int:
        return budget.bytes_per_node // (memory.baseline_bytes + c * memory.per_request_bytes)

    capacity = {c: fits(c) * c for c in (1, 2)}
    if capacity[1] == 0:
        need = memory.baseline_bytes + memory.per_request_bytes
        warnings.append(f"One request needs about {_mib(need)} but the budget per node is {_mib(budget.bytes_per_node)}: lowering "
                        "concurrency cannot prevent the kill. Cap input sizes (R3) or give the deployment more memory per node.")
        concurrency, per_node = 1, 1
    else:
        concurrency = 2 if capacity[2] > capacity[1] else 1
        per_node = fits(concurrency)
    replicas, sized_at = per_node * budget.nodes, concurrency
    peak = memory.baseline_bytes + concurrency * memory.per_request_bytes
    reasons = {
        "max_ongoing_requests": f"{concurrency}: a replica then peaks at about {_mib(peak)} "
                                f"({_mib(memory.baseline_bytes)} + {concurrency} × {_mib(memory.per_request_bytes)}); {per_node} such "
                                f"replica(s) fit the budget of {_mib(budget.bytes_per_node)} per node. {memory.reason} {budget.reason}",
    }
    if current.max_ongoing_requests is not None and current.max_ongoing_requests < concurrency:
        concurrency = current.max_ongoing_requests
        reasons["max_ongoing_requests"] += f" It is already {concurrency}, lower than computed: kept."
    return concurrency, replicas, {"patch": {"max_ongoing_requests": concurrency}, "reasons": reasons, "warnings": warnings,
                                   "conservative": False, "replica_peak_bytes": peak, "replicas_per_node": per_node,
                                   "sized_at_concurrency": sized_at}


def _autoscaling(current: Current, concurrency: int, memory_replicas: int | None, load: Load) -> tuple[dict, int]:
    """R2: target about 1 request per replica, at least 2 replicas, fast up, slow down, and no more
    replicas than the memory budget holds."""
    warnings: list[str] = []
    reasons: dict[str, str] = {}
    auto = current.autoscaling or {}
    existing_max = auto.get("max_replicas") or current.num_replicas or 1
    target = 1
    reasons["target_ongoing_requests"] = "1: scale out as soon as replicas average more than one request, before queues form."
    needed = math.ceil(load.peak_in_flight / target) if load.peak_in_flight else None
    if memory_replicas is not None:
        max_replicas = memory_replicas
        reasons["max_replicas"] = f"{max_replicas}: as many replicas as the memory budget holds at this concurrency."
        if needed and needed > max_replicas:
            warnings.append(f"The busiest moment had {load.peak_in_flight:.0f} requests in flight or queued: {needed} replicas at "
                            f"this target, but memory holds {max_replicas}. The rest waits in the bounded queue (R10) or is "
                            "shed with 503: add nodes or memory to serve that peak.")
        elif needed and 2 * needed < max_replicas:
            max_replicas = max(2 * needed, 2)
            reasons["max_replicas"] = (f"{max_replicas}: twice the {needed} replicas the busiest moment needed "
                                       f"({load.peak_in_flight:.0f} in flight or queued); memory would hold {memory_replicas}.")
    else:
        # Without a memory figure, more replicas could be exactly what kills the node: keep the maximum.
        max_replicas = max(existing_max, 2)
        reasons["max_replicas"] = (f"{max_replicas}: memory per replica is not measured, so the current maximum is kept "
                                   "(at least 2); calibrate to size it from memory.")
        if needed and needed > max_replicas:
            warnings.append(f"The busiest moment needed {needed} replicas at this target; raise max_replicas once a "
                            "calibration shows they fit in memory.")
    min_replicas = min(2, max_replicas)
    reasons["min_replicas"] = ("2: a recycle, change or crash of one replica never leaves the deployment cold." if min_replicas == 2
                               else "1: the memory budget holds only one replica on this cluster.")
    if min_replicas < 2:
        warnings.append("Only one replica fits: every restart is an outage (LAT-1). Give the deployment more memory.")
    downscale = 300 if load.cold_starts else max(int(auto.get("downscale_delay_s") or 0), 120)
    reasons["upscale_delay_s"] = "5 s: add replicas while the burst is still on, not 30 s later (Serve's default)."
    reasons["downscale_delay_s"] = (f"{downscale} s: replicas started recently and pay a cold start, so keep them longer."
                                    if load.cold_starts else f"{downscale} s: slow to remove replicas that bursts need again.")
    patch = {"autoscaling_config": {"min_replicas": min_replicas, "max_replicas": max_replicas, "target_ongoing_requests": target,
                                    "upscale_delay_s": 5, "downscale_delay_s": downscale}}
    return {"patch": patch, "reasons": reasons, "warnings": warnings}, max_replicas


def _queue_bound(current: Current, concurrency: int, max_replicas: int, load: Load, objective_ms: int) -> dict:
    """R10: a queue no longer than what the deployment serves within the latency objective;
    beyond that, failing fast beats answering late."""
    if parse_version(current.ray_version) < (2, 10):
        return {"patch": None, "reasons": {}, "warnings": [f"max_queued_requests exists from Ray 2.10; this cluster runs "
                                                           f"{current.ray_version}. Bound queues at the client or upgrade."],
                "not_applicable": True}
    slots = max_replicas * concurrency
    if load.p50_ms:
        throughput = slots / (load.p50_ms / 1000)
        bound = max(1, min(MAX_QUEUE_BOUND, int(throughput * objective_ms / 1000) - slots))
        reason = (f"{bound}: {slots} request slots ({max_replicas} replicas × {concurrency}) at a steady p50 of {load.p50_ms:.0f} ms "
                  f"serve about {throughput:.1f} requests/s; a request queued behind {bound} others still starts within the "
                  f"{objective_ms / 1000:.0f} s objective.")
    else:
        bound = max(2 * slots, 4)
        reason = f"{bound}: twice the {slots} request slots; no latency measurement yet to size it from the objective."
    reason += " Serve applies it per caller (each proxy and handle), so the total queue is this bound per proxy."
    return {"patch": {"max_queued_requests": bound}, "reasons": {"max_queued_requests": reason}, "warnings": []}


def _batch_tokens(current: Current, curve, budget: Budget | None, per_node: int | None, concurrency: int | None) -> dict:
    """R4: the largest batch token sum whose measured peak fits one replica's share of the node
    budget (the budget ÷ the replicas per node that R1 sized at its concurrency, which R2 keeps
    to). A patch only
    where the deployment reads the limit from its user_config (a `max_batch_tokens` key);
    elsewhere the limit lives in code and the value is guidance."""
    config = current.user_config or {}
    if budget is None or not per_node:
        return {"patch": None, "value": {"max_batch_tokens": None}, "largest_fitting_tokens": None, "warnings": [],
                "reasons": {"max_batch_tokens": "Not computed: there is no memory budget (no kill message and no node reading) to fit "
                                                "a batch into. Collect metrics or wait for a kill, then re-plan."}}
    share = budget.bytes_per_node // per_node
    largest = int(max(x for x, _ in curve.points))
    ceiling = MAX_EXTRAPOLATION * largest
    limit = largest_token_sum(curve, share, ceiling)
    share_text = (f"one replica's share of the budget is {_mib(share)} ({_mib(budget.bytes_per_node)} per node ÷ {per_node} replica(s) "
                  f"per node at max_ongoing_requests {concurrency}; the safety margin is already in the budget)")
    warnings: list[str] = []
    if limit == 0:
        warnings.append(f"The replica at rest ({_mib(curve.baseline_bytes)}) already needs more than its share ({_mib(share)}): no "
                        "batch fits. Give the deployment more memory per node or fewer replicas per node.")
        return {"patch": None, "value": {"max_batch_tokens": None}, "largest_fitting_tokens": 0, "warnings": warnings,
                "reasons": {"max_batch_tokens": f"Not computed: {share_text}, and nothing fits it."}}
    reason = (f"{limit}: a batch of {limit} tokens peaks at about {_mib(curve.peak_at(limit))} on calibration #{curve.calibration_id} "
              f"({curve.device}); {share_text}.")
    if limit == ceiling:
        reason += (f" Capped at {MAX_EXTRAPOLATION} × the largest calibrated sum ({largest}): the budget may hold more, but that far "
                   "out the curve is a straight-line guess. Calibrate larger token sums to go further.")
    value = limit
    existing = config.get("max_batch_tokens")
    if isinstance(existing, int) and not isinstance(existing, bool) and 1 <= existing < limit:
        value = existing
        reason += f" It is already {existing}, lower than computed: kept."
    if largest < value < ceiling:
        warnings.append(f"{value} tokens is beyond the largest calibrated sum ({largest}): the curve's last step is extrapolated. "
                        f"Calibrate up to {value} tokens to confirm it.")
    tokens, _ = request_tokens(config)
    if tokens is not None and tokens > value:
        warnings.append(f"One request may bring {tokens} tokens (its caps) but a batch holds at most {value}: larger requests would "
                        "be refused. Lower the input caps (R3) or give the replica more memory.")
    patch = {"user_config": {"max_batch_tokens": value}} if "max_batch_tokens" in config else None
    return {"patch": patch, "value": {"max_batch_tokens": value}, "largest_fitting_tokens": limit,
            "reasons": {"max_batch_tokens": reason}, "warnings": warnings}


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
