"""Are the wizard's computed values as good as brute force? For two applications on a real Ray
head, the misbehaving config, Ray's defaults, a sweep over max_ongoing_requests × replicas ×
queue bound, and the config the remediation wizard applies, all under one seeded load.

    .venv/bin/python bench/sizing_vs_sweep.py [--app reference|plain|both] [--quick] [--json PATH]

A private Ray head whose memory monitor trips `--headroom-gib` above what the machine used before
it started stands for a GPU node's memory; each application gets its own head. Every arm replays
the same schedule: bursts of closed-loop clients (each sends one request after another for the
burst's duration), some larger than any config here can hold at once. Fleetdeck watches the
cluster inline as its worker does. The wizard arm starts from the OOM incident of the misbehaving
arm and goes through the REST API with no number chosen by a person: calibrate when it asks to,
re-plan, apply every pending config step, verify under the load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("FLEETDECK_DEBUG", "1")
os.environ.setdefault("FLEETDECK_VAR_DIR", tempfile.mkdtemp(prefix="fleetdeck-bench-"))
os.environ.pop("DATABASE_URL", None)

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from apps.accounts.audit import Actor  # noqa: E402
from apps.accounts.models import Role  # noqa: E402
from apps.accounts.services import ensure_team, grant  # noqa: E402
from apps.calibration import services as calibrations  # noqa: E402
from apps.changes import protocol  # noqa: E402
from apps.clusters.models import Cluster  # noqa: E402
from apps.demo.local_ray import GIB, REFERENCE_APP_DIR, REFERENCE_WARMUP  # noqa: E402
from apps.fleet.models import Application  # noqa: E402
from apps.incidents.models import Incident  # noqa: E402
from apps.maintenance import schedules  # noqa: E402
from apps.remediation.models import Wizard, WizardStep  # noqa: E402
from bench.ray_lab import Lab, bursty_schedule, node_used_bytes, numbered, observe, replay, span_s  # noqa: E402
from integrations.ray.dashboard import RayDashboard  # noqa: E402

PLAIN_APP_DIR = REPO / "deploy" / "plain_app"
SIZING_FIELDS = ("num_replicas", "max_ongoing_requests", "max_queued_requests", "autoscaling_config")
FINAL_WIZARD = {Wizard.State.RESOLVED, Wizard.State.NOT_RESOLVED, Wizard.State.ABANDONED}
ACTOR = Actor.system(via="cli")


@dataclass(frozen=True)
class App:
    name: str
    deployment: str
    config: dict
    method: str
    path: str
    body: dict | None = None
    # Set up on the cluster as an operator would (make run does the same for the reference app).
    warmup: dict | None = None

    def send(self, serve_url: str):
        url = f"{serve_url}{self.path}"
        if self.body is None or "prompt" not in self.body:
            return lambda client: client.request(self.method, url, json=self.body)
        return lambda client: client.request(self.method, url, json=numbered(self.body))

    def with_sizing(self, **fields) -> dict:
        """The starting config with only the deployment's sizing replaced: Serve's defaults for
        every sizing field not given."""
        config = copy.deepcopy(self.config)
        deployment = config["applications"][0]["deployments"][0]
        for key in SIZING_FIELDS:
            deployment.pop(key, None)
        deployment.update(fields)
        return config


def reference_app(args) -> App:
    return App(
        name="reference",
        deployment="Generator",
        config=json.loads((REFERENCE_APP_DIR / "misbehaving.json").read_text()),
        method="POST",
        path="/reference",
        body={"prompt": "x" * args.prompt_chars, "max_tokens": args.max_tokens},
        warmup=REFERENCE_WARMUP,
    )


def plain_app(args) -> App:
    # As a user would write it: one replica taking 16 at once, nothing bounding its queue.
    config = {
        "applications": [
            {
                "name": "plain",
                "route_prefix": "/plain",
                "import_path": "plain_app:app",
                "runtime_env": {
                    "env_vars": {
                        "PYTHONPATH": str(PLAIN_APP_DIR),
                        "PLAIN_ALLOC_MB": str(args.plain_alloc_mb),
                        "PLAIN_HOLD_S": str(args.plain_hold_s),
                        "PLAIN_BASE_MB": str(args.plain_base_mb),
                    }
                },
                "deployments": [
                    {
                        "name": "Plain",
                        "num_replicas": 1,
                        "max_ongoing_requests": 16,
                        "max_queued_requests": -1,
                        "ray_actor_options": {"num_cpus": 0.2},
                    }
                ],
            }
        ]
    }
    return App(name="plain", deployment="Plain", config=config, method="GET", path="/plain")


def grid(quick: bool) -> list[tuple[int, int, int]]:
    """(max_ongoing_requests, num_replicas, max_queued_requests), smallest capacity first so an
    OOM prunes everything that admits at least as much."""
    ongoing, replicas = ((1, 2), (1, 2)) if quick else ((1, 2, 4), (1, 2, 3, 4))
    return sorted(((m, r, -1) for m in ongoing for r in replicas), key=lambda a: (a[0] * a[1], a[1]))


def qualifies(figures: dict) -> bool:
    return figures["oom_kills"] == 0 and figures["error_rate"] <= 0.05


class Bench:
    def __init__(self, lab: Lab, cluster: Cluster, app: App, args) -> None:
        self.lab, self.cluster, self.app, self.args = lab, cluster, app, args
        self.schedule = bursty_schedule(
            args.seed, bursts=args.bursts, period_s=args.period_s, sizes=args.burst_sizes, duration_s=args.burst_s
        )
        self.idle_bytes = node_used_bytes()

    def measure(self) -> dict:
        figures = replay(
            self.lab,
            self.cluster,
            self.schedule,
            self.app.send(self.lab.head.serve_url),
            application=self.app.name,
            deployment=self.app.deployment,
            request_timeout_s=self.args.request_timeout_s,
        )
        self.lab.wait_running(self.app.name)
        self.lab.settle(self.idle_bytes)
        return figures

    def arm(self, label: str, config: dict) -> dict:
        started = time.monotonic()
        self.lab.deploy(config)
        self.lab.settle(self.idle_bytes)
        figures = {"config": config["applications"][0]["deployments"][0], **self.measure()}
        print(f"  {label}: {summary(figures)} ({time.monotonic() - started:.0f} s)", flush=True)
        return figures

    def sweep(self, deadline: float) -> tuple[dict[str, dict], list[str]]:
        """The grid's arms, and those the time budget left out (the largest, run last)."""
        arms: dict[str, dict] = {}
        cut: list[str] = []
        oomed: list[tuple[int, int]] = []
        for ongoing, replicas, _ in grid(self.args.quick):
            if any(ongoing >= m and replicas >= r for m, r in oomed):
                continue
            if time.monotonic() + arm_seconds(self.args) > deadline:
                cut.append(f"{ongoing}×{replicas}")
                continue
            unbounded = self.arm(
                f"sweep {ongoing}×{replicas} queue -1",
                self.app.with_sizing(num_replicas=replicas, max_ongoing_requests=ongoing, max_queued_requests=-1),
            )
            arms[f"{ongoing}×{replicas} q-1"] = unbounded
            if unbounded["oom_kills"]:
                oomed.append((ongoing, replicas))
            # A queue bound never lowers memory (queued requests hold none) and turns waits into
            # 503s: only worth trying where waiting made clients time out.
            elif unbounded["error_rate"] > 0.05 and not self.args.quick:
                bound = ongoing * replicas
                arms[f"{ongoing}×{replicas} q{bound}"] = self.arm(
                    f"sweep {ongoing}×{replicas} queue {bound}",
                    self.app.with_sizing(
                        num_replicas=replicas, max_ongoing_requests=ongoing, max_queued_requests=bound
                    ),
                )
        return arms, cut

    def wizard_arm(self, api: APIClient) -> dict:
        """Fleetdeck's fix for the incident the misbehaving arm opened, every step through the API."""
        started = time.monotonic()
        incident = Incident.objects.filter(
            cluster=self.cluster, deployment_name=self.app.deployment, kind="oom_kill"
        ).first()
        if incident is None:
            raise RuntimeError(
                "the misbehaving config was never OOM-killed: lower --headroom-gib or raise the burst sizes"
            )
        wizard = call(api, "post", "/api/v1/wizards/", {"incident": incident.pk})
        base = f"/api/v1/wizards/{wizard['id']}"
        if wizard["diagnosis"].get("needs_calibration") or pending(wizard, "calibration"):
            wizard = call(api, "post", f"{base}/calibrate/", {"revision": wizard["revision"]})
            calibration = self.calibrate(wizard)
            wizard = call(api, "post", f"{base}/replan/", {"revision": wizard["revision"]})
        else:
            calibration = None
        positions = [s["position"] for s in pending(wizard, "config")]
        if not positions:
            raise RuntimeError(f"the wizard proposed no config step: {json.dumps(wizard['steps'])[:2000]}")
        call(api, "post", f"{base}/apply/", {"revision": wizard["revision"], "steps": positions})
        wizard = call(api, "get", f"{base}/")
        for change_id in {s["change"] for s in wizard["steps"] if s["position"] in positions}:
            protocol.run(change_id)
        wizard = call(api, "get", f"{base}/")
        failed = [s for s in wizard["steps"] if s["position"] in positions and s["change_state"] != "succeeded"]
        if failed:
            raise RuntimeError(f"the wizard's change did not succeed: {failed}")
        self.lab.wait_running(self.app.name)
        self.lab.settle(self.idle_bytes)
        applied = self.live_deployment_config()
        window_s = max(30, int(span_s(self.schedule)))
        wizard = call(api, "post", f"{base}/verify/", {"revision": wizard["revision"], "window_s": window_s})
        figures = self.measure()
        deadline = time.monotonic() + window_s + 120
        while wizard["state"] not in FINAL_WIZARD and time.monotonic() < deadline:
            observe(self.cluster)
            wizard = call(api, "post", f"{base}/evaluate/")
            if wizard["state"] not in FINAL_WIZARD:
                time.sleep(5)
        figures.update(
            config=applied,
            wizard={
                "id": wizard["id"],
                "state": wizard["state"],
                "outcome": wizard["outcome"],
                "latency_objective_ms": wizard["latency_objective_ms"],
                "calibration": calibration,
                "steps": [
                    {k: s[k] for k in ("position", "kind", "remedy", "status", "patch", "values")}
                    for s in wizard["steps"]
                ],
                "memory": wizard["diagnosis"].get("memory"),
                "budget": wizard["diagnosis"].get("budget"),
            },
        )
        print(
            f"  Fleetdeck: {summary(figures)}; wizard {wizard['state']} ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
        return figures

    def calibrate(self, wizard: dict) -> dict:
        position = next(s["position"] for s in wizard["steps"] if s["kind"] == "calibration")
        calibration_id = WizardStep.objects.get(wizard_id=wizard["id"], position=position).calibration_id
        deadline = time.monotonic() + calibrations.timeout_s() + 60
        while time.monotonic() < deadline:
            calibration = calibrations.poll(calibration_id)
            if calibration.is_final:
                return {
                    "id": calibration.pk,
                    "state": calibration.state,
                    "points": calibration.points,
                    "error": calibration.error,
                }
            observe(self.cluster)
            time.sleep(calibrations.poll_interval_s())
        raise RuntimeError(f"calibration {calibration_id} never finished")

    def live_deployment_config(self) -> dict:
        with RayDashboard(self.lab.head.dashboard_url, timeout_s=10) as ray:
            app = ray.serve_applications().applications[self.app.name]
        return next(d for d in app.deployed_app_config["deployments"] if d["name"] == self.app.deployment)


def pending(wizard: dict, kind: str) -> list[dict]:
    return [
        s
        for s in wizard["steps"]
        if s["kind"] == kind and s["status"] == WizardStep.Status.PENDING and (kind != "config" or s["patch"])
    ]


def call(api: APIClient, method: str, path: str, body: dict | None = None) -> dict:
    response = getattr(api, method)(path, body, format="json")
    if response.status_code >= 300:
        raise RuntimeError(f"{method.upper()} {path} answered {response.status_code}: {response.content[:2000]!r}")
    return response.json()


def operator_client(team) -> APIClient:
    user, _ = get_user_model().objects.get_or_create(username="bench-operator")
    grant(ACTOR, user, team, Role.OPERATOR)
    # The URLconf's host check: the test client's default host is not an allowed one.
    api = APIClient(HTTP_HOST="localhost")
    api.force_authenticate(user)
    return api


def seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "–"


def summary(figures: dict) -> str:
    return (
        f"{figures['oom_kills']} OOM, {figures['error_rate']:.1%} errors {figures['statuses']}, "
        f"{figures['goodput']:.2f} ok/s, p50 {seconds(figures['p50_s'])} s, p99 {seconds(figures['p99_s'])} s, "
        f"peak {figures['peak_used_bytes'] / GIB:.2f}/{figures['threshold_bytes'] / GIB:.2f} GiB"
    )


def sizing(config: dict) -> str:
    parts = [f"{key}={config[key]}" for key in SIZING_FIELDS if key in config]
    return ", ".join(parts) or "Serve's defaults"


def run_app(app: App, args, deadline: float) -> dict:
    lab = Lab.start(args.headroom_gib)
    try:
        lab.deploy(app.config)
        team = ensure_team("Bench")
        cluster = lab.register(f"sweep-{app.name}", team)
        observe(cluster)
        if app.warmup:
            application = Application.objects.get(cluster=cluster, name=app.name)
            schedules.save_profile(ACTOR, application, dict(app.warmup))
        bench = Bench(lab, cluster, app, args)
        print(
            f"\n{app.name}: threshold {lab.threshold_bytes / GIB:.2f} GiB "
            f"(node at {bench.idle_bytes / GIB:.2f} GiB idle); "
            f"schedule {[(b.at_s, b.clients, b.duration_s) for b in bench.schedule]}",
            flush=True,
        )
        arms = {"(a) misbehaving": bench.arm("(a) misbehaving", app.config)}
        skipped = None
        if not wizard_api_exists():
            skipped = "the wizard's calibrate endpoint does not exist yet"
        else:
            # Right after (a): the wizard sizes from the incident and the config that caused it.
            try:
                arms["(d) Fleetdeck"] = bench.wizard_arm(operator_client(team))
            except Exception as exc:  # noqa: BLE001 - the other arms are still worth measuring
                skipped = f"the wizard arm failed: {type(exc).__name__}: {exc}"[:2000]
                print(f"  (d) {skipped}", flush=True)
                lab.wait_running(app.name)
        arms["(b) Ray's defaults"] = bench.arm("(b) Ray's defaults", app.with_sizing(num_replicas=1))
        sweep, cut = bench.sweep(deadline)
        arms.update({f"(c) {name}": figures for name, figures in sweep.items()})
        return {
            "threshold_bytes": lab.threshold_bytes,
            "idle_bytes": bench.idle_bytes,
            "wizard_skipped": skipped,
            "sweep_cut": cut,
            "schedule": [b.__dict__ for b in bench.schedule],
            "arms": arms,
            "sweep_best": max(
                (n for n, f in sweep.items() if qualifies(f)), key=lambda n: sweep[n]["goodput"], default=None
            ),
        }
    finally:
        lab.stop()


def wizard_api_exists() -> bool:
    from apps.remediation.api import WizardViewSet

    return hasattr(WizardViewSet, "calibrate")


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def report(name: str, result: dict) -> dict:
    arms = result["arms"]
    print(f"\n== {name}: memory monitor at {result['threshold_bytes'] / GIB:.2f} GiB ==")
    print(
        f"{'arm':<22} {'OOM':>3} {'errors':>6} {'ok/s':>6} {'p50 s':>6} {'p99 s':>6} {'peak GiB':>8}  sizing; statuses"
    )
    for label, f in arms.items():
        print(
            f"{label:<22} {f['oom_kills']:>3} {f['error_rate']:>6.1%} {f['goodput']:>6.2f} {seconds(f['p50_s']):>6} "
            f"{seconds(f['p99_s']):>6} {f['peak_used_bytes'] / GIB:>8.2f}  {sizing(f['config'])}; {f['statuses']}"
        )
    best = f"(c) {result['sweep_best']}" if result["sweep_best"] else None
    print(f"sweep best: {best or 'none qualifies (0 OOM, ≤ 5 % errors)'}")
    if result["sweep_cut"]:
        print(f"sweep arms left out by the time budget: {', '.join(result['sweep_cut'])}")
    targets: dict = {}
    fleetdeck = arms.get("(d) Fleetdeck")
    if fleetdeck is None:
        print(f"(d) not run: {result['wizard_skipped']}")
        return targets
    calibration = fleetdeck["wizard"]["calibration"]
    if calibration:
        points = ", ".join(f"{p['x']}: {p['peak_bytes'] / 2**20:.0f} MiB" for p in calibration["points"])
        print(
            f"(d) calibration #{calibration['id']} {calibration['state']}: peaks {points or '–'} {calibration['error']}"
        )
    print(f"(d) wizard: {fleetdeck['wizard']['outcome']}")
    objective_s = fleetdeck["wizard"]["latency_objective_ms"] / 1000
    vs_best = ratio(fleetdeck["goodput"], arms[best]["goodput"] if best else None)
    vs_defaults = ratio(fleetdeck["goodput"], arms["(b) Ray's defaults"]["goodput"])
    targets = {
        "oom_kills == 0": fleetdeck["oom_kills"] == 0,
        "errors <= 5 %": fleetdeck["error_rate"] <= 0.05,
        f"p99 <= objective {objective_s:g} s": fleetdeck["p99_s"] is not None and fleetdeck["p99_s"] <= objective_s,
        "goodput >= 0.85 × sweep best": vs_best is not None and vs_best >= 0.85,
        "goodput >= 1.1 × Ray's defaults": vs_defaults is not None and vs_defaults >= 1.1,
    }
    print(
        f"goodput (d)/(c best) = {'–' if vs_best is None else f'{vs_best:.2f}'}, "
        f"(d)/(b) = {'–' if vs_defaults is None else f'{vs_defaults:.2f}'}; wizard {fleetdeck['wizard']['state']}"
    )
    for target, met in targets.items():
        print(f"  [{'x' if met else ' '}] {target}")
    return {"goodput_vs_sweep_best": vs_best, "goodput_vs_defaults": vs_defaults, "targets": targets}


def arm_seconds(args) -> float:
    """The schedule, the last burst's drain, the redeploy and the settling."""
    return (args.bursts - 1) * args.period_s + args.burst_s + 20


# Starting and stopping a head, the calibration and the verification's end.
APP_OVERHEAD_S = 150


def expected_minutes(args, apps: int) -> float:
    return apps * ((3 + len(grid(args.quick))) * arm_seconds(args) + APP_OVERHEAD_S) / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", choices=["reference", "plain", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="fewer bursts and a 2×2 grid")
    parser.add_argument("--json", type=Path, default=REPO / "var" / "bench" / "sizing_vs_sweep.json")
    parser.add_argument(
        "--budget-min", type=float, help="sweep arms that would end past it are left out (default 35, quick 10)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--bursts", type=int)
    parser.add_argument("--period-s", type=float, default=15.0)
    parser.add_argument("--burst-s", type=float, default=6.0, help="how long each burst's clients keep sending")
    parser.add_argument("--burst-sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--headroom-gib", type=float, default=3.0)
    parser.add_argument("--request-timeout-s", type=float, default=30.0)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--plain-alloc-mb", type=int, default=256)
    parser.add_argument("--plain-hold-s", type=float, default=2.0)
    parser.add_argument("--plain-base-mb", type=int, default=64)
    args = parser.parse_args()
    args.bursts = args.bursts or (3 if args.quick else 4)
    args.budget_min = args.budget_min or (10 if args.quick else 35)
    from django.conf import settings

    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 180
    call_command("migrate", verbosity=0)
    names = ["plain", "reference"] if args.app == "both" else [args.app]
    expected = min(expected_minutes(args, len(names)), args.budget_min)
    print(
        f"sizing vs sweep: {', '.join(names)}; expect about {expected:.0f} min (at most {args.budget_min:g} + one arm)",
        flush=True,
    )
    started = time.monotonic()
    builders = {"reference": reference_app, "plain": plain_app}
    # Each application gets an equal share of what the budget has left when it starts.
    results: dict[str, dict] = {}
    output = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "apps": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        share = (started + args.budget_min * 60 - time.monotonic()) / (len(names) - i)
        results[name] = run_app(builders[name](args), args, time.monotonic() + share - APP_OVERHEAD_S / 3)
        output["run_s"] = time.monotonic() - started
        # Written after each application, so a failure in the next one loses nothing measured.
        args.json.write_text(json.dumps(output, indent=2, default=str))
    for name, result in results.items():
        result.update(report(name, result))
    args.json.write_text(json.dumps(output, indent=2, default=str))
    print(f"\nran {output['run_s'] / 60:.1f} min; results in {args.json}")


if __name__ == "__main__":
    main()
