"""Are the wizard's computed values as good as brute force? For each application on a real Ray
head, the misbehaving config, Ray's defaults, a sweep over max_ongoing_requests × replicas ×
queue bound, and the config the remediation wizard applies, all under one seeded load.

    .venv/bin/python bench/sizing_vs_sweep.py [--app plain|mixed|reference|both|all] [--quick] [--json PATH]

The applications: `plain` (deploy/plain_app, every request the same size), `mixed` (the same app
driven with two kinds of request, a fifth of them `--mixed-heavy-factor` times the memory of the
rest, drawn with the seed in that split; the wizard calibrates with that mix) and `reference`.
`both` is plain and mixed (issue 32's two), `all` adds the reference app.

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
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab_setup import setup_django  # noqa: E402

setup_django()

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
from bench.ray_lab import (  # noqa: E402
    Lab,
    SeededKinds,
    bursty_schedule,
    node_used_bytes,
    numbered,
    observe,
    replay,
    span_s,
)
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
    # Kinds of request, (name, weight, query string): each send draws one (SeededKinds), and the
    # wizard calibrates with them as a mix weighted the same. Empty: one request, as `body` says.
    kinds: tuple[tuple[str, int, str], ...] = ()

    def send(self, serve_url: str, draw: SeededKinds | None = None):
        url = f"{serve_url}{self.path}"
        if self.kinds:
            queries = {name: query for name, _, query in self.kinds}
            return lambda client: client.request(self.method, f"{url}?{queries[draw.next()]}")
        if self.body is None or "prompt" not in self.body:
            return lambda client: client.request(self.method, url, json=self.body)
        return lambda client: client.request(self.method, url, json=numbered(self.body))

    def mix(self) -> list[dict] | None:
        """The calibration's mix: the kinds as the load sends them, shares in percent."""
        if not self.kinds:
            return None
        total = sum(weight for _, weight, _ in self.kinds)
        return [
            {
                "request": {"kind": "http", "method": self.method, "path": self.path, "query": query},
                "share": 100 * weight / total,
            }
            for _, weight, query in self.kinds
        ]

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


