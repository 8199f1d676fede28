"""Precision and recall of the latency-spike detector on synthetic traces.

    .venv/bin/python bench/detector_quality.py [--traces 2000] [--seed 1]

Each trace is a deployment's p99 readings (30 s apart) with a known answer: true spikes (a
sustained rise of 2-40x, some borderline), and the look-alikes that must stay quiet (noise, one slow reading, a
deploy with replica starts but no slowdown, a restart without traffic, a slow rise under the
floor). The baseline is a naive detector: last reading above 3x the median."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.incidents import detectors


def trace(rng: random.Random, kind: str) -> list[dict]:
    base = rng.uniform(40, 400)
    n = rng.randint(8, 30)
    points = [
        {
            "t": 30.0 * i,
            "p99": max(1.0, rng.gauss(base, base * 0.25)),
            "rps": rng.uniform(1, 50),
            "starts": 0,
            "queued": 0,
        }
        for i in range(n)
    ]
    for p in rng.sample(points[:-2], k=min(2, n - 2)):
        p["p99"] *= rng.uniform(2, 6)  # isolated outliers in the history
    if kind == "spike":
        # Some "spikes" are borderline (2-3x): a person would argue about them, and so may the detector.
        factor = rng.uniform(2, 40)
        for p in points[-2:]:
            p["p99"] = max(base * factor * rng.uniform(0.8, 1.2), 300.0)
    elif kind == "single":
        points[-1]["p99"] = base * rng.uniform(5, 30)
    elif kind == "deploy":
        points[-2]["starts"] = 1
    elif kind == "restart":
        for p in points[-2:]:
            p["rps"], p["p99"] = 0.0, base * 10
    elif kind == "creep":
        for _i, p in enumerate(points[-2:]):
            p["p99"] = min(base * 1.8, 240.0)
    return points


def naive(points: list[dict]) -> bool:
    """Last reading above 3x the median: no floor, no sustain, no traffic check."""
    values = sorted(p["p99"] for p in points)
    return points[-1]["p99"] > 3 * values[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = ["spike"] * 4 + ["noise", "single", "deploy", "restart", "creep"]
    scores = {"detector": [0, 0, 0], "naive baseline": [0, 0, 0]}  # tp, fp, fn
    for _ in range(args.traces):
        kind = rng.choice(kinds)
        points = trace(rng, kind)
        for name, fired in (
            ("detector", detectors.latency_spike(points) is not None),
            ("naive baseline", naive(points)),
        ):
            positive = kind == "spike"
            scores[name][0] += fired and positive
            scores[name][1] += fired and not positive
            scores[name][2] += positive and not fired
    results = {}
    for name, (tp, fp, fn) in scores.items():
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        results[name] = (precision, recall)
        print(f"{name:15s} precision {precision:.3f}  recall {recall:.3f}  (tp {tp}, fp {fp}, fn {fn})")
    (dp, dr), (bp, br) = results["detector"], results["naive baseline"]
    print(
        f"ratio to baseline: precision x{dp / bp:.2f}, recall x{dr / br:.2f}" if bp and br else "baseline scored zero"
    )


if __name__ == "__main__":
    main()
