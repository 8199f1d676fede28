"""The figures sizing reads, from what was measured: a replica's memory, the memory budget on a
node and the load traffic put on the deployment. Pure functions; every figure says where it comes
from.

Memory: `baseline` is a replica at rest (model, runtime), and a replica taking `c` requests at
once peaks at `peak(c)`: the calibration curve where one was measured (for a weighted mix of
requests, a high quantile of c requests drawn from it: apps.calibration.mix), else baseline + c ×
per_request. The budget is what this deployment's replicas may use on one node, with a safety
margin below the point where Ray's memory monitor (or the kernel) kills, sized in
apps.remediation.margin. A figure that can only be
a lower bound (memory from a kill message divided by the requests admitted) is labelled as one and
never sizes anything: the wizard calibrates first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Protocol

from apps.calibration.mix import QUANTILE_REASON
from apps.incidents.oom import ReplicaMemory
from apps.remediation.margin import Margin, unmeasured

# Ray's default memory_usage_threshold: the monitor kills above 95 % of node memory.
RAY_MEMORY_THRESHOLD = 0.95

MIB = 2**20

GIB = 2**30


class MeasuredCurve(Protocol):
    """What a replica's memory reads of a concurrency-axis calibration curve (apps.calibration.curve.Curve)."""

    @property
    def baseline_bytes(self) -> int: ...

    @property
    def points(self) -> Sequence[tuple[float, int]]: ...

    def peak_at(self, x: float) -> int: ...

    def mix_peak(self, concurrency: int) -> int: ...


@dataclass(frozen=True)
class Memory:
    baseline_bytes: int
    per_request_bytes: int
    source: str  # "calibration", "oom-kill"
    reason: str
    # Only a lower bound (requests admitted are not requests resident): shown, never sized from.
    lower_bound: bool = False
    curve: MeasuredCurve | None = None  # a concurrency-axis calibration curve, when one was measured
    # What traffic showed a request holds at least: it can only raise a peak, so lower concurrency.
    per_request_floor_bytes: int = 0

    def peak(self, concurrency: int) -> int:
        """One replica's peak holding `concurrency` requests at once."""
        floor = self.baseline_bytes + concurrency * self.per_request_floor_bytes
        if self.curve is not None and getattr(self.curve, "is_mixed", False):
            # The quantile of the increments' sum, on top of this replica's own rest.
            return max(self.baseline_bytes + self.curve.mix_peak(concurrency) - self.curve.baseline_bytes, floor)
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
        for x0, x1 in pairwise(xs):
            if concurrency <= x1:
                return times[x0] + (times[x1] - times[x0]) * (concurrency - x0) / (x1 - x0)
        return times[xs[-1]] * concurrency / xs[-1]


# How far a traffic's processing p50 may lie from the sized request's service time, either way, before it
# is judged another traffic: a calibrated service time moves with concurrency and load by well under 3x,
# cached answers and requests of another size move it by 10x and more.
TRAFFIC_RATIO = 3


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
        f" A replica was seen at {mib(replica_floor_bytes)} ({floor_reason}), more than the job measured at rest: the "
        "baseline is lifted to it."
        if replica_floor_bytes and replica_floor_bytes > curve.baseline_bytes
        else ""
    )
    if curve.axis == "concurrency" and getattr(curve, "is_mixed", False):
        return _memory_from_mix(curve, baseline, lifted)
    if curve.axis == "concurrency":
        levels = ", ".join(f"{mib(peak)} at {x:g}" for x, peak in curve.points)
        return Memory(
            baseline,
            max(curve.per_unit_bytes, 1),
            "calibration",
            f"Calibration #{curve.calibration_id} ({curve.device}, {curve.measured_at:%Y-%m-%d %H:%M}): "
            f"{mib(curve.baseline_bytes)} at rest; peaks of {levels} request(s) at once "
            f"(+{mib(curve.per_unit_bytes)} per request at the steepest step).{lifted}",
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
        f"Calibration #{curve.calibration_id} ({curve.device}, token sums up to {largest}): "
        f"{mib(curve.baseline_bytes)} at rest, +{curve.per_unit_bytes / 1024:.0f} KiB per token (steepest step); "
        f"{tokens_reason}: {mib(per_request)} per request.{lifted}",
    )