def plain_app(args, name: str = "plain", alloc_mb: float | None = None) -> App:
    # As a user would write it: one replica taking 16 at once, nothing bounding its queue.
    config = {
        "applications": [
            {
                "name": name,
                "route_prefix": f"/{name}",
                "import_path": "plain_app:app",
                "runtime_env": {
                    "env_vars": {
                        "PYTHONPATH": str(PLAIN_APP_DIR),
                        "PLAIN_ALLOC_MB": str(args.plain_alloc_mb if alloc_mb is None else alloc_mb),
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
    return App(name=name, deployment="Plain", config=config, method="GET", path=f"/{name}")


def mixed_app(args) -> App:
    """The plain app under two kinds of request through its `?mb=`: 80 % light, 20 % taking
    `--mixed-heavy-factor` times the memory (the same misbehaving config as the plain app's)."""
    light = args.mixed_light_mb
    heavy = round(light * args.mixed_heavy_factor)
    share = round(args.mixed_heavy_share * 100)
    app = plain_app(args, name="mixed", alloc_mb=light)
    return App(
        **{
            **app.__dict__,
            "kinds": (("light", 100 - share, f"mb={light:g}"), ("heavy", share, f"mb={heavy:g}")),
        }
    )


def grid(quick: bool) -> list[tuple[int, int, int]]:
    """(max_ongoing_requests, num_replicas, max_queued_requests), smallest capacity first so an
    OOM prunes everything that admits at least as much."""
    ongoing, replicas = ((1, 2), (1, 2)) if quick else ((1, 2, 4), (1, 2, 3, 4))
    return sorted(((m, r, -1) for m in ongoing for r in replicas), key=lambda a: (a[0] * a[1], a[1]))


def qualifies(figures: dict) -> bool:
    """A sweep arm the wizard is held against (issue 32): no OOM kill. Among those, the best is the
    one with the most successful requests a second."""
    return figures["oom_kills"] == 0


class Bench:
    def __init__(self, lab: Lab, cluster: Cluster, app: App, args) -> None:
        self.lab, self.cluster, self.app, self.args = lab, cluster, app, args
        self.schedule = bursty_schedule(
            args.seed, bursts=args.bursts, period_s=args.period_s, sizes=args.burst_sizes, duration_s=args.burst_s
        )
        self.idle_bytes = node_used_bytes()
        # Every arm sends the same sequence of kinds (light/heavy), restarted at each replay.
        # Weights reduced (80/20 -> 4/1) so every block of five holds exactly one heavy request.
        grain = math.gcd(*(weight for _, weight, _ in app.kinds)) if app.kinds else 1
        self.draw = SeededKinds(args.seed, {name: w // grain for name, w, _ in app.kinds}) if app.kinds else None

    def measure(self) -> dict:
        if self.draw:
            self.draw.restart()
        figures = replay(
            self.lab,
            self.cluster,
            self.schedule,
            self.app.send(self.lab.head.serve_url, self.draw),
            application=self.app.name,
            deployment=self.app.deployment,
            request_timeout_s=self.args.request_timeout_s,
        )
        if self.draw:
            figures["kinds"] = dict(self.draw.counts)
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
        # The operator's objectives when the command gives them; else the wizard suggests its own.
        objectives = {
            key: value
            for key, value in (
                ("latency_objective_ms", self.args.latency_objective_ms),
                ("failure_objective", self.args.failure_objective),
            )
            if value is not None
        }
        wizard = call(api, "post", "/api/v1/wizards/", {"incident": incident.pk, **objectives})
        base = f"/api/v1/wizards/{wizard['id']}"
        mix = self.app.mix()
        # A mixed load is calibrated with its mix whether or not the wizard asks: the mix (its
        # requests and shares) is the one thing the operator states.
        if mix or wizard["diagnosis"].get("needs_calibration") or pending(wizard, "calibration"):
            body = {"revision": wizard["revision"], **({"mix": mix} if mix else {})}
            wizard = call(api, "post", f"{base}/calibrate/", body)
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
                "failure_objective": wizard["failure_objective"],
                "objectives_given": bool(objectives),
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
                mix = [
                    {
                        "label": entry.get("label"),
                        "share": entry.get("share"),
                        "increment_bytes": entry.get("increment_bytes"),
                        "points": entry.get("points"),
                        "limit_reason": entry.get("limit_reason"),
                    }
                    for entry in calibration.mix or []
                ]
                return {
                    "id": calibration.pk,
                    "state": calibration.state,
                    "points": calibration.points,
                    "mix": mix,
                    "mix_peaks": mix_peaks(calibration),
                    "error": calibration.error,
                }
            observe(self.cluster)
            time.sleep(calibrations.poll_interval_s())
        raise RuntimeError(f"calibration {calibration_id} never finished")

    def live_deployment_config(self) -> dict:
        with RayDashboard(self.lab.head.dashboard_url, timeout_s=10) as ray:
            app = ray.serve_applications().applications[self.app.name]
        return next(d for d in app.deployed_app_config["deployments"] if d["name"] == self.app.deployment)


def mix_peaks(calibration) -> dict[int, int]:
    """What sizing reads from a mix that succeeded: a replica's peak at each measured level."""
    if calibration.state != calibration.State.SUCCEEDED or len(calibration.mix or []) < 2:
        return {}
    curve = calibrations.curve_of(calibration)
    return {int(x): curve.mix_peak(int(x)) for x, _ in curve.points}


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


# The memory monitor's headroom above the machine's use before the head, by application. The mixed
# app's calibration measures each request on its own at rising concurrency (8 light ones, 2 heavy
# ones) next to the serving replica and the job's own, under the calibration's stop below the
# kill level: at 3 GiB not one heavy request fitted, at 4 the 8 light ones crossed the stop (a
# mix is calibrated whole or not at all). The misbehaving config still crosses the kill level.
HEADROOM_GIB = {"mixed": 5.0}


def register(lab: Lab, app: App, name: str) -> Cluster:
    """The lab's head registered and synced as `make run` does it, with the app's warmup profile:
    the request a calibration sends when given none (the reference app serves POST only)."""
    cluster = lab.register(name, ensure_team("Bench"))
    observe(cluster)
    if app.warmup:
        application = Application.objects.get(cluster=cluster, name=app.name)
        schedules.save_profile(ACTOR, application, dict(app.warmup))
    return cluster


def run_app(app: App, args, deadline: float) -> dict:
    lab = Lab.start(args.headroom_gib or HEADROOM_GIB.get(app.name, 3.0))
    try:
        lab.deploy(app.config)
        cluster = register(lab, app, f"sweep-{app.name}")
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
                arms["(d) Fleetdeck"] = bench.wizard_arm(operator_client(cluster.team))
            except Exception as exc:  # the other arms are still worth measuring
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


# Issue 32's targets for Fleetdeck's config, against the sweep's best with 0 kills.
FAILED_TARGET = 0.05
GOODPUT_TARGET = 0.9
P99_TARGET = 1.15


def peak_text(f: dict) -> str:
    return (
        f"{f['peak_used_bytes'] / GIB:.2f} / {f['threshold_bytes'] / GIB:.2f} GiB "
        f"({f['peak_used_bytes'] / f['threshold_bytes']:.2f})"
    )


def report(name: str, result: dict) -> dict:
    arms = result["arms"]
    print(f"\n== {name}: memory monitor at {result['threshold_bytes'] / GIB:.2f} GiB ==")
    print("every arm:")
    print(
        f"{'arm':<22} {'OOM':>3} {'failed':>6} {'ok/s':>6} {'p50 s':>6} {'p99 s':>6} {'peak GiB':>8}  sizing; statuses"
    )
    for label, f in arms.items():
        print(
            f"{label:<22} {f['oom_kills']:>3} {f['error_rate']:>6.1%} {f['goodput']:>6.2f} {seconds(f['p50_s']):>6} "
            f"{seconds(f['p99_s']):>6} {f['peak_used_bytes'] / GIB:>8.2f}  {sizing(f['config'])}; {f['statuses']}"
        )
    if result["sweep_cut"]:
        print(f"sweep arms left out by the time budget: {', '.join(result['sweep_cut'])}")
    best = f"(c) {result['sweep_best']}" if result["sweep_best"] else None
    fleetdeck = arms.get("(d) Fleetdeck")
    rows = [
        ("Fleetdeck", fleetdeck),
        (f"sweep's best, 0 kills ({result['sweep_best'] or 'none'})", arms.get(best) if best else None),
        ("Ray's defaults", arms.get("(b) Ray's defaults")),
        ("misbehaving", arms.get("(a) misbehaving")),
    ]
    table = []
    print(f"\n{name}:")
    print("| arm | OOM kills | failed | goodput | p99 | peak memory / kill level |")
    print("|---|---|---|---|---|---|")
    for label, f in rows:
        if f is None:
            print(f"| {label} | not run | | | | |")
            table.append({"arm": label, "run": False})
            continue
        print(
            f"| {label} | {f['oom_kills']} | {f['error_rate']:.1%} | {f['goodput']:.2f} /s | {seconds(f['p99_s'])} s "
            f"| {peak_text(f)} |"
        )
        table.append(
            {
                "arm": label,
                "sizing": sizing(f["config"]),
                "oom_kills": f["oom_kills"],
                "failed": f["error_rate"],
                "goodput": f["goodput"],
                "p99_s": f["p99_s"],
                "peak_used_bytes": f["peak_used_bytes"],
                "threshold_bytes": f["threshold_bytes"],
            }
        )
    out: dict = {"table": table}
    if fleetdeck is None:
        print(f"(d) not run: {result['wizard_skipped']}")
        return out
    wizard = fleetdeck["wizard"]
    calibration = wizard["calibration"]
    if calibration:
        points = ", ".join(f"{p['x']}: {p['peak_bytes'] / 2**20:.0f} MiB" for p in calibration["points"])
        print(
            f"calibration #{calibration['id']} {calibration['state']}: peaks {points or '–'}"
            + (f" {calibration['error']}" if calibration["error"] else "")
        )
        for entry in calibration.get("mix") or []:
            increment = entry["increment_bytes"]
            print(
                f"  mix {entry['label']} {entry['share']:g} %: +{(increment or 0) / 2**20:.0f} MiB a request"
                f"{'; ' + entry['limit_reason'] if entry.get('limit_reason') else ''}"
            )
        if calibration.get("mix_peaks"):
            peaks = ", ".join(f"{c}: {b / 2**20:.0f} MiB" for c, b in calibration["mix_peaks"].items())
            print(f"  mix peaks sizing reads (99.99th percentile): {peaks}")
    print(
        f"Fleetdeck sizing: {sizing(fleetdeck['config'])}; objectives p99 "
        f"{(wizard['latency_objective_ms'] or 0) / 1000:g} s, failed {(wizard['failure_objective'] or 0):.0%} "
        f"({'given on the command line' if wizard.get('objectives_given') else 'the wizard own, no person'}); "
        f"wizard {wizard['state']}"
    )
    if fleetdeck.get("kinds"):
        print(f"requests sent by kind (each arm the same sequence): {fleetdeck['kinds']}")
    reference = arms.get(best) if best else None
    vs_goodput = ratio(fleetdeck["goodput"], reference["goodput"] if reference else None)
    vs_p99 = ratio(fleetdeck["p99_s"], reference["p99_s"] if reference else None)
    targets = {
        "0 OOM kills": (fleetdeck["oom_kills"] == 0, f"{fleetdeck['oom_kills']} kills"),
        "failed <= 5 %": (
            fleetdeck["error_rate"] <= FAILED_TARGET,
            f"{fleetdeck['error_rate']:.1%} ({fleetdeck['error_rate'] / FAILED_TARGET:.2f} of the limit)",
        ),
        "goodput >= 0.9 x sweep's best": (
            vs_goodput is not None and vs_goodput >= GOODPUT_TARGET,
            "no sweep arm without kills" if vs_goodput is None else f"{vs_goodput:.2f} x",
        ),
        "p99 <= 1.15 x sweep's best": (
            vs_p99 is not None and vs_p99 <= P99_TARGET,
            "no sweep arm without kills" if vs_p99 is None else f"{vs_p99:.2f} x",
        ),
    }
    print("targets:")
    for target, (met, measured) in targets.items():
        print(f"  {target}: {measured}: {'met' if met else 'MISSED'}")
    out.update(
        goodput_vs_sweep_best=vs_goodput,
        p99_vs_sweep_best=vs_p99,
        targets={t: {"met": met, "measured": measured} for t, (met, measured) in targets.items()},
    )
    return out


def arm_seconds(args) -> float:
    """The schedule, the last burst's drain, the redeploy and the settling."""
    return (args.bursts - 1) * args.period_s + args.burst_s + 20


# Starting and stopping a head, the calibration and the verification's end.
APP_OVERHEAD_S = 150


def expected_minutes(args, apps: int) -> float:
    return apps * ((3 + len(grid(args.quick))) * arm_seconds(args) + APP_OVERHEAD_S) / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", choices=["plain", "mixed", "reference", "both", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="fewer bursts and a 2×2 grid")
    parser.add_argument("--json", type=Path, default=REPO / "var" / "bench" / "sizing_vs_sweep.json")
    parser.add_argument(
        "--budget-min", type=float, help="sweep arms that would end past it are left out (default 35, quick 10)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--latency-objective-ms", type=int, help="the operator's p99 objective; default: the wizard's suggestion"
    )
    parser.add_argument("--failure-objective", type=float, help="share of requests that may fail, 0 to 1")
    parser.add_argument("--bursts", type=int)
    parser.add_argument("--period-s", type=float, default=15.0)
    parser.add_argument("--burst-s", type=float, default=6.0, help="how long each burst's clients keep sending")
    parser.add_argument("--burst-sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--headroom-gib", type=float, help="default 3, the mixed app 5")
    parser.add_argument("--request-timeout-s", type=float, default=30.0)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--plain-alloc-mb", type=int, default=256)
    parser.add_argument("--plain-hold-s", type=float, default=2.0)
    parser.add_argument("--plain-base-mb", type=int, default=64)
    parser.add_argument("--mixed-light-mb", type=int, default=128, help="what a light request of the mixed app fills")
    parser.add_argument("--mixed-heavy-factor", type=float, default=5.0, help="a heavy request: this × the light")
    parser.add_argument("--mixed-heavy-share", type=float, default=0.2, help="the heavy requests' share of the load")
    args = parser.parse_args()
    args.bursts = args.bursts or (3 if args.quick else 4)
    args.budget_min = args.budget_min or (10 if args.quick else 35)
    from django.conf import settings

    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 180
    call_command("migrate", verbosity=0)
    groups = {"both": ["plain", "mixed"], "all": ["plain", "mixed", "reference"]}
    names = groups.get(args.app, [args.app])
    expected = min(expected_minutes(args, len(names)), args.budget_min)
    print(
        f"sizing vs sweep: {', '.join(names)}; expect about {expected:.0f} min (at most {args.budget_min:g} + one arm)",
        flush=True,
    )
    started = time.monotonic()
    builders = {"reference": reference_app, "plain": plain_app, "mixed": mixed_app}
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
