"""Time from "apply" to "verified" for one in-place deployment change through Fleetdeck's push
protocol, next to Ray's own `serve deploy` for the same change on the same real cluster.

    .venv/bin/python bench/change_latency.py [--rounds 5]

Starts a private Ray head on loopback (stopped at the end), deploys the two-application demo, and
alternates max_ongoing_requests of demo/Model. The baseline is `serve deploy` plus polling until
the effective config holds the value (what a careful operator does by hand); Fleetdeck's figure
is plan + drift check + full-config PUT + verification of every touched deployment.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.lab_setup import setup_django  # noqa: E402

setup_django()

from django.core.management import call_command  # noqa: E402

from apps.accounts.audit import Actor  # noqa: E402
from apps.accounts.services import ensure_team  # noqa: E402
from apps.changes import protocol  # noqa: E402
from apps.changes.models import ChangeState  # noqa: E402
from apps.clusters.models import Cluster  # noqa: E402
from apps.demo.local_ray import DEMO_APP_DIR, LocalRayHead, _ray_bin  # noqa: E402
from integrations.ray.dashboard import RayDashboard  # noqa: E402


def demo_config() -> dict:
    config = json.loads((REPO / "tests/fixtures/ray/put_config_demo_and_echo2.json").read_text())
    for app in config["applications"]:
        app["runtime_env"]["env_vars"]["PYTHONPATH"] = str(DEMO_APP_DIR)
    return config


def effective_moq(head: LocalRayHead) -> int:
    with RayDashboard(head.dashboard_url) as ray:
        return (
            ray.serve_applications().applications["demo"].deployments["Model"].deployment_config["max_ongoing_requests"]
        )


def serve_deploy(head: LocalRayHead, config: dict, value: int) -> float:
    config = copy.deepcopy(config)
    next(d for d in config["applications"][0]["deployments"] if d["name"] == "Model")["max_ongoing_requests"] = value
    config["http_options"] = {"host": "127.0.0.1", "port": head.serve_http_port}
    path = head.temp_dir / "bench.json"
    path.write_text(json.dumps(config))
    started = time.monotonic()
    subprocess.run(
        [_ray_bin("serve"), "deploy", str(path), "--address", head.dashboard_url], check=True, capture_output=True
    )
    while effective_moq(head) != value:
        time.sleep(0.05)
    return time.monotonic() - started


def fleetdeck(cluster: Cluster, value: int) -> tuple[float, float]:
    actor = Actor.system(via="cli")
    started = time.monotonic()
    change = protocol.plan_change(
        actor,
        cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"max_ongoing_requests": value},
        reason="benchmark",
    )
    planned = time.monotonic()
    protocol.request_apply(actor, change)
    protocol.run(change.pk)
    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    done = time.monotonic()
    return done - planned, done - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from django.conf import settings

    settings.FLEETDECK_CHANGE_POLL_S = 0.05
    call_command("migrate", verbosity=0)
    head = LocalRayHead.start()
    try:
        head.wait_ready()
        config = demo_config()
        head.deploy(config)
        cluster = Cluster.objects.create(
            name="bench", team=ensure_team("Bench"), dashboard_url=head.dashboard_url, ray_version="2.60.0"
        )
        baseline, apply_times, total_times = [], [], []
        for i in range(args.rounds):
            baseline.append(serve_deploy(head, config, 6 if i % 2 == 0 else 8))
            applied, total = fleetdeck(cluster, 7 if i % 2 == 0 else 5)
            apply_times.append(applied)
            total_times.append(total)
        config_b = statistics.median(baseline)
        print(f"serve deploy → effective (baseline): median {config_b:.3f} s over {args.rounds} rounds")
        apply_median, total_median = statistics.median(apply_times), statistics.median(total_times)
        print(f"fleetdeck apply → verified:           median {apply_median:.3f} s  ratio {apply_median / config_b:.2f}")
        print(f"fleetdeck plan + apply → verified:    median {total_median:.3f} s  ratio {total_median / config_b:.2f}")
    finally:
        head.stop()


if __name__ == "__main__":
    main()
