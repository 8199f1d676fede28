"""Fleet sync at scale: the worker's periodic sync against N fake Ray dashboards on loopback.

    .venv/bin/python bench/fleet_sync.py [--clusters 100,1000] [--pool prefork|threads] [--workers 2] [--quick]

For each N, in a scratch database (a new PostgreSQL database on the server DATABASE_URL names,
dropped at the end; else a throwaway SQLite file) and a fresh worker process: N clusters are
registered, the fake fleet (bench/fake_fleet.py) serves their dashboards, and each cycle runs
what beat and the worker run: the tick's claim (`due_syncs`), then the worker task
`fleet.sync_batch` for every batch of FLEETDECK_SYNC_BATCH claimed clusters (sync, OOM detection
from the state API, findings), each reading up to FLEETDECK_SYNC_CONCURRENCY dashboards at once,
on a pool like Celery's: by default prefork with 2 processes, as deploy/k8s/worker.yaml runs it
(`--pool threads --workers 16` models `celery worker --pool threads --concurrency 16`).

Cycles: the first sync (everything is new, no faults), one where nothing changed and nothing
failed (its writes are what an unchanged fleet costs), unchanged ones where 1 % of dashboards
hang (the median of three, or one with --quick), and a faulty one (10 % hang, 5 % reset the
connection, 5 % answer 500).

The ideal cycle is the larger of the summed request latencies ÷ (W × the reads one task has in
flight) and the slowest single cluster, where a hung request costs the adapter's timeout
(FLEETDECK_RAY_TIMEOUT_S): nothing can learn sooner that it is hung. "+CPU" also bounds it by the
tasks' own CPU spread over the cores the pool can use (one for threads), i.e. what a perfect
scheduler could do with this code; the gap between the two ideals is the worker's CPU, the rest
is scheduling and database round trips. Writes are counted with a connection
execute_wrapper; CPU is the worker processes' own (the fake fleet and the database server run in
other processes on the same cores).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scratch_db import analyze, scratch_database  # noqa: E402

NONE: dict[str, float] = {}
CLEAN = {"hang": 0.01}
FAULTS = {"hang": 0.10, "reset": 0.05, "error": 0.05}
RESULT = "RESULT "


# --- parent: one scratch database and one worker process per fleet size ------------------------


def measure(n: int, args) -> dict:
    var = tempfile.mkdtemp(prefix="fleetdeck-bench-var-")
    command = [
        sys.executable,
        __file__,
        "--one",
        str(n),
        "--pool",
        args.pool,
        "--workers",
        str(args.workers),
        "--repeats",
        str(1 if args.quick else 3),
    ]
    try:
        with scratch_database(f"sync{n}") as (url, engine):
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                "FLEETDECK_DEBUG": "0",
                "FLEETDECK_ALLOW_DEV_SECRET": "1",
                # The simulated clusters listen on loopback: Fleetdeck calls only what its allow-list covers.
                "FLEETDECK_CLUSTER_NETWORKS": "127.0.0.0/8,::1/128",
                "FLEETDECK_LOG_LEVEL": "ERROR",
                "FLEETDECK_VAR_DIR": var,
            }
            # A first sync of 10,000 clusters alone takes several minutes on 2 cores.
            limit_s = max(900, n * 0.6)
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=limit_s)
    finally:
        shutil.rmtree(var, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the worker for N={n} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {**json.loads(lines[-1][len(RESULT) :]), "engine": engine}


def report(r: dict) -> None:
    w = r["workers"]
    print(
        f"\nN = {r['n']} clusters ({r['engine']}), pool {r['pool']} x {w}, batches of {r['batch']} reading "
        f"{r['concurrency']} at once, Ray timeout {r['timeout_s']:g} s, "
        f"peak RSS of a worker process {r['peak_rss_mib']:.0f} MiB, load average {os.getloadavg()[0]:.2f}"
    )
    lat = r["latency_ms"]
    print(f"  drawn latencies: p50 {lat[0]:.1f} ms, p95 {lat[1]:.1f} ms, p99 {lat[2]:.1f} ms")
    print(
        f"  {'cycle':24s} {'time':>8s} {'ideal':>7s} {'Σwait/WC':>8s} {'slowest':>7s} {'ratio':>5s} "
        f"{'+CPU':>7s} {'ratio':>5s} {'CPU/cluster':>11s} {'queries/cl':>10s} {'writes':>6s}"
    )
    for label, c in (
        ("first sync (all new)", r["first"]),
        ("unchanged, no faults", r["quiet"]),
        ("unchanged, 1 % hang", r["unchanged"]),
        ("faulty (10/5/5 %)", r["faulty"]),
    ):
        waits = c["sum_wait_s"] / (w * r["concurrency"])
        print(
            f"  {label:24s} {c['time_s']:7.2f}s {c['ideal_s']:6.2f}s {waits:6.2f}s {c['slowest_s']:6.2f}s "
            f"{c['time_s'] / c['ideal_s']:5.2f} {c['with_cpu_s']:6.2f}s {c['time_s'] / c['with_cpu_s']:5.2f} "
            f"{c['cpu_s'] / r['n'] * 1000:8.1f} ms {c['queries'] / r['n']:10.1f} "
            f"{sum(c['writes'].values()) + sum(c['claim_writes'].values()):6d}"
        )
    unchanged, faulty, quiet, first = r["unchanged"], r["faulty"], r["quiet"], r["first"]
    print(
        f"  faulty cycle / unchanged cycle (1 % hang): {faulty['time_s'] / unchanged['time_s']:.2f} (target ≤ 1.3)  "
        f"(dashboards: faulty {faulty['modes']}, unchanged {unchanged['modes']})"
    )
    print(
        f"  unchanged cycle (1 % hang) {unchanged['time_s']:.2f} s: {unchanged['time_s'] / 10:.2f} of 10 s, "
        f"{unchanged['time_s'] / unchanged['ideal_s']:.2f}x the ideal (target ≤ 1.5); first sync "
        f"{first['time_s']:.1f} s: {first['time_s'] / 60:.2f} of 60 s"
    )
    print(
        f"  unchanged cluster, no faults: {quiet['cpu_s'] / r['n'] * 1000:.2f} ms of CPU (target ≤ 3), "
        f"{quiet['queries'] / r['n']:.2f} queries (target ≤ 2)"
    )
    print(f"  the tick's claim took {quiet['claim_s'] * 1000:.0f} ms of the unchanged cycle")
    print("  writes when nothing changed:")
    for what, count in sorted({**quiet["claim_writes"], **quiet["writes"]}.items()):
        origin = "the tick's claim" if what in quiet["claim_writes"] else "the syncs"
        print(f"    {count:6d}  {what}  ({origin})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", default="100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--pool", choices=["prefork", "threads"], default="prefork", help="Celery's pool kind")
    parser.add_argument("--workers", type=int, default=2, help="the pool's concurrency (the manifests run prefork 2)")
    parser.add_argument("--quick", action="store_true", help="one unchanged cycle instead of the median of three")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(RESULT + json.dumps(run_fleet(args.one, args.pool, args.workers, args.repeats)), flush=True)
        return
    print(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, load average at start "
        f"{os.getloadavg()[0]:.2f} (other processes share these cores: figures are upper bounds)"
    )
    for n in [int(x) for x in args.clusters.split(",")]:
        started = time.monotonic()
        report(measure(n, args))
        print(f"  (measured in {time.monotonic() - started:.0f} s including migrations)")


# --- child: the worker under test ---------------------------------------------------------------


class Statements:
    """Counts every statement, and writes by verb, table and the columns an UPDATE sets."""

    WRITE = re.compile(r'^\s*(INSERT INTO|UPDATE|DELETE FROM)\s+"?(\w+)"?', re.IGNORECASE)

    def __init__(self):
        self.total = 0
        self.writes: Counter[str] = Counter()

    def __call__(self, execute, sql, params, many, context):
        self.total += 1
        if match := self.WRITE.match(sql):
            verb, table = match.group(1).split()[0].upper(), match.group(2)
            key = f"{verb} {table}"
            if verb == "UPDATE":
                assignments = sql.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
                key += " SET " + ", ".join(re.findall(r'(?:^|, )"(\w+)" = ', assignments))
            self.writes[key] += 1
        return execute(sql, params, many, context)


def run_task(cluster_ids: list[int]) -> tuple[dict, int, float, int]:
    """One `fleet.sync_batch` task as a worker runs it: its writes, statements, CPU seconds (its
    process's, which counts the thread that reads the dashboards) and the peak RSS (KiB) of the
    process it ran in."""
    from django.db import close_old_connections, connection

    from workers import tasks

    statements = Statements()
    close_old_connections()  # what Celery's Django fixup does around every task
    started = time.process_time()
    with connection.execute_wrapper(statements):
        tasks.sync_batch(cluster_ids)
    cpu = time.process_time() - started
    return dict(statements.writes), statements.total, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_fleet(n: int, pool_kind: str, workers: int, repeats: int) -> dict:
    from bench import fake_fleet

    # The fleet process starts before Django and before any thread, so a plain fork is safe.
    timeout_s = float(os.environ.get("FLEETDECK_RAY_TIMEOUT_S", "5"))
    ours, theirs = multiprocessing.Pipe()
    fleet = multiprocessing.get_context("fork").Process(
        target=fake_fleet.serve, args=(n, timeout_s, theirs), daemon=True
    )
    fleet.start()
    ports = ours.recv()

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, connections
    from django.utils import timezone

    from apps.accounts.models import Team
    from apps.clusters.models import Cluster
    from apps.fleet import sync

    assert timeout_s == settings.FLEETDECK_RAY_TIMEOUT_S
    call_command("migrate", verbosity=0)
    team = Team.objects.create(name="Bench", slug="bench")
    Cluster.objects.bulk_create(
        [
            Cluster(name=f"bench-{i:04d}", team=team, dashboard_url=f"http://127.0.0.1:{port}")
            for i, port in enumerate(ports)
        ]
    )
    from controlplane import heap

    # As the worker does (controlplane/celery.py): the heap loaded so far is frozen before the pool forks.
    heap.freeze()
    if pool_kind == "prefork":
        # Like Celery's default pool: long-lived forked processes, each with its own connection.
        connections.close_all()
        processes = multiprocessing.get_context("fork").Pool(workers, initializer=heap.freeze)
        run_all = lambda ids: processes.map(run_task, ids, chunksize=1)  # noqa: E731
    else:
        threads = ThreadPoolExecutor(workers, thread_name_prefix="worker")
        run_all = lambda ids: list(threads.map(run_task, ids))  # noqa: E731

    def cycle(k: int, faults: dict) -> dict:
        ours.send(("cycle", k, faults))
        modes = ours.recv()
        claim = Statements()
        # Each cycle's tick runs one sync interval after the last, so every cluster is due again.
        now = timezone.now() + timedelta(seconds=k * (settings.FLEETDECK_SYNC_INTERVAL_S + 1))
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with connection.execute_wrapper(claim):
            batches = [job.args[0] for job in sync.due_syncs(now)]
        claim_s = time.perf_counter() - started
        claimed = [cluster_id for batch in batches for cluster_id in batch]
        done = run_all(batches)
        elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
        assert len(claimed) == n, f"claimed {len(claimed)} of {n}"
        ours.send(("stats",))
        stats = ours.recv()
        writes: Counter[str] = Counter()
        for task_writes, *_ in done:
            writes.update(task_writes)
        task_cpu = sum(cpu for _, _, cpu, _ in done)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if pool_kind == "prefork":
            cpu += task_cpu
        sum_wait, slowest = sum(stats["waits"]), max(stats["waits"])
        ideal = max(sum_wait / (workers * settings.FLEETDECK_SYNC_CONCURRENCY), slowest)
        # Threads share one interpreter lock.
        cores = min(workers, os.cpu_count() or 1) if pool_kind == "prefork" else 1
        with_cpu = max(ideal, task_cpu / cores)
        return {
            "time_s": elapsed,
            "ideal_s": ideal,
            "sum_wait_s": sum_wait,
            "slowest_s": slowest,
            "with_cpu_s": with_cpu,
            "cpu_s": cpu,
            "claim_s": claim_s,
            "queries": claim.total + sum(total for _, total, _, _ in done),
            "writes": dict(writes),
            "claim_writes": dict(claim.writes),
            "modes": modes,
            "latencies": stats["latencies"],
            "rss_kib": max(rss for *_, rss in done),
        }

    first = cycle(1, NONE)
    analyze()
    quiet = cycle(2, NONE)
    unchanged = sorted((cycle(3 + i, CLEAN) for i in range(repeats)), key=lambda c: c["time_s"])[repeats // 2]
    faulty = cycle(3 + repeats, FAULTS)
    if pool_kind == "prefork":
        processes.close()
        processes.join()
    else:
        threads.shutdown()
    ours.send(("stop",))
    ours.recv()
    fleet.join(timeout=10)
    latencies = sorted(first["latencies"] + unchanged["latencies"])
    for c in (first, quiet, unchanged, faulty):
        del c["latencies"]
    return {
        "n": n,
        "workers": workers,
        "timeout_s": timeout_s,
        "first": first,
        "quiet": quiet,
        "unchanged": unchanged,
        "faulty": faulty,
        "latency_ms": [statistics.quantiles(latencies, n=100)[q - 1] * 1000 for q in (50, 95, 99)],
        "peak_rss_mib": max(c["rss_kib"] for c in (first, quiet, unchanged, faulty)) / 1024,
        "pool": pool_kind,
        "batch": settings.FLEETDECK_SYNC_BATCH,
        "concurrency": settings.FLEETDECK_SYNC_CONCURRENCY,
    }


if __name__ == "__main__":
    main()
