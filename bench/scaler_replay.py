"""What R11's replay costs the request that starts or re-plans a wizard.

    .venv/bin/python bench/scaler_replay.py [--runs 5]

A deployment's signal window as it stands after a day: 288 five-minute summaries, then an hour of
raw 30 s readings with a burst every ten minutes. The replay (apps.remediation.scaler_replay.compare)
reads the last hour; the baseline replays the whole day second by second, as it did before the cap.
No Ray, no database."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.remediation import scaler_replay


def window() -> list[dict]:
    points, t = [], 0.0
    for i in range(288):
        t += 300
        points.append({"t": t, "seconds": 300.0, "http": 300.0 * (6 if i % 7 == 0 else 1)})
    for i in range(120):
        t += 30
        points.append({"t": t, "seconds": 30.0, "http": 30.0 * (9 if i % 20 < 2 else 1)})
    return points


def replay(load) -> dict | None:
    return scaler_replay.compare(
        load,
        concurrency=2,
        service_s=1.0,
        min_replicas=1,
        max_replicas=4,
        peak_bytes=None,
        queue_bound=8,
        latency_objective_ms=10_000,
        autoscaling={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2, "upscale_delay_s": 5},
        reading_s=30.0,
        start_s=20.0,
    )


def timed(runs: int, cap: float) -> tuple[float, dict | None]:
    scaler_replay.MAX_REPLAY_S = cap
    load = scaler_replay.rates(window())
    seconds, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = replay(load)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cap = scaler_replay.MAX_REPLAY_S
    whole, day = timed(args.runs, float("inf"))
    capped, hour = timed(args.runs, cap)
    scaler_replay.MAX_REPLAY_S = cap
    assert day is not None and hour is not None
    print(f"{'replay':<32}{'median s':>10}{'replayed s':>12}{'ratio to baseline':>20}")
    print(f"{'baseline: the whole day':<32}{whole:>10.3f}{day['seconds']:>12,}{1:>20.2f}")
    print(f"{'the last hour (MAX_REPLAY_S)':<32}{capped:>10.3f}{hour['seconds']:>12,}{capped / whole:>20.3f}")
    print(f"scaler over the hour: {hour['scaler']}\nServe over the hour:  {hour['serve']}")


if __name__ == "__main__":
    main()
