"""The signal store at fleet scale: what one metrics reading costs a cluster, and what the store
holds and writes a day at 1,000 clusters.

    DATABASE_URL=postgres://… .venv/bin/python bench/signal_store.py [--clusters 1000] [--deployments 30]

A cluster with metrics enabled takes a reading with every sync (`FLEETDECK_SYNC_INTERVAL_S`, 30 s):
one scrape of Ray's metrics endpoint, differenced against the last one (kept in `ScrapeState`),
then one point per deployment and per node added to its window (`SignalWindow`, `NodeWindow`),
which `metric_readings.compact` keeps to raw points for an hour and 5-minute summaries for 24 h.

The scrape is the captured Ray 2.60 endpoint (tests/fixtures/ray/metrics_after_200_requests_filtered.prom,
two deployments on one node), its deployment series copied under new names until the cluster has
`--deployments` of them, as the fleet benchmark's clusters do. Counters move between the two
scrapes. The windows are filled with a day of readings (one per interval, each with the latency,
rate, queue and proxy figures a busy deployment has) and then measured at their steady size.

Measured in this process: the CPU of parsing a scrape and turning two into a reading, and of
adding one point to a full window. On PostgreSQL (a scratch database next to the one DATABASE_URL
names, dropped afterwards): the size of a full window row as stored (`pg_column_size`, after
TOAST compression), and the WAL written by one reading's window updates, which is what the disk
and any replica really receive. Without DATABASE_URL only the in-process figures are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.scratch_db import scratch_database  # noqa: E402

SCRAPE = REPO / "tests" / "fixtures" / "ray" / "metrics_after_200_requests_filtered.prom"
DAY_S = 86_400
LABEL = re.compile(r'application="([^"]*)"(.*?)deployment="([^"]*)"')


def fleet_scrape(deployments: int) -> str:
    """The captured endpoint with its per-deployment series repeated under new names."""
    lines = SCRAPE.read_text().splitlines()
    base = {(m.group(1), m.group(3)) for line in lines if (m := LABEL.search(line)) and m.group(3)}
    copies = max(1, -(-deployments // max(len(base), 1)))
    out = []
    for line in lines:
        match = LABEL.search(line)
        if not match or not match.group(3):  # series of no deployment (the proxy's own) stay one
            out.append(line)
            continue
        for k in range(copies):
            out.append(LABEL.sub(lambda m, k=k: f'application="app{k}"{m.group(2)}deployment="{m.group(3)}"', line))
    return "\n".join(out) + "\n"


def advanced(text: str, rng: random.Random) -> str:
    """The same series a sync interval later: every counter and bucket moved on."""

    def bump(match: re.Match) -> str:
        value = float(match.group(2))
        return f"{match.group(1)} {value + rng.randint(0, 40) if '_total' in match.group(1) or '_bucket' in match.group(1) or '_count' in match.group(1) else value}"  # noqa: E501 - one expression

    return re.sub(r"^(\S+\{.*\}) ([0-9.e+-]+)$", bump, text, flags=re.MULTILINE)


def busy_point(at: float, rng: random.Random) -> dict:
    """A reading of a deployment under traffic, with its application's proxy figures."""
    from apps.fleet import metric_readings as mr

    d = mr.DeploymentSignals(
        p50_ms=rng.uniform(20, 60),
        p95_ms=rng.uniform(80, 200),
        p99_ms=rng.uniform(150, 900),
        requests=rng.randint(200, 2000),
        errors=rng.randint(0, 3),
        ongoing=rng.uniform(0, 8),
        queued=rng.uniform(0, 4),
        replica_starts=0,
        rss_mb=rng.uniform(900, 4000),
        replicas=rng.randint(1, 4),
    )
    app = mr.ApplicationSignals(
        requests=rng.randint(200, 2000),
        errors_by_code={"503": rng.randint(0, 3)},
        p50_ms=rng.uniform(25, 70),
        p95_ms=rng.uniform(90, 250),
        p99_ms=rng.uniform(200, 1000),
    )
    return mr.point(at, 30.0, d, app)


def full_window(interval_s: float, rng: random.Random) -> tuple[list[dict], float]:
    from apps.fleet.metric_readings import compact

    points: list[dict] = []
    at = 1_800_000_000.0
    for _ in range(int((DAY_S + 3600) / interval_s)):
        at += interval_s
        points = compact([*points, busy_point(at, rng)], now=at)
    return points, at


def in_process(args, names) -> dict:
    from apps.fleet import metric_readings as mr
    from apps.fleet.metric_readings import compact
    from integrations import ray_metrics

    rng = random.Random(0)
    first = fleet_scrape(args.deployments)
    second = advanced(first, rng)
    rounds = 20
    # The last scrape comes back from ScrapeState as samples; only the new one is parsed.
    prev = mr.relevant(ray_metrics.parse(first, at=1000.0, names=names))
    started = time.process_time()
    for _ in range(rounds):
        cur = mr.relevant(ray_metrics.parse(second, at=1030.0, names=names))
        reading = mr.read(prev, cur)
    read_s = (time.process_time() - started) / rounds
    kept = json.dumps([[s.name, s.labels, s.value] for s in cur.samples])

    window, at = full_window(args.interval, rng)
    started = time.process_time()
    for k in range(rounds):
        compact([*window, busy_point(at + (k + 1) * args.interval, rng)], now=at + (k + 1) * args.interval)
    compact_s = (time.process_time() - started) / rounds
    return {
        "scrape_bytes": len(first.encode()),
        "series": len(cur.samples),
        "deployments_read": len(reading.deployments),
        "nodes_read": len(reading.nodes),
        "read_cpu_s": read_s,
        "scrape_state_bytes": len(kept.encode()),
        "window": window,
        "window_points": len(window),
        "window_json_bytes": len(json.dumps(window).encode()),
        "compact_cpu_s": compact_s,
        "at": at,
    }


