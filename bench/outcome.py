"""The headline figure: the reference app's misbehaving configuration under a reproducible bursty
load on a real Ray cluster, as shipped, after Fleetdeck's heavy preset, and after the remediation
wizard's computed values.

    .venv/bin/python bench/outcome.py [--bursts 6] [--burst-size 12] [--headroom-gib 3]

A private Ray head whose memory monitor trips `--headroom-gib` above what the machine used before
it started (the stand-in for a GPU node's memory) runs `deploy/reference_app/misbehaving.json`:
one replica taking 16 requests at once, no input or batch caps, an unbounded queue, and about
520 MiB of temporaries per request. Every arm replays the same schedule: `--bursts` bursts of
`--burst-size` simultaneous requests, one burst every `--period-s` seconds. Fleetdeck watches the
cluster the way its worker does (sync, OOM evidence, metrics every 2 s); the wizard arm starts
from the OOM incident of the first arm and applies every config remedy it computes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("FLEETDECK_DEBUG", "1")
os.environ.setdefault("FLEETDECK_VAR_DIR", tempfile.mkdtemp(prefix="fleetdeck-bench-"))
os.environ.pop("DATABASE_URL", None)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from apps.accounts.audit import Actor  # noqa: E402
from apps.accounts.services import ensure_team  # noqa: E402
from apps.changes import protocol  # noqa: E402
from apps.changes.models import Preset  # noqa: E402
from apps.clusters.models import Cluster  # noqa: E402
from apps.clusters.ray_dashboard import RayDashboard  # noqa: E402
from apps.fleet import sync  # noqa: E402
from apps.incidents import services as incidents  # noqa: E402
from apps.incidents.models import Incident  # noqa: E402
from apps.incidents.oom import oom_kills  # noqa: E402
from apps.remediation import wizards  # noqa: E402
from controlplane.local_ray import REFERENCE_APP_DIR, LocalRayHead  # noqa: E402

TARGET = [{"application": "reference", "deployment": "Generator"}]
ACTOR = Actor.system(via="cli")
GIB = 2**30


def used_fraction_plus(extra_bytes: int) -> float:
    info = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    total = int(info["MemTotal"].split()[0]) * 1024
    available = int(info["MemAvailable"].split()[0]) * 1024
    return min((total - available + extra_bytes) / total, 0.95)


def killed(head: LocalRayHead) -> set[str]:
    with RayDashboard(head.dashboard_url, timeout_s=10) as ray:
        page = ray.list_actors(filters=[("state", "=", "DEAD")], detail=True, limit=10_000)
    return {k.actor_id for k in oom_kills(page.items) if (k.application, k.deployment) == ("reference", "Generator")}


def observe(cluster: Cluster) -> None:
    sync.sync_cluster(cluster.pk)
    incidents.detect(cluster.pk)
    incidents.collect_metrics(cluster.pk)


def wait_running(head: LocalRayHead, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with RayDashboard(head.dashboard_url, timeout_s=10) as ray:
            app = ray.serve_applications().applications.get("reference")
        if app is not None and app.status == "RUNNING":
            return
        time.sleep(1)
    raise RuntimeError("the reference application did not come back to RUNNING")


def replay(head: LocalRayHead, cluster: Cluster, args) -> dict:
    """The fixed schedule; Fleetdeck observes meanwhile. Returns what the clients and Ray saw."""
    before = killed(head)
    results: list[tuple[float, int | str]] = []
    lock = threading.Lock()
    body = {"prompt": "x" * args.prompt_chars, "max_tokens": args.max_tokens}

    def one(client: httpx.Client):
        started = time.monotonic()
        try:
            status: int | str = client.post(f"{head.serve_url}/reference", json=body).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        with lock:
            results.append((time.monotonic() - started, status))

    client = httpx.Client(timeout=args.request_timeout_s, limits=httpx.Limits(max_connections=args.burst_size * args.bursts))
    threads = []
    started = time.monotonic()
    for burst in range(args.bursts):
        while time.monotonic() < started + burst * args.period_s:
            observe(cluster)
            time.sleep(1)
        for _ in range(args.burst_size):
            thread = threading.Thread(target=one, args=(client,), daemon=True)
            thread.start()
            threads.append(thread)
    while any(t.is_alive() for t in threads):
        observe(cluster)
        time.sleep(2)
    elapsed = time.monotonic() - started
    client.close()
    observe(cluster)
    ok = sorted(latency for latency, status in results if status == 200)
    return {
        "oom_kills": len(killed(head) - before),
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_rate": (len(results) - len(ok)) / len(results),
        "p50_s": statistics.median(ok) if ok else None,
        "p99_s": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "throughput": len(ok) / elapsed,
        "statuses": sorted({str(status) for _, status in results}),
    }


def apply(cluster: Cluster, **plan) -> None:
    change = protocol.plan_change(ACTOR, cluster, targets=TARGET, reason="outcome benchmark", **plan)
    protocol.request_apply(ACTOR, change)
    protocol.run(change.pk)
    change.refresh_from_db()
    if change.state != "succeeded":
        raise RuntimeError(f"change {change.state}: {change.error}")


def wizard_values(cluster: Cluster) -> tuple[dict, dict]:
    incident = Incident.objects.filter(cluster=cluster, deployment_name="Generator", kind="oom_kill").first()
    if incident is None:
        raise RuntimeError("the original configuration was never OOM-killed: raise --burst-size or lower --headroom-gib")
    wizard, _ = wizards.start(ACTOR, incident=incident)
    steps = [s for s in wizard.steps.filter(kind="config", status="pending") if s.patch]
    options: dict = {}
    for step in steps:
        for key, value in step.patch.items():
            options[key] = {**options[key], **value} if isinstance(value, dict) and isinstance(options.get(key), dict) else value
    reasons = {s.remedy: s.values.get("reasons", {}) for s in steps}
    return options, {"memory": wizard.diagnosis.get("memory"), "budget": wizard.diagnosis.get("budget"), "reasons": reasons}


def row(name: str, figures: dict, baseline: dict) -> str:
    def ratio(key):
        if figures[key] is None or not baseline[key]:
            return "  –  "
        return f"{figures[key] / baseline[key]:5.2f}"

    p50 = f"{figures['p50_s']:.2f}" if figures["p50_s"] is not None else "–"
    p99 = f"{figures['p99_s']:.2f}" if figures["p99_s"] is not None else "–"
    return (f"{name:<28} {figures['oom_kills']:>4} {p50:>7} {p99:>7} ({ratio('p99_s')}) {figures['error_rate']:>6.1%} "
            f"{figures['throughput']:>6.2f} ({ratio('throughput')})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--burst-size", type=int, default=12)
    parser.add_argument("--period-s", type=float, default=15.0)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--headroom-gib", type=float, default=3.0)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    from django.conf import settings

    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 180
    call_command("migrate", verbosity=0)
    threshold = used_fraction_plus(int(args.headroom_gib * GIB))
    head = LocalRayHead.start(extra_env={"RAY_memory_usage_threshold": f"{threshold:.3f}", "RAY_memory_monitor_refresh_ms": "250"})
    try:
        head.wait_ready()
        head.deploy(json.loads((REFERENCE_APP_DIR / "misbehaving.json").read_text()))
        cluster = Cluster.objects.create(name="outcome", team=ensure_team("Bench"), dashboard_url=head.dashboard_url, ray_version="2.60.0",
                                         serve_url=head.serve_url,
                                         metrics_url=f"http://127.0.0.1:{head.ports['metrics-export-port']}/metrics")
        observe(cluster)
        arms = {"original (misbehaving.json)": replay(head, cluster, args)}
        wait_running(head)

        apply(cluster, preset=Preset.objects.get(slug="heavy-gpu-model"))
        wait_running(head)
        arms["heavy preset"] = replay(head, cluster, args)
        wait_running(head)

        options, why = wizard_values(cluster)
        apply(cluster, options=options)
        wait_running(head)
        arms["heavy preset + wizard values"] = replay(head, cluster, args)

        # The original arm usually serves nothing at all, so ratios are to the preset arm.
        baseline = arms["heavy preset"]
        print(f"\nSchedule: {args.bursts} bursts of {args.burst_size} requests every {args.period_s:g} s "
              f"({args.prompt_chars} characters, {args.max_tokens} tokens each); memory monitor trips "
              f"{args.headroom_gib:g} GiB above the machine's usage before the cluster started.")
        print(f"Wizard's values: {json.dumps(options)}")
        print(f"  memory: {why['memory']}")
        print(f"  budget: {why['budget']}")
        print(f"\n{'arm':<28} {'OOM':>4} {'p50 s':>7} {'p99 s':>7} (÷preset) {'errors':>6} {'ok/s':>6} (÷preset)")
        for name, figures in arms.items():
            print(row(name, figures, baseline))
        for name, figures in arms.items():
            print(f"  {name}: {figures['ok']}/{figures['requests']} ok, client saw {figures['statuses']}")
    finally:
        head.stop()


if __name__ == "__main__":
    main()
