"""How many replicas a deployment needs, from its recent signals and a calibrated policy. Pure:
no database, no network; `decide` returns a Decision and something else acts on it (or, in
shadow mode, only records it), as SkyPilot's serve separates deciding from acting.

The load is Little's law: requests in flight = arrival rate × service time, so a deployment needs
(arrival rate × service time + what waits in the queue) / calibrated concurrency replicas. Two
windows read it, as Knative's autoscaler does: a short panic window that jumps on a burst (and
never scales down while it lasts) and a longer stable window, averaged, that follows a ramp and
brings the count down slowly, one replica at a time, only once the load fits in one replica fewer.
Memory bounds everything: a count the nodes cannot hold would trade queueing for OOM kills, which fail every request a
replica holds; at that ceiling the queue bound sheds the excess with 503s instead."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum

# A load a hair over a whole number of replicas is rounding noise in the rates, not a replica's worth.
EPSILON = 1e-6


class Kind(StrEnum):
    UP = "up"  # more replicas than the deployment's target now
    DOWN = "down"  # one fewer: the load fits without it
    HOLD = "hold"  # the target stays
    AT_CEILING = "at_ceiling"  # the load needs more than memory holds: the queue bound sheds the rest
    HAND_BACK = "hand_back"  # signals too old to act on: the count is left to the config

    @classmethod
    def moving(cls) -> frozenset[Kind]:
        return frozenset({cls.UP, cls.DOWN})


@dataclass(frozen=True)
class Sample:
    """One metrics reading of the deployment (a point of its signal window)."""

    at: float  # seconds since the epoch
    ongoing: float  # requests inside its replicas, all replicas together
    queued: float  # requests waiting for a replica
    arrival_rps: float | None  # requests that arrived per second: served plus shed at the proxy
    shed: float = 0.0  # 503s the proxy answered in the reading's interval (the queue bound shedding)
    p99_ms: float | None = None
    rss_bytes_per_replica: float | None = None  # resident memory of one replica, on average


@dataclass(frozen=True)
class Current:
    """The deployment as the last sync saw it."""

    target: int
    running: int
    starting: int  # replicas Ray has not started (STARTING, PENDING_*)


@dataclass(frozen=True)
class Signals:
    now: float
    samples: tuple[Sample, ...]  # oldest first
    current: Current
    oom_kills: tuple[float, ...] = ()  # when this deployment's replicas were OOM-killed
    # The fewest replicas that ran when one of those kills happened: that many did not fit.
    killed_at_replicas: int | None = None
    last_upscale_at: float | None = None  # this scaler's own last "up" decision


@dataclass(frozen=True)
class Policy:
    concurrency: int  # requests one replica holds within its memory, from the calibration
    service_s: float  # seconds one request takes at that concurrency, from the calibration
    min_replicas: int
    max_replicas: int
    memory_ceiling: int | None  # replicas memory and schedulable resources hold; None: unknown
    peak_bytes: int | None = None  # one replica's calibrated peak at `concurrency`
    queue_bound: int | None = None  # max_queued_requests: what sheds once at the ceiling
    latency_objective_ms: int | None = None
    # Metrics readings come with the sync (every 30 s by default): the panic window holds the
    # newest one or two and takes the worst of them (Knative averages a 6 s window of 2 s
    # readings; with readings this sparse an average would halve a burst), the stable window
    # averages about five.
    panic_window_s: float = 45.0
    stable_window_s: float = 120.0
    # Knative's default: panic when the short window needs twice the replicas there are.
    panic_threshold: float = 2.0
    # After an upscale, no downscale for this long: at most one reversal per burst.
    downscale_hold_s: float = 600.0
    # Four missed readings: the metrics pipeline is broken, not quiet.
    stale_after_s: float = 120.0
    # Replicas above their calibrated peak by more than this lower the ceiling (RSS is noisy).
    memory_tolerance: float = 0.10
    # After an OOM kill no replica is added for this long: the memory it lacked is not back yet.
    oom_memory_s: float = 900.0


@dataclass(frozen=True)
class Inputs:
    """What a decision read, kept with it so a shadow decision can be checked against reality."""

    signals_at: float | None
    signals_age_s: float | None
    current: int
    running: int
    starting: int
    stable_in_flight: float | None = None
    panic_in_flight: float | None = None
    stable_needed: int | None = None
    panic_needed: int | None = None
    panicking: bool = False
    memory_ceiling: int | None = None  # after the live correction and OOM kills
    rss_bytes_per_replica: float | None = None
    oom_kills: int = 0
    shed: float = 0.0
    p99_ms: float | None = None
    concurrency: int = 0
    service_s: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    target: int
    current: int
    kind: Kind
    reason: str
    inputs: Inputs


def decide(signals: Signals, policy: Policy) -> Decision:
    current = signals.current
    base = Inputs(
        signals_at=None,
        signals_age_s=None,
        current=current.target,
        running=current.running,
        starting=current.starting,
        concurrency=policy.concurrency,
        service_s=policy.service_s,
        min_replicas=policy.min_replicas,
        max_replicas=policy.max_replicas,
    )
    if not signals.samples:
        return Decision(
            current.target,
            current.target,
            Kind.HAND_BACK,
            "No metrics reading of this deployment yet: the replica count is left as it is.",
            base,
        )
    newest = signals.samples[-1]
    age = max(signals.now - newest.at, 0.0)
    if age > policy.stale_after_s:
        return Decision(
            current.target,
            current.target,
            Kind.HAND_BACK,
            f"The newest metrics reading is {age:.0f} s old (more than {policy.stale_after_s:.0f} s): "
            "deciding on it would be guessing, so the replica count is left as it is.",
            _with(base, signals_at=newest.at, signals_age_s=round(age, 1)),
        )

    stable = [s for s in signals.samples if s.at >= newest.at - policy.stable_window_s]
    panic = [s for s in signals.samples if s.at >= newest.at - policy.panic_window_s]
    stable_load = _mean(in_flight(s, policy) for s in stable)
    panic_load = max(in_flight(s, policy) for s in panic)
    stable_needed, panic_needed = needed(stable_load, policy), needed(panic_load, policy)
    panicking = panic_needed >= policy.panic_threshold * max(current.target, 1) and panic_needed > current.target
    kills = [t for t in signals.oom_kills if t >= signals.now - policy.oom_memory_s]
    rss = max((s.rss_bytes_per_replica for s in stable if s.rss_bytes_per_replica), default=None)
    ceiling, ceiling_why = memory_ceiling(
        policy, rss, len(kills), current, signals.killed_at_replicas if kills else None
    )
    inputs = _with(
        base,
        signals_at=newest.at,
        signals_age_s=round(age, 1),
        stable_in_flight=round(stable_load, 3),
        panic_in_flight=round(panic_load, 3),
        stable_needed=stable_needed,
        panic_needed=panic_needed,
        panicking=panicking,
        memory_ceiling=ceiling,
        rss_bytes_per_replica=rss,
        oom_kills=len(kills),
        shed=sum(s.shed for s in stable),
        p99_ms=newest.p99_ms,
    )
    load_text = (
        f"{stable_load:.1f} requests in flight on average over {policy.stable_window_s:.0f} s "
        f"(at worst {panic_load:.1f} over the last {policy.panic_window_s:.0f} s), {policy.concurrency} per replica"
    )

    if panicking:
        # A burst: jump to what the short window needs, and never come down while it lasts.
        desired, why = max(panic_needed, current.target), f"Burst: {load_text}, needs {panic_needed} replicas"
    else:
        desired, why = stable_needed, f"{load_text}: needs {stable_needed}"
    slo_breached = (
        policy.latency_objective_ms is not None
        and newest.p99_ms is not None
        and newest.p99_ms > policy.latency_objective_ms
        and newest.queued > 0
    )
    if slo_breached and desired <= current.target:
        # Requests wait and p99 is over the objective although the arithmetic says the count is
        # enough: the calibrated service time is optimistic for this traffic; one more replica.
        desired = current.target + 1
        why += (
            f"; p99 {newest.p99_ms:.0f} ms is over the {policy.latency_objective_ms} ms objective with requests queued"
        )
    desired = min(max(desired, policy.min_replicas), policy.max_replicas)

    at_ceiling = False
    if ceiling is not None and desired > ceiling:
        at_ceiling = True
        bound = policy.queue_bound
        sheds = (
            f"the queue bound (max_queued_requests {bound}) sheds the rest with 503s instead of an OOM kill"
            if bound is not None and bound >= 0
            else "set a queue bound (max_queued_requests) so the rest is shed with 503s instead of queueing "
            "until replicas are OOM-killed"
        )
        desired, why = ceiling, f"{why}, but {ceiling_why}: holding {ceiling}; {sheds}"

    if desired > current.target and current.starting > 0:
        # Replicas that do not start lack a node, memory or resources: more of them would wait
        # the same way and only make the shortage larger.
        return Decision(
            current.target,
            current.target,
            Kind.HOLD,
            f"{why}; but {current.starting} replica(s) are still starting: no more are added until they run.",
            inputs,
        )
    if at_ceiling:
        return Decision(desired, current.target, Kind.AT_CEILING, f"{why}.", inputs)
    if desired > current.target:
        return Decision(desired, current.target, Kind.UP, f"{why}: scale up from {current.target}.", inputs)

    if desired < current.target:
        fewer = current.target - 1
        if max(stable_load, panic_load) > fewer * policy.concurrency + EPSILON:
            return Decision(
                current.target,
                current.target,
                Kind.HOLD,
                f"{why}; {fewer} replica(s) would not hold the recent peak of "
                f"{max(stable_load, panic_load):.1f} in flight, so {current.target} stay.",
                inputs,
            )
        since_up = signals.now - signals.last_upscale_at if signals.last_upscale_at is not None else None
        if since_up is not None and since_up < policy.downscale_hold_s:
            return Decision(
                current.target,
                current.target,
                Kind.HOLD,
                f"{why}; the last scale-up was {since_up:.0f} s ago, so no scale-down before "
                f"{policy.downscale_hold_s:.0f} s have passed (one reversal per burst).",
                inputs,
            )
        # One at a time: the stable window is the slow way down.
        target = max(fewer, policy.min_replicas)
        return Decision(target, current.target, Kind.DOWN, f"{why}: one replica fewer, {target}.", inputs)

    return Decision(current.target, current.target, Kind.HOLD, f"{why}: {current.target} is right.", inputs)


def in_flight(sample: Sample, policy: Policy) -> float:
    """Requests the deployment must hold at once for this reading: Little's law on the arrivals
    (which counts the shed ones too), never less than what the replicas held, plus the queue."""
    served = sample.ongoing
    if sample.arrival_rps is not None:
        served = max(sample.arrival_rps * policy.service_s, served)
    return served + sample.queued


def needed(load: float, policy: Policy) -> int:
    return max(math.ceil(load / max(policy.concurrency, 1) - EPSILON), 0)


def memory_ceiling(
    policy: Policy, rss: float | None, kills: int, current: Current, killed_at: int | None = None
) -> tuple[int | None, str]:
    """The most replicas memory holds, and why, in words. The calibrated ceiling comes down when
    replicas are seen holding more than their calibrated peak (the curve was measured on other
    requests, or the allocator keeps pages), and after an OOM kill it is one fewer than ran at the
    kill (that many did not fit), else the count running now."""
    ceiling, why = (
        policy.memory_ceiling,
        (
            f"memory and schedulable resources hold {policy.memory_ceiling} replica(s)"
            if policy.memory_ceiling is not None
            else ""
        ),
    )
    if ceiling is not None and rss and policy.peak_bytes and rss > policy.peak_bytes * (1 + policy.memory_tolerance):
        lowered = max(math.floor(ceiling * policy.peak_bytes / rss), 1)
        if lowered < ceiling:
            ceiling, why = (
                lowered,
                f"replicas hold {rss / 2**20:,.0f} MiB against a calibrated peak of {policy.peak_bytes / 2**20:,.0f} "
                f"MiB, so memory holds {lowered} replica(s), not {policy.memory_ceiling}",
            )
    limit = killed_at - 1 if killed_at else current.target
    if kills and (ceiling is None or ceiling > limit):
        ceiling, why = (
            max(limit, 1),
            f"{kills} OOM kill(s) in the last {policy.oom_memory_s / 60:.0f} min"
            + (
                f" with {killed_at} replica(s) running: at most {max(limit, 1)} until memory is known to hold more"
                if killed_at
                else ": no replica is added to memory that is already short"
            ),
        )
    floor = max(policy.min_replicas, 1)
    if ceiling is not None and ceiling < floor:
        # Fewer replicas than the floor (none at all, when a node reads full under load) would turn
        # a memory shortage into an outage: the floor stays and the queue bound sheds the rest.
        ceiling, why = floor, f"{why}, fewer than min_replicas: the floor of {floor} stays"
    return ceiling, why


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _with(inputs: Inputs, **changes) -> Inputs:
    return Inputs(**{**asdict(inputs), **changes})
