"""Sync lag under stalls (issue 34): do 200 clusters keep their sync interval while two changes
wait out slow verifications and two metrics endpoints misbehave?

    .venv/bin/python bench/sync_under_stalls.py [--clusters 200] [--run-s 75] [--broker redis|embedded]

Two arms, each in a scratch database (a new PostgreSQL database on the server DATABASE_URL names,
dropped at the end; else a throwaway SQLite file) and with processes of its own, started as
production runs them (deploy/k8s/worker.yaml): `celery worker -Q celery,tick,metrics --concurrency 2`
and `celery worker -Q long --concurrency 2`, both prefork, and `celery beat` sending `fleet.tick`
every FLEETDECK_TICK_INTERVAL_S = 1 s; clusters are due every FLEETDECK_SYNC_INTERVAL_S = 5 s.
The broker is the Redis at 127.0.0.1:6379 (database 13, purged before and after each arm) or,
with --broker embedded, the embedded SQLite broker in the arm's own folder.

- baseline: the simulated fleet (bench/fake_fleet.py: one asyncio process serving every fake
  dashboard on its own loopback port) for the measured clusters and two more, and two clusters on
  fake dashboards (tests/fake_ray.py); no metrics endpoint, no change.
- stalls: the same, except that the two extra fleet clusters have metrics endpoints, one that
  sends a byte every 4 s forever and one that streams without end as fast as it is read, and a
  change is applied to each of the two fake dashboards, which take the push and never run it
  (their Serve status never shows it), so each change waits its full verification
  (FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 60) and then its rollback's. The outbound limits and the
  metrics time limit are the production defaults (30 s, 64 MiB, 45 s).

Sync lag is read from what the tick and the sync record on each measured cluster, sampled every
0.5 s: the tick's claim sets `next_sync_at` to the claim time plus the interval (so each claim
says when the previous one made the cluster due), and the sync stamps `last_sync_at`. A sync
serves every claim made before it; its lag is its time minus the earliest due time among them. A
due left unserved at the end of the window for more than an interval counts with the lag it had
reached. Only syncs inside the window count, which starts once every cluster has synced twice
(the first sync of a new cluster writes its 30 deployments) and, in the stalls arm, both changes
are verifying.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scratch_db import scratch_database  # noqa: E402

RESULT = "RESULT "
REDIS_URL = "redis://127.0.0.1:6379/13"
INTERVAL_S = 5
TICK_S = 1
VERIFY_TIMEOUT_S = 60
DRIP_EVERY_S = 4.0
SAMPLE_EVERY_S = 0.5


# --- parent: one child process per arm ----------------------------------------------------------


def measure(arm: str, args) -> dict:
    var = tempfile.mkdtemp(prefix="fleetdeck-bench-var-")
    command = [sys.executable, __file__, "--arm", arm, "--clusters", str(args.clusters), "--run-s", str(args.run_s)]
    try:
        with scratch_database(f"stalls_{arm}") as (url, engine):
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                "FLEETDECK_DEBUG": "0",
                "FLEETDECK_ALLOW_DEV_SECRET": "1",
                # The simulated clusters and endpoints listen on loopback.
                "FLEETDECK_CLUSTER_NETWORKS": "127.0.0.0/8",
                "FLEETDECK_LOG_LEVEL": "WARNING",
                "FLEETDECK_VAR_DIR": var,
                "FLEETDECK_SYNC_INTERVAL_S": str(INTERVAL_S),
                "FLEETDECK_TICK_INTERVAL_S": str(TICK_S),
                "FLEETDECK_CHANGE_VERIFY_TIMEOUT_S": str(VERIFY_TIMEOUT_S),
            }
            if args.broker == "redis":
                env["CELERY_BROKER_URL"] = REDIS_URL
            else:
                env.pop("CELERY_BROKER_URL", None)
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.run_s + 600)
    finally:
        shutil.rmtree(var, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {arm} arm failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return {**json.loads(lines[-1][len(RESULT) :]), "engine": engine}


def quantile(values: list[float], q: float) -> float:
    """Nearest rank: the value below which a fraction q of the values lie."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def summary(r: dict) -> dict:
    lags = [lag / r["interval_s"] for lag in r["lags_s"]]
    return {
        "syncs": r["syncs"],
        "ideal": r["clusters"] * r["window_s"] / r["interval_s"],
        "p50": quantile(lags, 0.50),
        "p95": quantile(lags, 0.95),
        "max": max(lags),
        "over": sum(1 for lag in lags if lag > 1.5),
        "unserved": r["unserved"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=200, help="measured clusters on the simulated fleet")
    parser.add_argument("--run-s", type=float, default=75.0, help="the measured window of each arm, seconds")
    parser.add_argument("--broker", choices=["redis", "embedded"], default="redis")
    parser.add_argument("--arm", choices=["baseline", "stalls"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(RESULT + json.dumps(run_arm(args.arm, args.clusters, args.run_s)), flush=True)
        return
    broker = f"Redis at {REDIS_URL}" if args.broker == "redis" else "the embedded SQLite broker"
    print(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, load average at start "
        f"{os.getloadavg()[0]:.2f} (other processes share these cores: figures are upper bounds)"
    )
    print(
        f"{args.clusters} measured clusters, sync interval {INTERVAL_S} s, beat tick {TICK_S} s, window "
        f"{args.run_s:g} s per arm, broker {broker}; workers `-Q celery,tick,metrics --concurrency 2` and "
        "`-Q long --concurrency 2`, prefork"
    )
    results = {}
    for arm in ("baseline", "stalls"):
        started = time.monotonic()
        results[arm] = measure(arm, args)
        r = results[arm]
        print(
            f"  {arm}: measured in {time.monotonic() - started:.0f} s ({r['engine']}), load average at the end "
            f"{r['load_end']:.2f}, largest gap between samples {r['max_sample_gap_s']:.2f} s"
        )
    print("\nsync lag, in sync intervals (lag = when the sync happened - when the cluster was due):")
    columns = ("p50", "p95", "max", "> 1.5")
    print(f"  {'arm':10s} {'syncs done / ideal':>20s} " + " ".join(f"{c:>6s}" for c in columns) + " unserved")
    s = {arm: summary(r) for arm, r in results.items()}
    for arm, x in s.items():
        print(
            f"  {arm:10s} {x['syncs']:>10d} / {x['ideal']:<7.0f} {x['p50']:6.2f} {x['p95']:6.2f} {x['max']:6.2f} "
            f"{x['over']:6d} {x['unserved']:8d}"
        )
    ratio = s["stalls"]["p95"] / s["baseline"]["p95"] if s["baseline"]["p95"] else float("inf")
    met = "met" if s["stalls"]["p95"] <= 1.5 else "NOT met"
    print(
        f"  p95 with stalls {s['stalls']['p95']:.2f} intervals against {s['baseline']['p95']:.2f} without: ratio "
        f"{ratio:.2f}; target p95 <= 1.5 intervals: {met}"
    )
    st = results["stalls"]
    print("\nthe stalls, as the stalls arm saw them:")
    for path, x in sorted(st["endpoints"].items()):
        if x["requests"]:
            print(
                f"  metrics endpoint /{path}: read {x['requests']} times, held open {min(x['held_s']):.1f}-"
                f"{max(x['held_s']):.1f} s each, {x['bytes'] / 2**20:.1f} MiB sent in all"
            )
    for name, error in sorted(st["scrape_errors"].items()):
        print(f"  {name} metrics error: {error}")
    for change in st["changes"]:
        print(f"  change #{change['id']}: {change['state']} at the end of the window ({change['last_step']})")


# --- child: one arm -----------------------------------------------------------------------------


class Endpoints:
    """Metrics endpoints on loopback that never end their answer: `/drip` sends a byte every
    DRIP_EVERY_S seconds, `/endless` streams as fast as it is read."""

    def __init__(self):
        self.stats = {path: {"requests": 0, "held_s": [], "bytes": 0} for path in ("drip", "endless")}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started, stats = time.monotonic(), None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = "drip" if head.split(b" ", 2)[1].startswith(b"/drip") else "endless"
            stats = self.stats[path]
            stats["requests"] += 1
            # No length: the answer ends when the server closes, which it never does.
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n")
            gone = asyncio.ensure_future(reader.read())  # completes when the client hangs up
            chunk = b"# " + b"0" * 65534
            while not gone.done():
                if path == "drip":
                    writer.write(b"#")
                    stats["bytes"] += 1
                    await writer.drain()
                    await asyncio.wait({gone}, timeout=DRIP_EVERY_S)
                else:
                    writer.write(chunk)
                    stats["bytes"] += len(chunk)
                    await writer.drain()
            gone.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            if stats is not None:
                stats["held_s"].append(time.monotonic() - started)
            writer.close()


def serve_endpoints(conn) -> None:
    endpoints = Endpoints()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await asyncio.start_server(endpoints.handle, "127.0.0.1", 0)
        conn.send(server.sockets[0].getsockname()[1])
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            conn.send(endpoints.stats)
            if command[0] == "stop":
                server.close()
                return

    asyncio.run(main())


def celery_processes(var: str) -> list[tuple[str, list[str]]]:
    celery = [sys.executable, "-m", "celery", "-A", "controlplane"]
    host = f"bench{os.getpid()}"
    worker = ["worker", "--loglevel", "WARNING", "--pool", "prefork", "--concurrency", "2"]
    return [
        ("worker", [*celery, *worker, "--queues", "celery,tick,metrics", "--hostname", f"worker@{host}"]),
        ("long", [*celery, *worker, "--queues", "long", "--hostname", f"long@{host}"]),
        ("beat", [*celery, "beat", "--loglevel", "WARNING", "--schedule", f"{var}/celerybeat-schedule"]),
    ]


def stop(process: subprocess.Popen) -> None:
    """The process group its start made (start_new_session): the worker and its pool processes.
    A warm shutdown would wait out a change's verification; nothing of theirs needs to survive."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def wait_until(predicate, timeout_s: float, what: str, processes=()) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        for name, process, log in processes:
            if process.poll() is not None:
                raise SystemExit(f"{name} exited with {process.returncode}:\n{Path(log).read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def lags(claims: list[float], syncs: list[float], interval_s: float, start: float, end: float) -> tuple[list, int]:
    """Each sync in [start, end]: its time minus the earliest due time it served (see the module's
    docstring), and the dues still unserved at `end` after more than an interval, with their lag so far."""
    events = [(next_at - interval_s, 0, due) for due, next_at in itertools.pairwise(claims)]
    events += [(at, 1, 0.0) for at in syncs]
    pending: list[float] = []
    found = []
    for at, kind, due in sorted(events):
        if kind == 0:
            pending.append(due)
        elif pending:
            if start <= at <= end:
                found.append(at - min(pending))
            pending.clear()
    unserved = 0
    if pending and end - min(pending) > interval_s:
        found.append(end - min(pending))
        unserved = 1
    return found, unserved


def run_arm(arm: str, n: int, run_s: float) -> dict:
    from bench import fake_fleet

    # The fleet and the endpoints start before Django and before any thread, so a plain fork is safe.
    fork = multiprocessing.get_context("fork")
    fleet_conn, theirs = fork.Pipe()
    fleet = fork.Process(target=fake_fleet.serve, args=(n + 2, 5.0, theirs), daemon=True)
    fleet.start()
    ports = fleet_conn.recv()
    endpoints_conn, theirs = fork.Pipe()
    endpoints = fork.Process(target=serve_endpoints, args=(theirs,), daemon=True)
    endpoints.start()
    metrics_port = endpoints_conn.recv()

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from apps.accounts.audit import Actor
    from apps.accounts.models import Team
    from apps.changes import protocol
    from apps.changes.models import Change, ChangeState
    from apps.clusters.models import Cluster
    from apps.incidents.models import ScrapeState
    from controlplane.celery import app as celery_app
    from tests.fake_ray import FakeRay, serving

    class NeverRuns(FakeRay):
        """Takes every push and never runs it: a change's verification waits its full time."""

        def apply(self, config: dict) -> None:
            pass

    assert settings.FLEETDECK_SYNC_INTERVAL_S == INTERVAL_S
    var = settings.VAR_DIR
    call_command("migrate", verbosity=0)
    celery_app.control.purge()
    team = Team.objects.create(name="Bench", slug="bench")
    Cluster.objects.bulk_create(
        [
            Cluster(name=f"bench-{i:04d}", team=team, dashboard_url=f"http://127.0.0.1:{port}")
            for i, port in enumerate(ports[:n])
        ]
    )
    measured = list(Cluster.objects.values_list("pk", flat=True))
    for path, port in zip(("drip", "endless"), ports[n:], strict=True):
        metrics_url = f"http://127.0.0.1:{metrics_port}/{path}" if arm == "stalls" else ""
        Cluster.objects.create(
            name=f"metrics-{path}", team=team, dashboard_url=f"http://127.0.0.1:{port}", metrics_url=metrics_url
        )
    started: list[tuple[str, subprocess.Popen, str]] = []
    samples: dict[int, tuple[set, set]] = {pk: (set(), set()) for pk in measured}
    sampled_at: list[float] = []

    def sample() -> None:
        rows = Cluster.objects.filter(pk__in=measured).values_list("pk", "last_sync_at", "next_sync_at")
        for pk, synced, due in rows:
            if synced is not None:
                samples[pk][1].add(synced.timestamp())
            if due is not None:
                samples[pk][0].add(due.timestamp())
        sampled_at.append(time.time())

    def sample_until(predicate, timeout_s: float, what: str) -> None:
        def sampled() -> bool:
            sample()
            return predicate()

        wait_until(sampled, timeout_s, what, started)

    with contextlib.ExitStack() as stack:
        dashboards = [stack.enter_context(serving(NeverRuns())) for _ in range(2)]
        changed = [
            Cluster.objects.create(name=f"changed-{i}", team=team, dashboard_url=fake.url, ray_version="2.60.0")
            for i, fake in enumerate(dashboards)
        ]
        try:
            for name, command in celery_processes(str(var)):
                log = f"{var}/{name}.log"
                with open(log, "w") as out:
                    process = subprocess.Popen(
                        command, cwd=REPO, env=os.environ, start_new_session=True, stdout=out, stderr=out
                    )
                started.append((name, process, log))
            # Warm-up: every cluster's first sync (all new), then one more each.
            sample_until(lambda: all(samples[pk][1] for pk in measured), 300, "every cluster's first sync")
            first = time.time()
            sample_until(lambda: all(max(samples[pk][1]) > first for pk in measured), 120, "a second sync of each")
            changes = []
            if arm == "stalls":
                actor = Actor.system("bench")
                for cluster in changed:
                    change = protocol.plan_change(
                        actor,
                        cluster,
                        targets=[{"application": "demo", "deployment": "Model"}],
                        reason="issue 34 bench: a change that waits out its verification",
                        options={"max_ongoing_requests": 6},
                    )
                    changes.append(protocol.request_apply(actor, change).pk)
                sample_until(
                    lambda: Change.objects.filter(pk__in=changes, state=ChangeState.VERIFYING).count() == 2,
                    60,
                    "both changes verifying",
                )
            window_start = time.time()
            while time.time() < window_start + run_s:
                sample()
                for name, process, log in started:
                    if process.poll() is not None:
                        raise SystemExit(f"{name} exited with {process.returncode}:\n{Path(log).read_text()[-3000:]}")
                time.sleep(SAMPLE_EVERY_S)
            window_end = time.time()
            load_end = os.getloadavg()[0]
            scrape_errors = {
                name: error
                for name, error in ScrapeState.objects.filter(cluster__name__startswith="metrics-").values_list(
                    "cluster__name", "error"
                )
            }
            change_rows = [
                {"id": c.pk, "state": c.state, "last_step": c.steps.order_by("pk").last().message[:160]}
                for c in Change.objects.filter(pk__in=changes).order_by("pk")
            ]
        finally:
            for _, process, _ in reversed(started):
                stop(process)
            celery_app.control.purge()
            endpoints_conn.send(("stop",))
            endpoint_stats = endpoints_conn.recv()
            fleet_conn.send(("stop",))
            fleet_conn.recv()
            fleet.join(timeout=10)
            endpoints.join(timeout=10)
    found, unserved = [], 0
    for pk in measured:
        claims, syncs = (sorted(values) for values in samples[pk])
        lag, left = lags(claims, syncs, INTERVAL_S, window_start, window_end)
        found += lag
        unserved += left
    in_window = [t for t in sampled_at if t >= window_start - INTERVAL_S]
    return {
        "arm": arm,
        "clusters": n,
        "interval_s": INTERVAL_S,
        "window_s": window_end - window_start,
        "lags_s": found,
        "syncs": len(found) - unserved,
        "unserved": unserved,
        "max_sample_gap_s": max(b - a for a, b in itertools.pairwise(in_window)),
        "load_end": load_end,
        "endpoints": endpoint_stats,
        "scrape_errors": scrape_errors,
        "changes": change_rows,
    }


if __name__ == "__main__":
    main()
