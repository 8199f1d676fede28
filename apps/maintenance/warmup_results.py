"""What a warmup's responses say: the cold first request apart from the steady state, and a verdict."""

from __future__ import annotations

import math
import statistics

from integrations import serve_http


def summarize(samples: list[serve_http.Sample], p95_threshold_ms: float | None) -> dict:
    latencies = [s.latency_ms for s in samples]
    steady = latencies[1:] or latencies
    errors = [s for s in samples if not s.ok]
    p95 = _percentile(steady, 95)
    problems = []
    if errors:
        problems.append(f"{len(errors)} of {len(samples)} responses were not 2xx")
    if p95_threshold_ms is not None and p95 > p95_threshold_ms:
        problems.append(f"p95 {p95:.0f} ms is above {p95_threshold_ms:.0f} ms")
    return {
        "samples": [
            {"i": s.index, "status": s.status, "ms": round(s.latency_ms, 2), "error": s.error} for s in samples
        ],
        "first_ms": round(latencies[0], 2) if latencies else None,
        "steady_p50_ms": round(statistics.median(steady), 2) if steady else None,
        "steady_p95_ms": round(p95, 2),
        "max_ms": round(max(latencies), 2) if latencies else None,
        "errors": len(errors),
        "passed": not problems,
        "verdict": "Passed: all responses 2xx" + (f", p95 {p95:.0f} ms" if latencies else "")
        if not problems
        else "Failed: " + "; ".join(problems) + ".",
    }


def _percentile(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]
