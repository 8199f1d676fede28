"""Detectors: pure functions over a deployment's signal points (oldest first).

A point is a dict with `t` (epoch seconds) and any of p50/p95/p99 (ms), rps, errors, ongoing,
queued, starts (replica starts in the interval). Missing values are None."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise

LATENCY_FLOOR_MS = 250.0  # below this a p99 is never a spike, whatever the baseline
SPIKE_FACTOR = 3.0
SUSTAIN = 2  # consecutive points
MIN_BASELINE = 4


@dataclass(frozen=True)
class Finding:
    kind: str
    started_at: float
    peak: float
    baseline: float | None
    summary: str


def _values(points, key):
    return [p.get(key) for p in points if p.get(key) is not None]


def latency_spike(points: list[dict]) -> Finding | None:
    """p99 above max(floor, factor × rolling median p99) for SUSTAIN points with traffic."""
    if len(points) < SUSTAIN:
        return None
    recent, history = points[-SUSTAIN:], points[:-SUSTAIN]
    baseline_values = [p["p99"] for p in history if p.get("p99") is not None and (p.get("rps") or 0) > 0]
    baseline = statistics.median(baseline_values) if len(baseline_values) >= MIN_BASELINE else None
    limit = max(LATENCY_FLOOR_MS, SPIKE_FACTOR * baseline) if baseline is not None else LATENCY_FLOOR_MS * SPIKE_FACTOR
    if not all(p.get("p99") is not None and p["p99"] > limit and (p.get("rps") or 0) > 0 for p in recent):
        return None
    peak = max(p["p99"] for p in recent)
    base = f"{baseline:.0f} ms" if baseline is not None else "no baseline yet"
    return Finding(
        "latency_spike",
        recent[0]["t"],
        peak,
        baseline,
        f"p99 {peak:.0f} ms for {SUSTAIN} readings in a row (limit {limit:.0f} ms, baseline {base}).",
    )


def cold_start(points: list[dict], window: int = SUSTAIN + 1) -> bool:
    """Replicas started just before or during the recent readings (LAT-1)."""
    return any((p.get("starts") or 0) > 0 for p in points[-window:])


def queue_building(points: list[dict], window: int = 3) -> bool:
    """Queued requests grew at every recent reading and are not trivial (LAT-2)."""
    queued = [p.get("queued") or 0 for p in points[-window:]]
    return len(queued) == window and queued[-1] >= 2 and all(b > a for a, b in pairwise(queued))


def queue_buildup(points: list[dict], window: int = 3) -> Finding | None:
    """A queue growing at every reading: latency follows unless replicas are added (LAT-2)."""
    if not queue_building(points, window):
        return None
    recent = points[-window:]
    counts = " → ".join(str(round(p.get("queued") or 0)) for p in recent)
    return Finding(
        "queue_buildup",
        recent[0]["t"],
        recent[-1]["queued"],
        None,
        f"Queued requests grew {counts} over {window} readings.",
    )


PRESSURE_LIMIT = 0.9


def memory_pressure(
    points: list[dict], key: str = "mem", limit: float = PRESSURE_LIMIT, sustain: int = SUSTAIN
) -> Finding | None:
    """A node's memory (or GPU memory) at or above `limit` for `sustain` readings."""
    recent = points[-sustain:]
    if len(recent) < sustain or not all(p.get(key) is not None and p[key] >= limit for p in recent):
        return None
    peak = max(p[key] for p in recent)
    what = "GPU memory" if key == "gpu" else "memory"
    return Finding(
        "memory_pressure",
        recent[0]["t"],
        peak,
        None,
        f"Node {what} at {peak:.0%} for {sustain} readings (limit {limit:.0%}).",
    )


def memory_ratchet(
    points: list[dict], key: str = "mem", *, min_hours: float = 2.0, min_growth: float = 0.1
) -> Finding | None:
    """Memory that only grows, over hours, by at least `min_growth` of the node (OOM-5). Dips of
    under one percent count as flat: allocators give a little back and take it again."""
    series = [(p["t"], p[key]) for p in points if p.get(key) is not None]
    if len(series) < 3 or series[-1][0] - series[0][0] < min_hours * 3600:
        return None
    values = [v for _, v in series]
    if any(b < a - 0.01 for a, b in pairwise(values)) or values[-1] - values[0] < min_growth:
        return None
    hours = (series[-1][0] - series[0][0]) / 3600
    return Finding(
        "memory_ratchet",
        series[0][0],
        values[-1],
        values[0],
        f"Node memory rose from {values[0]:.0%} to {values[-1]:.0%} over {hours:.1f} h without coming back down.",
    )


# The KV cache counts as full from here: vLLM then queues new sequences or preempts running ones.
KV_FULL = 0.95
STUCK_READINGS = 3


def engine_stuck(points: list[dict], readings: int = STUCK_READINGS) -> Finding | None:
    """A serve.llm engine with requests waiting and no token generated for `readings` readings in a
    row: its engine core is dead or wedged while the replica's health check still answers 200."""
    recent = points[-readings:]
    if len(recent) < readings or not all((p.get("llm_waiting") or 0) > 0 and p.get("gen_tokens") == 0 for p in recent):
        return None
    waiting = max(p["llm_waiting"] for p in recent)
    seconds = sum(p.get("seconds") or 0 for p in recent)
    return Finding(
        "engine_stuck",
        recent[0]["t"],
        waiting,
        None,
        f"{waiting:.0f} request(s) waiting in the engine and no token generated for {readings} readings "
        f"({seconds:.0f} s), while Serve reports the replica healthy.",
    )
