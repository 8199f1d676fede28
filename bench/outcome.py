"""The headline figure: the reference app's misbehaving configuration under a reproducible bursty
load on a real Ray cluster, as shipped, after Fleetdeck's heavy preset, and after the remediation
wizard's computed values.

    .venv/bin/python bench/outcome.py [--bursts 6] [--burst-size 12] [--headroom-gib 5]

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
from apps.calibration import services as calibrations  # noqa: E402
from apps.changes import protocol  # noqa: E402
from apps.changes.models import Preset  # noqa: E402
from apps.clusters.models import Cluster  # noqa: E402
from apps.demo.local_ray import REFERENCE_APP_DIR, REFERENCE_WARMUP  # noqa: E402
from apps.fleet.models import Application  # noqa: E402
from apps.incidents.models import Incident  # noqa: E402
from apps.maintenance import schedules  # noqa: E402
from apps.remediation import wizards  # noqa: E402
from bench.ray_lab import Burst, Lab, numbered, observe, replay  # noqa: E402

TARGET = [{"application": "reference", "deployment": "Generator"}]
ACTOR = Actor.system(via="cli")


def replay_schedule(lab: Lab, cluster: Cluster, args) -> dict:
    body = {"prompt": "x" * args.prompt_chars, "max_tokens": args.max_tokens}
    schedule = [Burst(at_s=i * args.period_s, clients=args.burst_size) for i in range(args.bursts)]
    return replay(
        lab,
        cluster,
        schedule,
        lambda client: client.post(f"{lab.head.serve_url}/reference", json=numbered(body)),
        application="reference",
        deployment="Generator",
        request_timeout_s=args.request_timeout_s,
    )


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
        raise RuntimeError(
            "the original configuration was never OOM-killed: raise --burst-size or lower --headroom-gib"
        )
    wizard, _ = wizards.start(ACTOR, incident=incident)
    if wizard.diagnosis.get("needs_calibration"):
        # The wizard computes nothing before it has measured: its calibration step, run inline.
        run = wizards.calibrate(ACTOR, wizard, revision=None).calibration
        deadline = time.monotonic() + 600
        while not run.is_final:
            if time.monotonic() > deadline:
                raise RuntimeError(f"calibration #{run.pk} did not finish in 10 minutes")
            time.sleep(2)
            run = calibrations.poll(run.pk)
        if run.state != "succeeded":
            raise RuntimeError(f"calibration #{run.pk} {run.state}: {run.error}")
        wizards.settle_calibration(wizard.pk)
        wizard.refresh_from_db()
    steps = [s for s in wizard.steps.filter(kind="config", status="pending") if s.patch]
    options: dict = {}
    for step in steps:
        for key, value in step.patch.items():
            options[key] = (
                {**options[key], **value} if isinstance(value, dict) and isinstance(options.get(key), dict) else value
            )
    reasons = {s.remedy: s.values.get("reasons", {}) for s in steps}
    return options, {
        "memory": wizard.diagnosis.get("memory"),
        "budget": wizard.diagnosis.get("budget"),
        "reasons": reasons,
    }


def row(name: str, figures: dict, baseline: dict) -> str:
    def ratio(key):
        if figures[key] is None or not baseline[key]:
            return "  –  "
        return f"{figures[key] / baseline[key]:5.2f}"

    p50 = f"{figures['p50_s']:.2f}" if figures["p50_s"] is not None else "–"
    p99 = f"{figures['p99_s']:.2f}" if figures["p99_s"] is not None else "–"
    return (
        f"{name:<28} {figures['oom_kills']:>4} {p50:>7} {p99:>7} ({ratio('p99_s')}) {figures['error_rate']:>6.1%} "
        f"{figures['goodput']:>6.2f} ({ratio('goodput')})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--burst-size", type=int, default=12)
    parser.add_argument("--period-s", type=float, default=15.0)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--headroom-gib", type=float, default=5.0)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    from django.conf import settings

    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 180
    call_command("migrate", verbosity=0)
    lab = Lab.start(args.headroom_gib)
    try:
        lab.head.deploy(json.loads((REFERENCE_APP_DIR / "misbehaving.json").read_text()))
        cluster = lab.register("outcome", ensure_team("Bench"))
        observe(cluster)
        # As make run does: the warmup request is also what a calibration of the app sends.
        schedules.save_profile(
            ACTOR, Application.objects.get(cluster=cluster, name="reference"), dict(REFERENCE_WARMUP)
        )
        arms = {"original (misbehaving.json)": replay_schedule(lab, cluster, args)}
        lab.wait_running("reference")

        apply(cluster, preset=Preset.objects.get(slug="heavy-gpu-model"))
        lab.wait_running("reference")
        arms["heavy preset"] = replay_schedule(lab, cluster, args)
        lab.wait_running("reference")

        options, why = wizard_values(cluster)
        apply(cluster, options=options)
        lab.wait_running("reference")
        arms["heavy preset + wizard values"] = replay_schedule(lab, cluster, args)

        # The original arm usually serves nothing at all, so ratios are to the preset arm.
        baseline = arms["heavy preset"]
        print(
            f"\nSchedule: {args.bursts} bursts of {args.burst_size} requests every {args.period_s:g} s "
            f"({args.prompt_chars} characters, {args.max_tokens} tokens each); memory monitor trips "
            f"{args.headroom_gib:g} GiB above the machine's usage before the cluster started."
        )
        print(f"Wizard's values: {json.dumps(options)}")
        print(f"  memory: {why['memory']}")
        print(f"  budget: {why['budget']}")
        print(f"\n{'arm':<28} {'OOM':>4} {'p50 s':>7} {'p99 s':>7} (÷preset) {'errors':>6} {'ok/s':>6} (÷preset)")
        for name, figures in arms.items():
            print(row(name, figures, baseline))
        for name, figures in arms.items():
            print(f"  {name}: {figures['ok']}/{figures['requests']} ok, client saw {figures['statuses']}")
    finally:
        lab.stop()


if __name__ == "__main__":
    main()