def on_postgres(url: str, args, measured: dict) -> dict:
    os.environ["DATABASE_URL"] = url
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from apps.accounts.models import Team
    from apps.clusters.models import Cluster
    from apps.fleet.metric_readings import compact
    from apps.incidents.models import SignalWindow

    call_command("migrate", verbosity=0)
    team = Team.objects.create(name="Bench", slug="bench")
    cluster = Cluster.objects.create(name="bench", team=team, dashboard_url="http://127.0.0.1:1")
    window, at = measured["window"], measured["at"]
    rows = [
        SignalWindow(cluster=cluster, application_name=f"app{i // 3}", deployment_name=f"D{i % 3}", points=window)
        for i in range(args.deployments)
    ]
    SignalWindow.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute("SELECT avg(pg_column_size(recent) + pg_column_size(summaries)) FROM incidents_signalwindow")
        stored = float(cursor.fetchone()[0])
        cursor.execute("CHECKPOINT")
        # Ten readings: one 5-minute bucket, so the summaries move once, as they do in a day.
        rng, readings = random.Random(1), 10
        cursor.execute("SELECT pg_current_wal_lsn()")
        before = cursor.fetchone()[0]
        started = time.perf_counter()
        for k in range(readings):
            now = at + (k + 1) * args.interval
            # As collect_metrics writes them: each window read, one point added, compacted, saved.
            for row in SignalWindow.objects.filter(cluster=cluster):
                row.save_points(compact([*row.points, busy_point(now, rng)], now=now))
        elapsed = (time.perf_counter() - started) / readings
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [before])
        wal = float(cursor.fetchone()[0]) / readings
    return {"stored_bytes": stored, "wal_per_reading": wal, "write_s": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--deployments", type=int, default=30, help="deployments per cluster")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between readings (the sync interval)")
    parser.add_argument("--parse-all", action="store_true", help="parse every series, as before the name filter")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("FLEETDECK_DEBUG", "0")
    os.environ.setdefault("FLEETDECK_ALLOW_DEV_SECRET", "1")
    os.environ.setdefault("FLEETDECK_CLUSTER_NETWORKS", "127.0.0.0/8,::1/128")
    os.environ.setdefault("FLEETDECK_LOG_LEVEL", "ERROR")
    pg = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    with scratch_database("signals") as (url, _engine):
        os.environ["DATABASE_URL"] = url
        import django

        django.setup()
        from apps.fleet.metric_readings import SCRAPED

        m = in_process(args, None if args.parse_all else SCRAPED)
        db = on_postgres(url, args, m) if pg else None

    n, deps, per_day = args.clusters, args.deployments, DAY_S / args.interval
    windows = n * (deps + 1)  # one per deployment, one per node (the captured cluster has one)
    cluster_cpu = m["read_cpu_s"] + (deps + 1) * m["compact_cpu_s"]
    print(
        f"signal store, {n:,} clusters × {deps} deployments, a reading every {args.interval:g} s "
        f"({per_day:,.0f} a day), load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"  scrape: {m['scrape_bytes'] / 1024:,.0f} KiB of text, {m['series']:,} series kept "
        f"({m['scrape_state_bytes'] / 1024:,.0f} KiB in ScrapeState), {m['deployments_read']} deployments read"
    )
    print(
        f"  CPU per cluster and reading: {m['read_cpu_s'] * 1000:.1f} ms to parse and difference two scrapes, "
        f"{m['compact_cpu_s'] * 1000:.2f} ms per window to add a point; {cluster_cpu * 1000:.0f} ms in all"
    )
    print(f"  CPU for the fleet: {cluster_cpu * n / args.interval:.2f} cores to keep up")
    print(
        f"  a full window: {m['window_points']} points (raw for 1 h, 5-minute summaries for 24 h), "
        f"{m['window_json_bytes'] / 1024:.0f} KiB as JSON"
    )
    print(
        f"  rows held: {windows:,} windows + {n:,} scrape states (one per deployment, node and cluster; "
        f"rows do not grow with time)"
    )
    print(f"  rows rewritten: {windows * per_day / 1e6:,.1f} million a day ({windows / args.interval:,.0f} a second)")
    if db:
        held = windows * db["stored_bytes"]
        print(
            f"  stored (PostgreSQL, after TOAST compression): {db['stored_bytes'] / 1024:.0f} KiB a window, "
            f"{held / 2**30:.2f} GiB held for the fleet"
        )
        per_cluster = db["wal_per_reading"] * (deps + 1) / deps
        print(
            f"  written: {per_cluster / 2**20:.2f} MiB of WAL per cluster per reading, "
            f"{per_cluster * n * per_day / 2**40:.2f} TiB a day for the fleet; "
            f"{db['write_s'] * 1000:.0f} ms of wall time per cluster to rewrite its windows"
        )
    else:
        print("  (set DATABASE_URL to a PostgreSQL server for stored size and WAL written)")


if __name__ == "__main__":
    main()
