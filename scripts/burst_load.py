"""Bursts of concurrent POSTs to one URL, then per-status counts, goodput and latency percentiles.

    .venv/bin/python scripts/burst_load.py http://127.0.0.1:PORT/reference [--bursts 6]
        [--burst-size 12] [--period-s 8] [--json '{"prompt": "… {n}", "max_tokens": 64}']

`{n}` anywhere in the body is replaced by each request's number, so an app that caches its answers
(the reference app does) computes every one: a load of cache hits tests nothing.

Closed loop: a burst starts once the previous one has finished and `--period-s` has passed since
it started, so at most `--burst-size` requests are ever in flight, and the run ends after
`--bursts` bursts: at most bursts × max(period, request timeout) seconds. It calls only the URL it
is given. Standalone (httpx and threads) so a newcomer can run it from the project's venv.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import httpx

DEFAULT_BODY = {"prompt": "request {n}: " + "x" * 186, "max_tokens": 64}
CALL_NUMBER = "{n}"


def burst(client: httpx.Client, url: str, body: str, size: int, first: int = 0) -> list[tuple[str, float]]:
    """`size` simultaneous POSTs of the JSON `body`, numbered from `first`; (status or error name, seconds) each."""
    results: list[tuple[str, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(size)
    bodies = iter([json.loads(body.replace(CALL_NUMBER, str(first + i))) for i in range(size)])

    def one() -> None:
        with lock:
            mine = next(bodies)
        start.wait()
        began = time.monotonic()
        try:
            outcome = str(client.post(url, json=mine).status_code)
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        with lock:
            results.append((outcome, time.monotonic() - began))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def summary(results: list[tuple[str, float]], elapsed_s: float) -> str:
    counts = Counter(outcome for outcome, _ in results)
    ok = sorted(seconds for outcome, seconds in results if outcome.startswith("2"))
    lines = [
        f"{len(results)} requests in {elapsed_s:.1f} s: "
        + ", ".join(f"{outcome} × {n}" for outcome, n in sorted(counts.items()))
    ]
    lines.append(
        f"goodput: {len(ok) / elapsed_s:.2f} successful requests/s ({len(ok) / len(results):.0%} succeeded)"
        if results
        else "goodput: no requests"
    )
    if ok:
        lines.append(f"latency of successes: p50 {statistics.median(ok):.2f} s, p99 {percentile(ok, 0.99):.2f} s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="The endpoint to POST to, e.g. the reference app's URL that `make run` prints.")
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--burst-size", type=int, default=12, help="Simultaneous requests per burst.")
    parser.add_argument(
        "--period-s", type=float, default=8.0, help="Seconds from one burst's start to the next's, at least."
    )
    parser.add_argument("--json", default=json.dumps(DEFAULT_BODY), help="The request body (JSON).")
    parser.add_argument(
        "--timeout-s", type=float, default=60.0, help="Per request; a request past it counts as ReadTimeout."
    )
    args = parser.parse_args(argv)
    if urlsplit(args.url).scheme not in ("http", "https") or not urlsplit(args.url).hostname:
        parser.error(f"the URL must be http(s)://host[:port]/path, not {args.url!r}")
    if args.bursts < 1 or args.burst_size < 1 or args.period_s < 0 or args.timeout_s <= 0:
        parser.error("--bursts and --burst-size must be at least 1, --period-s at least 0 and --timeout-s more than 0")
    try:
        json.loads(args.json.replace(CALL_NUMBER, "0"))
    except json.JSONDecodeError as exc:
        parser.error(f"--json is not JSON: {exc}")
    args.body = args.json
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[tuple[str, float]] = []
    started = time.monotonic()
    limits = httpx.Limits(max_connections=args.burst_size, max_keepalive_connections=args.burst_size)
    with httpx.Client(timeout=args.timeout_s, limits=limits) as client:
        try:
            began = started
            for number in range(1, args.bursts + 1):
                if number > 1:
                    time.sleep(max(0.0, began + args.period_s - time.monotonic()))
                began = time.monotonic()
                outcomes = burst(client, args.url, args.body, args.burst_size, first=len(results))
                results += outcomes
                counts = Counter(outcome for outcome, _ in outcomes)
                print(
                    f"burst {number}/{args.bursts} at {began - started:5.1f} s: "
                    + ", ".join(f"{outcome} × {n}" for outcome, n in sorted(counts.items())),
                    flush=True,
                )
        except KeyboardInterrupt:
            print("interrupted: the figures below cover the finished bursts", file=sys.stderr)
    print(summary(results, time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
