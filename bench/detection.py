"""Detection: how well each detector separates real trouble from look-alikes, and how fast a
real OOM kill and a real latency spike on a live Ray cluster become incidents.

    .venv/bin/python bench/detection.py [--traces 2000] [--interval 10] [--trials 2] [--quick]

Part 1 (pure, seconds): labelled synthetic traces per detector in apps/incidents/detectors.py,
each scored against a naive baseline.
- latency spike: bench/detector_quality.py's traces and baseline (last reading > 3x median).
- queue build-up: a deployment's queued-requests gauge every 30 s, sampled with Poisson noise
  around the true queue. Positive: arrivals outrun the replicas, so the true queue grows for the
  last 3-6 readings. Negative: a steady queue at any level, a burst that is already draining, a
  step up that stays flat. Baseline: last reading at least twice the median (and >= 2).
- memory pressure: a node's memory fraction every 30 s with measurement noise. Positive: the
  true usage is >= 90 % for the last 2+ readings. Negative: a single high reading, usage
  hovering just under 90 %, normal usage. Baseline: last reading >= 90 %.
- memory ratchet: 2.5-6 h of readings every 30 s, compacted by the product's own
  `metric_readings.compact` (raw last hour, 5-minute maxima before). Positive: a leak (steady growth of
  10-40 % of the node). Negative: a sawtooth that comes back (GC, recycles), a single step up
  (a model or cache loaded once), flat. Baseline: grew >= 10 % over >= 2 h.

Part 2 (real Ray 2.60 head on loopback, a few minutes): a loop runs the worker's
`fleet.sync_cluster` task (sync, OOM detection from the state API, a metrics reading, findings)
every --interval seconds, as the periodic sync would, against a private head whose memory
monitor trips just above current usage (stopped at the end by its own process ids). Detection
latency is the time from the event to the incident's detected/extended row:
- OOM kill: the event is Ray's own kill (the raylet's "Killing N worker(s)" log line);
- latency spike: the event is the start of a burst that saturates a single replica after a
  baseline of light traffic (also reported: from the first request slower than the detector's limit).
Both are reported in seconds and as a multiple of the interval (the product's sync interval).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from apps.fleet import metric_readings  # noqa: E402
from apps.incidents import detectors  # noqa: E402
from bench import detector_quality  # noqa: E402
from bench.scratch_db import scratch_database  # noqa: E402

# --- part 1: labelled synthetic traces ---------------------------------------------------------


def poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def queue_trace(rng: random.Random, kind: str) -> list[dict]:
    n, level = rng.randint(8, 20), rng.choice([0.0, rng.uniform(0, 3), rng.uniform(3, 30)])
    true = [level] * n
    if kind == "buildup":
        rate, k = rng.uniform(1, 15), rng.randint(3, 6)
        for j in range(k):
            true[n - k + j] = level + rate * (j + 1)
    elif kind == "draining":
        peak = level + rng.uniform(10, 80)
        true[-2], true[-1] = peak, level + (peak - level) * rng.uniform(0.1, 0.6)
    elif kind == "step":
        step = rng.uniform(3, 20)
        for j in range(rng.randint(3, 6)):
            true[n - 1 - j] = level + step
    return [{"t": 30.0 * i, "queued": poisson(rng, q), "rps": 10.0} for i, q in enumerate(true)]


def naive_queue(points: list[dict]) -> bool:
    queued = [p["queued"] for p in points]
    return queued[-1] >= max(2, 2 * statistics.median(queued))


def pressure_trace(rng: random.Random, kind: str) -> list[dict]:
    n, noise = 20, rng.uniform(0.002, 0.02)
    true = [rng.uniform(0.3, 0.8)] * n
    if kind == "pressure":
        for j in range(rng.randint(2, 8)):
            true[n - 1 - j] = rng.uniform(0.9, 0.99)
    elif kind == "blip":
        true[-1] = rng.uniform(0.9, 0.99)
    elif kind == "hovering":
        true = [rng.uniform(0.85, 0.9)] * n
    return [{"t": 30.0 * i, "mem": min(1.0, max(0.0, m + rng.gauss(0, noise)))} for i, m in enumerate(true)]


def naive_pressure(points: list[dict]) -> bool:
    return points[-1]["mem"] >= detectors.PRESSURE_LIMIT


def ratchet_trace(rng: random.Random, kind: str) -> list[dict]:
    hours, noise, start = rng.uniform(2.5, 6), rng.uniform(0.0005, 0.006), rng.uniform(0.2, 0.5)
    n = int(hours * 120)
    if kind == "leak":
        growth = rng.uniform(0.1, 0.4)
        true = [start + growth * i / n for i in range(n)]
    elif kind == "sawtooth":
        period, rise = rng.randint(120, 240), rng.uniform(0.05, 0.2)
        true = [start + rise * (i % period) / period for i in range(n)]
    elif kind == "step":
        at, step = rng.randint(n // 10, n - 60), rng.uniform(0.1, 0.3)
        true = [start + (step if i >= at else 0.0) for i in range(n)]
    else:
        true = [start] * n
    raw = [{"t": 30.0 * i, "mem": min(1.0, max(0.0, m + rng.gauss(0, noise)))} for i, m in enumerate(true)]
    return metric_readings.compact(raw, now=raw[-1]["t"])


def naive_ratchet(points: list[dict]) -> bool:
    values = [p["mem"] for p in points]
    return points[-1]["t"] - points[0]["t"] >= 2 * 3600 and values[-1] - values[0] >= 0.1


CASES = {
    # name: (trace generator, kinds with positives first, number of positive kinds, detector, baseline)
    "latency spike": (
        detector_quality.trace,
        ["spike", "noise", "single", "deploy", "restart", "creep"],
        1,
        lambda p: detectors.latency_spike(p) is not None,
        detector_quality.naive,
    ),
    "queue build-up": (
        queue_trace,
        ["buildup", "steady", "draining", "step"],
        1,
        lambda p: detectors.queue_buildup(p) is not None,
        naive_queue,
    ),
    "memory pressure": (
        pressure_trace,
        ["pressure", "normal", "blip", "hovering"],
        1,
        lambda p: detectors.memory_pressure(p) is not None,
        naive_pressure,
    ),
    "memory ratchet": (
        ratchet_trace,
        ["leak", "flat", "sawtooth", "step"],
        1,
        lambda p: detectors.memory_ratchet(p) is not None,
        naive_ratchet,
    ),
}


def score(traces: int, seed: int) -> dict[str, dict]:
    results = {}
    for name, (make, kinds, positives, detector, baseline) in CASES.items():
        rng = random.Random(seed)
        # Half the traces are positives, the rest spread evenly over the look-alikes.
        weights = [(len(kinds) - positives) / positives if k < positives else 1 for k in range(len(kinds))]
        counts = {"detector": [0, 0, 0], "baseline": [0, 0, 0]}
        misses: dict[str, int] = {}
        for _ in range(traces):
            kind = rng.choices(kinds, weights)[0]
            points = make(rng, kind)
            positive = kinds.index(kind) < positives
            for who, fired in (("detector", detector(points)), ("baseline", baseline(points))):
                tp, fp, fn = counts[who]
                counts[who] = [tp + (fired and positive), fp + (fired and not positive), fn + (positive and not fired)]
                if who == "detector" and fired != positive:
                    misses[kind] = misses.get(kind, 0) + 1
        results[name] = {who: (*_pr(*c), c) for who, c in counts.items()} | {"wrong": misses}
    return results


def _pr(tp: int, fp: int, fn: int) -> tuple[float, float]:
    return (tp / (tp + fp) if tp + fp else 0.0), (tp / (tp + fn) if tp + fn else 0.0)


# --- part 2: a real cluster --------------------------------------------------------------------


KILL_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) [^\]]*\] \(raylet\) node_manager\.cc:\d+: Killing \d+ worker"
)


def raylet_kills(head) -> list[float]:
    """Epoch times of the memory monitor's kills, from the raylet's log (local time)."""
    kills = []
    for log in head.temp_dir.glob("session_*/logs/raylet.out"):
        for line in log.read_text(errors="replace").splitlines():
            if match := KILL_LINE.match(line):
                kills.append(datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return sorted(kills)


class SyncLoop(threading.Thread):
    """The periodic sync of one cluster, as beat and a worker run it, at a fixed interval."""

    def __init__(self, cluster_id: int, interval: float):
        super().__init__(daemon=True)
        self.cluster_id, self.interval, self.halt = cluster_id, interval, threading.Event()

    def run(self) -> None:
        from django.db import connection

        from workers import tasks

        due = time.monotonic()
        try:
            while not self.halt.is_set():
                tasks.sync_cluster(self.cluster_id)
                due += self.interval
                self.halt.wait(max(0.0, due - time.monotonic()))
        finally:
            connection.close()


def first_signal_after(kind: str, since: float, timeout_s: float) -> float | None:
    """Epoch time of the first detected/extended row of a `kind` incident written after `since`."""
    from apps.incidents.models import IncidentEvent

    deadline = time.monotonic() + timeout_s
    after = datetime.fromtimestamp(since, UTC)
    while time.monotonic() < deadline:
        event = (
            IncidentEvent.objects.filter(incident__kind=kind, kind__in=["detected", "extended"], at__gt=after)
            .order_by("at")
            .first()
        )
        if event is not None:
            return event.at.timestamp()
        time.sleep(0.2)
    return None


def demo_only(model: dict) -> dict:
    from apps.demo.local_ray import DEMO_APP_DIR

    config = json.loads((REPO / "tests/fixtures/ray/put_config_demo_and_echo2.json").read_text())
    config["applications"] = config["applications"][:1]
    config["applications"][0]["runtime_env"]["env_vars"]["PYTHONPATH"] = str(DEMO_APP_DIR)
    target = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")
    target.update(copy.deepcopy(model))
    return config


def oom_trial(head, timeout_s: float) -> dict:
    import httpx

    head.deploy(demo_only({"user_config": {"alloc_mb": 4096, "hold_s": 20}}))
    started = time.time()
    failed_at: list[float] = []

    def hog() -> None:
        try:
            status = httpx.get(f"{head.serve_url}/demo?text=big", timeout=60).status_code
        except httpx.HTTPError:
            status = 0
        if status != 200:
            failed_at.append(time.time())

    threading.Thread(target=hog, daemon=True).start()
    detected = first_signal_after("oom_kill", started, timeout_s)
    kills = [t for t in raylet_kills(head) if t >= started - 1]
    event = kills[0] if kills else (failed_at[0] if failed_at else None)
    head.deploy(demo_only({"user_config": {"alloc_mb": 0, "hold_s": 0.05}}), timeout_s=180)
    return {"event": event, "detected": detected, "from": "raylet kill" if kills else "first failed request"}


def latency_trial(head, interval: float, timeout_s: float) -> dict:
    import httpx

    model = {
        "user_config": {"alloc_mb": 0, "hold_s": 0.2},
        "max_ongoing_requests": 8,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 4},
    }
    head.deploy(demo_only(model))
    halt, burst = threading.Event(), threading.Event()
    latencies: list[tuple[float, float]] = []  # (completed at, seconds)

    def client(always: bool) -> None:
        with httpx.Client(timeout=60) as http:
            while not halt.is_set():
                if not always and not burst.is_set():
                    time.sleep(0.05)
                    continue
                sent = time.time()
                with contextlib.suppress(httpx.HTTPError):
                    http.get(f"{head.serve_url}/demo?text=load")
                latencies.append((time.time(), time.time() - sent))

    threads = [threading.Thread(target=client, args=(i < 2,), daemon=True) for i in range(34)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(interval * (detectors.MIN_BASELINE + detectors.SUSTAIN + 1))  # baseline readings with traffic
        baseline = statistics.quantiles([s for _, s in latencies], n=100)[98]
        started = time.time()
        burst.set()
        detected = first_signal_after("latency_spike", started, timeout_s)
    finally:
        halt.set()
        for thread in threads:
            thread.join(timeout=70)
    limit = max(detectors.LATENCY_FLOOR_MS / 1000, detectors.SPIKE_FACTOR * baseline)
    slow = [done for done, seconds in latencies if done >= started and seconds > limit]
    return {
        "event": started,
        "detected": detected,
        "first_slow": min(slow) if slow else None,
        "baseline_p99_s": baseline,
        "limit_s": limit,
    }


def real_cluster(interval: float, trials: int, timeout_s: float) -> dict:
    var = tempfile.mkdtemp(prefix="fleetdeck-bench-var-")
    with scratch_database("detect") as (url, engine):
        os.environ.update(
            {
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                "FLEETDECK_DEBUG": "0",
                "FLEETDECK_ALLOW_DEV_SECRET": "1",
                # The simulated clusters listen on loopback: Fleetdeck calls only what its allow-list covers.
                "FLEETDECK_CLUSTER_NETWORKS": "127.0.0.0/8,::1/128",
                "FLEETDECK_LOG_LEVEL": "ERROR",
                "FLEETDECK_VAR_DIR": var,
            }
        )
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from apps.accounts.services import ensure_team
        from apps.clusters.models import Cluster
        from apps.demo.local_ray import LocalRayHead, memory_monitor_env, threshold_for_headroom

        call_command("migrate", verbosity=0)
        # Room for the head and the demo (~1.5 GiB); a request that fills 4 GiB trips the monitor.
        threshold = threshold_for_headroom(2.5)
        head = LocalRayHead.start(extra_env=memory_monitor_env(threshold))
        loop = None
        try:
            head.wait_ready()
            head.deploy(demo_only({"user_config": {"alloc_mb": 0, "hold_s": 0.05}}))
            cluster = Cluster.objects.create(
                name="detection-lab",
                team=ensure_team("Bench"),
                dashboard_url=head.dashboard_url,
                ray_version="2.60.0",
                metrics_url=f"http://127.0.0.1:{head.ports['metrics-export-port']}/metrics",
            )
            loop = SyncLoop(cluster.pk, interval)
            loop.start()
            ooms = [oom_trial(head, timeout_s) for _ in range(trials)]
            spikes = [latency_trial(head, interval, timeout_s) for _ in range(trials)]
        finally:
            if loop is not None:
                loop.halt.set()
                loop.join(timeout=60)
            head.stop()
            connection.close()
            shutil.rmtree(var, ignore_errors=True)
    return {"engine": engine, "threshold": threshold, "oom": ooms, "latency": spikes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=2000, help="synthetic traces per detector")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between syncs on the real cluster")
    parser.add_argument("--trials", type=int, default=2, help="OOM kills and latency spikes on the real cluster")
    parser.add_argument("--quick", action="store_true", help="one trial of each")
    parser.add_argument("--synthetic-only", action="store_true", help="skip the real cluster")
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, load average at start "
        f"{os.getloadavg()[0]:.2f} (other processes share these cores)"
    )
    print(f"\n{args.traces} labelled synthetic traces per detector (half positives), seed {args.seed}:")
    print(f"  {'':17s} {'detector':>17s}   {'naive baseline':>17s}   {'ratio to baseline':26s}  detector wrong on")
    print(
        f"  {'':17s} {'precision':>9s} {'recall':>7s}   {'precision':>9s} {'recall':>7s}   {'(precision, recall)':26s}"
    )
    for name, r in score(args.traces, args.seed).items():
        (dp, dr, _), (bp, br, _) = r["detector"], r["baseline"]
        ratio = f"x{dp / bp:.2f}, x{dr / br:.2f}" if bp and br else "baseline scored zero"
        wrong = (
            ", ".join(f"{kind} {count}" for kind, count in sorted(r["wrong"].items(), key=lambda kv: -kv[1]))
            or "nothing"
        )
        print(f"  {name:17s} {dp:9.3f} {dr:7.3f}   {bp:9.3f} {br:7.3f}   {ratio:26s}  {wrong}")
    if args.synthetic_only:
        return
    trials = 1 if args.quick else args.trials
    started = time.monotonic()
    real = real_cluster(args.interval, trials, timeout_s=max(180.0, 12 * args.interval))
    print(
        f"\nreal Ray 2.60 head on loopback ({real['engine']}; memory monitor at {real['threshold']:.1%} of the "
        f"node), sync + detect + metrics every {args.interval:g} s, {trials} trial(s) each, "
        f"{time.monotonic() - started:.0f} s:"
    )
    for label, rows in (("OOM kill", real["oom"]), ("latency spike", real["latency"])):
        for row in rows:
            if row["detected"] is None or row["event"] is None:
                print(f"  {label:14s} not detected within the timeout")
                continue
            latency = row["detected"] - row["event"]
            extra = ""
            if row.get("first_slow"):
                extra = (
                    f"; {row['detected'] - row['first_slow']:.1f} s after the first request over the limit "
                    f"({row['limit_s'] * 1000:.0f} ms, baseline p99 {row['baseline_p99_s'] * 1000:.0f} ms)"
                )
            source = row.get("from", "start of the burst")
            print(
                f"  {label:14s} {latency:6.1f} s from the {source} = {latency / args.interval:.2f} x the "
                f"interval{extra}"
            )


if __name__ == "__main__":
    main()
