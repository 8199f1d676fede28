"""The incident's load replayed through two ways of scaling the deployment: the scaler's own decision
function (apps.scaler.decision, the code that decides in production) and Serve's autoscaler with the
autoscaling_config R2 sizes. R11's reason quotes both, so an operator weighs the scaler on this
deployment's calibration and load, not on a promise. Pure.

A model, and its reason says so: arrivals are each reading's rate at the proxy (503s included) spread
evenly over its interval; a replica holds the calibrated concurrency and completes a request in the
calibrated service time; what finds no free slot waits in the queue up to the queue bound and is
shed past it (a failed request); a replica added starts serving `start_s` later. Neither arm can
OOM-kill: both stay within the replicas memory holds. What differs is how fast and how far each
follows the load, which is what shed requests, p99 and replica-seconds show."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from apps.scaler.decision import Current, Kind, Policy, Sample, Signals, decide

TICK_S = 1.0
# Too few readings to replay anything but noise.
MIN_READINGS = 3
# The last hour of readings (the window's raw ones, where an incident is): a day replayed second by
# second costs seconds of a web request, and its 5-minute summaries smooth away the bursts anyway.
MAX_REPLAY_S = 3600.0
# Serve's autoscaler: replicas report every 10 s (metrics_interval_s), averaged over look_back_period_s.
SERVE_METRICS_S = 10.0
SERVE_DEFAULTS = {"upscale_delay_s": 30.0, "downscale_delay_s": 600.0, "look_back_period_s": 30.0}


@dataclass
class Outcome:
    arrived: float = 0.0
    shed: float = 0.0
    replica_seconds: float = 0.0
    peak_replicas: int = 0
    reversals: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (seconds, requests)

    @property
    def failed_share(self) -> float:
        return self.shed / self.arrived if self.arrived else 0.0

    @property
    def p99_s(self) -> float | None:
        served = sorted(self.latencies)
        total = sum(n for _, n in served)
        if not total:
            return None
        seen = 0.0
        for seconds, n in served:
            seen += n
            if seen >= 0.99 * total:
                return seconds
        return served[-1][0]

    def as_dict(self) -> dict:
        p99 = self.p99_s
        return {
            "arrived": round(self.arrived),
            "failed": round(self.shed),
            "failed_share": round(self.failed_share, 4),
            "p99_s": round(p99, 2) if p99 is not None else None,
            "replica_seconds": round(self.replica_seconds),
            "peak_replicas": self.peak_replicas,
            "reversals": self.reversals,
        }


def rates(points: list[dict]) -> list[tuple[float, float, float]]:
    """(start, end, requests per second) of each reading: what arrived at the proxy (503s included)
    where the proxy reports it, else what the deployment counted."""
    out = []
    for p in points:
        seconds, t = p.get("seconds"), p.get("t")
        if not isinstance(t, (int, float)) or not seconds:
            continue
        arrived = p["http"] / seconds if isinstance(p.get("http"), (int, float)) else p.get("rps")
        if isinstance(arrived, (int, float)):
            out.append((t - seconds, t, max(arrived, 0.0)))
    return sorted(out)


class _Fleet:
    """Replicas, their slots and the queue, advanced a tick at a time."""

    def __init__(self, replicas: int, concurrency: int, service_s: float, queue_bound: int | None, start_s: float):
        self.running = replicas
        self.starting: list[float] = []  # ready times of replicas not yet serving
        self.concurrency, self.service_s, self.start_s = concurrency, service_s, start_s
        self.bound = math.inf if queue_bound is None or queue_bound < 0 else queue_bound
        self.in_flight = self.queue = 0.0
        self.outcome = Outcome(peak_replicas=replicas)

    @property
    def target(self) -> int:
        return self.running + len(self.starting)

    def scale_to(self, target: int, now: float) -> None:
        while self.target < target:
            self.starting.append(now + self.start_s)
        while self.target > target:
            if self.starting:
                self.starting.pop()  # the newest request for a replica goes first
            else:
                self.running -= 1

    def tick(self, now: float, rate: float) -> tuple[float, float]:
        """One tick of `rate` arrivals a second; returns (arrived, shed) in it."""
        ready = [at for at in self.starting if at <= now]
        self.running += len(ready)
        self.starting = [at for at in self.starting if at > now]
        slots = self.running * self.concurrency
        self.in_flight -= min(self.in_flight, self.in_flight * TICK_S / self.service_s)
        moved = min(self.queue, max(slots - self.in_flight, 0.0))
        self.queue, self.in_flight = self.queue - moved, self.in_flight + moved
        arrived = rate * TICK_S
        admitted = min(arrived, max(slots - self.in_flight, 0.0))
        self.in_flight += admitted
        waiting = min(arrived - admitted, max(self.bound - self.queue, 0.0))
        shed = arrived - admitted - waiting
        self.queue += waiting
        if admitted:
            self.outcome.latencies.append((self.service_s, admitted))
        if waiting:
            throughput = slots / self.service_s
            wait = self.queue / throughput if throughput else 3600.0
            self.outcome.latencies.append((wait + self.service_s, waiting))
        self.outcome.arrived += arrived
        self.outcome.shed += shed
        self.outcome.replica_seconds += self.target * TICK_S
        self.outcome.peak_replicas = max(self.outcome.peak_replicas, self.target)
        return arrived, shed


def _timeline(load: list[tuple[float, float, float]]):
    """(now, rate) for every tick from the first reading's start to the last one's end."""
    start, end = load[0][0], load[-1][1]
    index = 0
    for step in range(int((end - start) / TICK_S)):
        now = start + step * TICK_S
        while index < len(load) - 1 and now >= load[index][1]:
            index += 1
        low, high, rate = load[index]
        yield now, rate if low <= now < high else 0.0


def replay_scaler(load, policy: Policy, *, replicas: int, reading_s: float, start_s: float) -> Outcome:
    """The scaler deciding after every reading (`reading_s` apart), from the samples it would read."""
    fleet = _Fleet(replicas, policy.concurrency, policy.service_s, policy.queue_bound, start_s)
    samples: list[Sample] = []
    arrived = shed = 0.0
    next_reading = load[0][0] + reading_s if load else 0.0
    last_up, directions = None, []
    for now, rate in _timeline(load):
        a, s = fleet.tick(now, rate)
        arrived, shed = arrived + a, shed + s
        if now + TICK_S < next_reading:
            continue
        samples.append(Sample(now, fleet.in_flight, fleet.queue, arrived / reading_s, shed))
        arrived = shed = 0.0
        next_reading += reading_s
        current = Current(fleet.target, fleet.running, len(fleet.starting))
        decision = decide(
            Signals(now=now, samples=tuple(samples[-20:]), current=current, last_upscale_at=last_up), policy
        )
        # As apps.scaler.shadow sends it: any target that differs, but a hand-back's.
        if decision.kind != Kind.HAND_BACK and decision.target != fleet.target:
            directions.append(decision.target > fleet.target)
            if decision.target > fleet.target:
                last_up = now
            fleet.scale_to(decision.target, now)
    fleet.outcome.reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    return fleet.outcome


def replay_serve(
    load, autoscaling: dict, *, concurrency: int, service_s: float, queue_bound: int | None, start_s: float
) -> Outcome:
    """Serve's autoscaler with `autoscaling` (R2's autoscaling_config): the average of what replicas
    and the queue hold over look_back_period_s, divided by target_ongoing_requests, acted on once it
    has asked for more for upscale_delay_s (fewer: downscale_delay_s), within min and max replicas."""
    conf = SERVE_DEFAULTS | {k: v for k, v in autoscaling.items() if v is not None}
    low, high = int(conf.get("min_replicas") or 1), int(conf.get("max_replicas") or 1)
    per_replica = float(conf.get("target_ongoing_requests") or 2)
    fleet = _Fleet(low, concurrency, service_s, queue_bound, start_s)
    reported: list[tuple[float, float]] = []
    asked_since: tuple[int, float] | None = None  # (direction, since when)
    directions: list[bool] = []
    next_report = load[0][0] if load else 0.0
    for now, rate in _timeline(load):
        fleet.tick(now, rate)
        if now < next_report:
            continue
        next_report += SERVE_METRICS_S
        reported.append((now, fleet.in_flight + fleet.queue))
        reported = [(t, v) for t, v in reported if t >= now - conf["look_back_period_s"]]
        window = [v for _, v in reported]
        desired = min(max(math.ceil(sum(window) / len(window) / per_replica), low), high)
        direction = (desired > fleet.target) - (desired < fleet.target)
        if not direction:
            asked_since = None
            continue
        if asked_since is None or asked_since[0] != direction:
            asked_since = (direction, now)
        delay = conf["upscale_delay_s"] if direction > 0 else conf["downscale_delay_s"]
        if now - asked_since[1] >= delay:
            directions.append(direction > 0)
            fleet.scale_to(desired, now)
            asked_since = None
    fleet.outcome.reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    return fleet.outcome


def compare(
    load,
    *,
    concurrency: int,
    service_s: float,
    min_replicas: int,
    max_replicas: int,
    peak_bytes: int | None,
    queue_bound: int | None,
    latency_objective_ms: int | None,
    autoscaling: dict,
    reading_s: float,
    start_s: float,
) -> dict | None:
    """Both arms on the last MAX_REPLAY_S of `load` (rates()), the scaler within min..max replicas
    (max: what memory holds), starting at its min; None with fewer than MIN_READINGS readings."""
    load = [reading for reading in load if reading[1] > load[-1][1] - MAX_REPLAY_S] if load else []
    if len(load) < MIN_READINGS:
        return None
    policy = Policy(
        concurrency=concurrency,
        service_s=service_s,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        memory_ceiling=max_replicas,
        peak_bytes=peak_bytes,
        queue_bound=queue_bound,
        latency_objective_ms=latency_objective_ms,
    )
    scaler = replay_scaler(load, policy, replicas=min_replicas, reading_s=reading_s, start_s=start_s)
    serve = replay_serve(
        load, autoscaling, concurrency=concurrency, service_s=service_s, queue_bound=queue_bound, start_s=start_s
    )
    return {
        "scaler": scaler.as_dict(),
        "serve": serve.as_dict(),
        "start_s": start_s,
        "reading_s": reading_s,
        "seconds": round(load[-1][1] - load[0][0]),
    }