def _memory_from_mix(curve, baseline: int, lifted: str) -> Memory:
    """A calibrated mix: peaks from the quantile of its increments' sum (Memory.peak); per request,
    what an average request of the mix holds, which is what traffic's per-request figure compares to."""
    total = sum(e.share for e in curve.mix)
    mean = int(sum(e.share * e.increment_bytes for e in curve.mix) / total)
    entries = "; ".join(f"{e.label} {e.share:g} % of traffic, +{mib(e.increment_bytes)} each" for e in curve.mix)
    peaks = ", ".join(f"{mib(curve.mix_peak(int(x)))} at {x:g}" for x, _ in curve.points)
    return Memory(
        baseline,
        max(mean, 1),
        "calibration",
        f"Calibration #{curve.calibration_id} ({curve.device}, {curve.measured_at:%Y-%m-%d %H:%M}) measured a mix of "
        f"{len(curve.mix)} requests: {entries}; {mib(curve.baseline_bytes)} at rest. A replica holding c of them is "
        f"sized at {QUANTILE_REASON}: peaks of {peaks} request(s) at once.{lifted}",
        curve=curve,
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
        base_text = f"its idle peers used {mib(baseline)}"
    elif seen_at_rest:
        base_text = f"no idle peer was listed; traffic showed {mib(baseline)} per replica at rest"
    else:
        base_text = "no idle peer was listed, so its size at rest is unknown"
    if observed is not None and (observed.per_request_bytes or 0) > per_request:
        per_request = observed.per_request_bytes
        base_text += f"; traffic since showed at least {mib(per_request)} per request"
    return Memory(
        baseline,
        per_request,
        "oom-kill",
        f"Lower bound only: the killed replica used {mib(peak)}; {base_text}; spread over up to {held:.0f} requests "
        f"admitted it is at least {mib(per_request)} per request. Requests admitted are not requests resident, so the "
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
            f"{memory.reason} Traffic since showed at least {mib(floor)} per request, more than the calibration's "
            f"{mib(memory.per_request_bytes)}: peaks are priced at the larger. Calibrate with a heavier "
            "representative request."
        ),
    )


def budget_from_kill(
    used_bytes: int | None,
    threshold_bytes: int | None,
    replicas: list[ReplicaMemory],
    app: str,
    dep: str,
    nodes: int,
    margin: Margin | None = None,
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
    margin = margin or unmeasured()
    return Budget(
        margin.apply(room),
        max(nodes, 1),
        f"Ray kills above {mib(threshold_bytes)} on the node; everything else used {mib(others)}; of the "
        f"{mib(room)} left, {margin.reason}.",
    )


def newest_node_memory(points: list[dict]) -> dict | None:
    """A node window's newest reading that has the node's memory: a reading can lack it
    (apps.fleet.metric_readings), and a point of zeros would leave the node out of the budget."""
    return next((p for p in reversed(points) if p.get("mem_total")), None)


def budget_from_nodes(
    node_points: list[dict],
    margin: Margin | None = None,
    threshold: float | None = None,
    threshold_reason: str = "",
    running: str = "replicas already running count against it",
) -> Budget | None:
    """Without a kill: the headroom nodes have now below Ray's kill threshold, the default one
    unless `threshold` (a fraction of node memory, e.g. from a kill message) says otherwise."""
    latest = [p for p in node_points if p.get("mem_total")]
    if not latest:
        return None
    fraction = threshold or RAY_MEMORY_THRESHOLD
    rooms = [fraction * p["mem_total"] - p.get("mem_used", 0) for p in latest]
    room = min(rooms)
    if room <= 0:
        return None
    margin = margin or unmeasured()
    which = (
        f"the kill threshold, {fraction:.0%} of node memory ({threshold_reason})"
        if threshold
        else "Ray's kill threshold"
    )
    return Budget(
        margin.apply(room),
        len(latest),
        f"The tightest of {len(latest)} node(s) has {mib(room)} below {which} now; of it, {margin.reason} ({running}).",
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


def mib(value: float) -> str:
    return f"{value / MIB:,.0f} MiB"
