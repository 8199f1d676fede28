"""The operator's objectives (p99 at the client, share of failed requests) and what each one costs.

The latency objective sizes the queue bound (R10): a tight one sheds load with 503 that a looser one would have
served late. It is the operator's to state, so a wizard suggests one with its reason (what clients saw before
the incident, the calibrated service time) and prices a few around it: for each, the queue bound, the share of
the incident's busiest load that would be shed, and the p99 the queued requests would see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

# A request queued behind the bound must still finish inside this share of the objective: service under load runs
# slower than calibrated.
LATENCY_MARGIN = 0.8
MAX_QUEUE_BOUND = 10_000
# The failure objective when nothing better is known: verification's tolerance since it was introduced.
DEFAULT_FAILURE = 0.05
DEFAULT_LATENCY_MS = 10_000
# Above what clients saw before the incident: p99 wanders, and an objective they already missed half the time
# would fail verification on a healthy service.
BEFORE_HEADROOM = 1.25
# The objective's smallest sensible multiple of one request's service time: a queue of about one request per slot.
SERVICE_MULTIPLE = 2.5
STEP_MS = 500
# An incident's lead-up (the load rising, queues growing, latency climbing towards the kill) is part of
# it, not what clients saw before it: readings this close to its start are left out. A benchmark's
# first OOM showed the proxy's p99 at 59.6 s in the readings just before the kill, and an objective
# of 74.5 s suggested from them.
LEAD_UP_S = 300
PRICE_FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)


class Stated(TypedDict):
    """The objectives as a wizard's diagnosis keeps them."""

    latency_objective_ms: int
    failure_objective: float
    failure_percent: float
    reasons: dict[str, str]  # by objective: where a suggested one came from
    given: dict[str, bool]  # by objective: the operator's (True) or suggested


@dataclass(frozen=True)
class Objectives:
    latency_ms: int
    failure: float
    latency_reason: str
    failure_reason: str
    latency_given: bool = False
    failure_given: bool = False

    @property
    def suggested(self) -> bool:
        return not (self.latency_given and self.failure_given)

    def as_dict(self) -> Stated:
        return {
            "latency_objective_ms": self.latency_ms,
            "failure_objective": self.failure,
            "failure_percent": round(self.failure * 100, 2),
            "reasons": {"latency_objective_ms": self.latency_reason, "failure_objective": self.failure_reason},
            "given": {"latency_objective_ms": self.latency_given, "failure_objective": self.failure_given},
        }

    def note(self) -> str:
        """What every value sized from these objectives says about where they come from."""
        latency = f"p99 {self.latency_ms / 1000:g} s ({'given' if self.latency_given else self.latency_reason})"
        failure = f"{self.failure:.0%} failed at most ({'given' if self.failure_given else self.failure_reason})"
        if not self.suggested:
            return f"Objectives given: {latency}, {failure}."
        return f"Objectives suggested where none was given: {latency}, {failure}. State yours to size for them."


def chosen(suggestion: Objectives, latency_ms: int | None, failure: float | None) -> Objectives:
    """The operator's objectives where given, the suggestion's elsewhere."""
    return Objectives(
        latency_ms if latency_ms is not None else suggestion.latency_ms,
        failure if failure is not None else suggestion.failure,
        "given by the operator" if latency_ms is not None else suggestion.latency_reason,
        "given by the operator" if failure is not None else suggestion.failure_reason,
        latency_given=latency_ms is not None,
        failure_given=failure is not None,
    )


def queue_for(slots: int, service_s: float, objective_ms: int) -> tuple[int, float, float]:
    """The queue bound whose last request still finishes within the margin of the objective: (bound, the wait
    it allows in seconds, the slots' throughput in requests per second)."""
    throughput = slots / service_s
    wait_s = LATENCY_MARGIN * objective_ms / 1000 - service_s
    bound = max(1, min(MAX_QUEUE_BOUND, int(throughput * wait_s))) if wait_s > 0 else 1
    return bound, wait_s, throughput


def _round_up(ms: float) -> int:
    return int(math.ceil(ms / STEP_MS) * STEP_MS)


def before_incident(points: list[dict], started_at: float | None) -> tuple[float | None, float | None]:
    """The worst p99 clients saw at the proxy, and their failed share, in the readings before the
    incident's lead-up (LEAD_UP_S before `started_at`)."""
    before = [p for p in points if started_at is None or p.get("t", 0) < started_at - LEAD_UP_S]
    p99s = [p["http_p99"] for p in before if p.get("http_p99")]
    requests = sum(p.get("http") or 0 for p in before)
    failed = sum(sum((p.get("http_errors") or {}).values()) for p in before)
    return (max(p99s) if p99s else None), (failed / requests if requests else None)


def suggest(points: list[dict], started_at: float | None, service_s: float | None, service_source: str) -> Objectives:
    """Objectives for a deployment whose operator stated none, each with why."""
    p99_before, failed_before = before_incident(points, started_at)
    candidates = []
    if p99_before:
        candidates.append(
            (
                BEFORE_HEADROOM * p99_before,
                f"clients saw a p99 of {p99_before / 1000:.1f} s before the incident, plus {BEFORE_HEADROOM - 1:.0%}",
            )
        )
    else:
        # Without what clients saw, a tight objective would shed load nobody asked to shed: never below the default.
        candidates.append(
            (
                DEFAULT_LATENCY_MS,
                "Fleetdeck's default, since no client p99 was measured before the incident's "
                f"{LEAD_UP_S // 60}-minute lead-up",
            )
        )
    if service_s:
        candidates.append(
            (
                SERVICE_MULTIPLE * service_s * 1000,
                f"{SERVICE_MULTIPLE:g} x one request's {service_s:.1f} s "
                f"({service_source}), room to queue about one request per slot",
            )
        )
    value, latency_reason = max(candidates)
    latency = _round_up(value)
    if failed_before is not None and failed_before > 0:
        failure = min(DEFAULT_FAILURE, max(0.01, round(2 * failed_before, 3)))
        failure_reason = f"twice the {failed_before:.1%} of client requests that failed before the incident"
    else:
        failure = DEFAULT_FAILURE
        failure_reason = "verification's default tolerance"
    return Objectives(latency, failure, latency_reason, failure_reason)


def price(plan: dict | None, load: dict, objective_ms: int, service_s: float | None) -> list[dict]:
    """For objectives around the chosen one: the queue bound each sizes, the share of the incident's busiest
    moment it sheds with 503, and the p99 the last queued request would see. Empty without a service time."""
    if not plan or not service_s:
        return []
    slots = max(plan.get("replicas") or 1, 1) * max(plan.get("concurrency") or 1, 1)
    peak = load.get("peak_in_flight") or 0
    rows = []
    for factor in PRICE_FACTORS:
        objective = _round_up(objective_ms * factor)
        if objective <= service_s * 1000 or any(r["latency_objective_ms"] == objective for r in rows):
            continue
        bound, _, throughput = queue_for(slots, service_s, objective)
        queued = min(bound, max(peak - slots, 0))
        shed = max(peak - slots - bound, 0) / peak if peak else 0.0
        rows.append(
            {
                "latency_objective_ms": objective,
                "queue_bound": bound,
                "shed_share": round(shed, 4),
                "expected_p99_ms": round((service_s + queued / throughput) * 1000),
                "chosen": objective == objective_ms,
            }
        )
    return rows
