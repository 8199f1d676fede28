"""The choice behind the computed values: among the concurrencies the calibration measured, the
one whose replicas, as many as memory and schedulable resources allow, serve the most requests per
second (c / service time per replica); ties go to the lower concurrency, whose peak is lower.
Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.remediation.measurements import Budget, Memory
from apps.remediation.schedulable import Resources

# Throughputs this close to the best are the same within what a calibration can tell apart.
EQUIVALENT = 0.95


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


def choose(memory: Memory, budget: Budget, resources: Resources | None, latency_objective_ms: int) -> Plan:
    """The concurrency whose replicas, as many as memory and resources hold, serve the most
    requests per second. Only measured concurrencies are candidates (past them the curve is a
    guess); a token-sum curve, which measures no concurrency, offers 1 and 2."""
    levels = memory.measured_levels or [1, 2]
    by_resources, resource = resources.replicas() if resources is not None else (None, "")
    candidates: list[dict[str, Any]] = []  # the rows Plan.as_dict shows, one per concurrency
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
