"""Fleetdeck's scaler against Serve's own autoscaler and the best fixed config, on a real Ray head
under open-loop bursty traffic (issue 37).

    .venv/bin/python bench/scaler_vs_builtin.py [--app plain|reference|both] [--shapes ...] [--quick] [--json PATH]

One private Ray head per application, whose memory monitor trips `--headroom-gib` above what the
machine used before it started (the stand-in for a GPU node's memory), exporting metrics every
second (`RAY_metrics_report_interval_ms=1000`, as docs/operations.md tells operators who let
Fleetdeck scale). Each shape is an open-loop schedule drawn once with the seed: Poisson arrivals at a
rate that changes with time, every arm sent the same requests at the same moments whatever it
answers, none retried. The shapes: `bursts` (two square bursts above what memory holds), `ramp`
(up to that rate and back down), `flash` (a long near-idle, then a flash crowd) and `mixed` (the
bursts, a fifth of the requests `--heavy-factor` times the memory of the rest).

Before the arms, the application's own config (one replica taking 16 at once, nothing bounding its
queue) plays the bursts shape until Ray's memory monitor kills it: that incident is where the
wizard starts, and its kill message tells Fleetdeck where the monitor kills. The arms:

- (A) the best fixed config a sweep found on the bursts shape (no OOM kill, then the most goodput),
  every sweep config with a queue bound of twice its request slots;
- (B) Serve's autoscaler with Ray's defaults (`num_replicas: auto`);
- (B') Serve's autoscaler as Fleetdeck's wizard sizes it from that incident and a calibration,
  applied through the REST API and the change protocol;
- (C) Fleetdeck's scaler, taken into control through the change protocol (external_scaler_enabled),
  deciding at each metrics reading as the worker's tick does and setting the count through Ray's
  scale API. It reads what the wizard measured: the calibration, B''s concurrency and queue bound.

Every arm starts every shape from a fresh deploy, so its replica count starts where its config
starts it. Printed per shape and arm: OOM kills, 503s and other failures, goodput, p50/p99 at the
client, replica-seconds (replicas alive, starting included, integrated over the shape), seconds from
each burst's start to the first new replica RUNNING, and direction reversals of the replica target;
then C's ratios to A, B and B' and issue 37's targets, met or missed.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab_setup import setup_django  # noqa: E402

setup_django()

import httpx  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from apps.calibration import services as calibrations  # noqa: E402
from apps.changes import protocol  # noqa: E402
from apps.changes.models import Change, ChangeState  # noqa: E402
from apps.clusters.models import Cluster  # noqa: E402
from apps.demo.local_ray import GIB  # noqa: E402
from apps.fleet.models import Deployment  # noqa: E402
from apps.incidents.models import Incident, OomKillRecord, ScrapeState, SignalWindow  # noqa: E402
from apps.remediation.models import WizardStep  # noqa: E402
from apps.scaler import control, shadow  # noqa: E402
from apps.scaler import policy as policies  # noqa: E402
from apps.scaler.models import Scaler, ScalerDecision  # noqa: E402
from apps.scaler.services import create_shadow_scaler  # noqa: E402
from bench.ray_lab import Lab, MemorySampler, SeededKinds, node_used_bytes, numbered, observe  # noqa: E402
from bench.sizing_vs_sweep import (  # noqa: E402
    ACTOR,
    App,
    call,
    operator_client,
    pending,
    plain_app,
    reference_app,
    register,
)
from integrations.ray.dashboard import RayDashboard  # noqa: E402
from integrations.ray.errors import RayError  # noqa: E402

ARMS = ("(C) Fleetdeck's scaler", "(B') Serve, sized by Fleetdeck", "(A) best fixed", "(B) Serve, Ray's defaults")
C, B_SIZED, A, B = ARMS
# Issue 37's targets for C on the burst and flash-crowd shapes, against A.
BURST_SHAPES = ("bursts", "flash")
FAILED_VS_A, P99_VS_A, REPLICA_S_VS_A = 0.5, 0.8, 0.75
# Replica states that hold a node's memory and resources: every one but those on their way out.
GONE = {"STOPPING"}


# --- the load ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A rate over time: `segments` of (start s, end s, rate at start, rate at end), linear in
    between; `bursts` are the moments the load steps or starts to ramp up."""

    name: str
    span_s: float
    segments: tuple[tuple[float, float, float, float], ...]
    bursts: tuple[float, ...]
    mixed: bool = False

    def rate(self, t: float) -> float:
        for start, end, r0, r1 in self.segments:
            if start <= t < end:
                return r0 + (r1 - r0) * (t - start) / (end - start)
        return 0.0

    @property
    def peak_rate(self) -> float:
        return max(max(r0, r1) for _, _, r0, r1 in self.segments)

    def arrivals(self, seed: int) -> list[tuple[float, str]]:
        """(second, kind) of each request: Poisson arrivals at `rate` (Lewis-Shedler thinning),
        kinds drawn 4 light to 1 heavy in shuffled blocks when the shape is mixed."""
        rng = random.Random(f"{seed}/{self.name}")
        kinds = SeededKinds(seed, {"light": 4, "heavy": 1}) if self.mixed else None
        t, out = 0.0, []
        while True:
            t += rng.expovariate(self.peak_rate)
            if t >= self.span_s:
                return out
            if rng.random() * self.peak_rate < self.rate(t):
                out.append((round(t, 3), kinds.next() if kinds else "light"))


def shapes(args) -> dict[str, Shape]:
    s, lo, hi = args.shape_s, args.calm_rps, args.burst_rps
    idle = lo / 5
    square = ((0, 0.15 * s, lo, lo), (0.15 * s, 0.4 * s, hi, hi), (0.4 * s, 0.6 * s, lo, lo))
    square += ((0.6 * s, 0.85 * s, hi, hi), (0.85 * s, s, lo, lo))
    return {
        "bursts": Shape("bursts", s, square, (0.15 * s, 0.6 * s)),
        "ramp": Shape("ramp", s, ((0, 0.5 * s, lo, hi), (0.5 * s, s, hi, lo)), (0.0,)),
        "flash": Shape(
            "flash", s, ((0, 0.6 * s, idle, idle), (0.6 * s, 0.9 * s, hi, hi), (0.9 * s, s, lo, lo)), (0.6 * s,)
        ),
        "mixed": Shape("mixed", s, square, (0.15 * s, 0.6 * s), mixed=True),
    }


def sender(app: App, serve_url: str, args):
    """How one request of a kind is sent: the plain app's `?mb=` (light: `--light-mb`, heavy:
    `--heavy-factor` times it; a shape that is not mixed sends the app's own size), the reference
    app's prompt `--heavy-factor` times longer."""
    url = f"{serve_url}{app.path}"
    if app.body is None:

        def plain(client: httpx.Client, kind: str, mixed: bool) -> httpx.Response:
            if not mixed:
                return client.get(url)
            mb = args.light_mb * (args.heavy_factor if kind == "heavy" else 1)
            return client.get(url, params={"mb": f"{mb:g}"})

        return plain

    def reference(client: httpx.Client, kind: str, mixed: bool) -> httpx.Response:
        body = numbered(app.body)
        if mixed and kind == "heavy":
            body["prompt"] = body["prompt"] * int(args.heavy_factor)
        return client.post(url, json=body)

    return reference


def mixed_calibration(app: App, args) -> list[dict]:
    """The mixed shape's traffic as a calibration mix (`--mix`): its light and heavy requests, as
    `sender` sends them, weighted 4 to 1 as SeededKinds draws them."""
    light = {"kind": "http", "method": app.method, "path": app.path}
    if app.body is None:
        light["query"] = f"mb={args.light_mb:g}"
        heavy = {**light, "query": f"mb={args.light_mb * args.heavy_factor:g}"}
    else:
        light["json"] = app.body
        heavy = {**light, "json": {**app.body, "prompt": app.body["prompt"] * int(args.heavy_factor)}}
    return [{"request": light, "share": 80}, {"request": heavy, "share": 20}]


# --- watching what Serve runs ----------------------------------------------------------------


class ReplicaWatch:
    """The deployment's replicas as Serve reports them, twice a second: (second, running, alive,
    target). Its own dashboard client: it runs beside the database work of the main thread."""

    def __init__(self, dashboard_url: str, application: str, deployment: str, interval_s: float = 0.5) -> None:
        self.url, self.application, self.deployment, self.interval_s = (
            dashboard_url,
            application,
            deployment,
            interval_s,
        )
        self.samples: list[tuple[float, int, int, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = 0.0

    def _run(self) -> None:
        with RayDashboard(self.url, timeout_s=5) as ray:
            while not self._stop.is_set():
                try:
                    app = ray.serve_applications().applications.get(self.application)
                except RayError:
                    app = None
                dep = app.deployments.get(self.deployment) if app else None
                if dep is not None:
                    states = Counter(r.state for r in dep.replicas)
                    alive = sum(n for state, n in states.items() if state not in GONE)
                    self.samples.append(
                        (time.monotonic() - self.started, states.get("RUNNING", 0), alive, dep.target_num_replicas)
                    )
                self._stop.wait(self.interval_s)

    def __enter__(self) -> ReplicaWatch:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def replica_seconds(self, until: float) -> float:
        total = 0.0
        for (t0, _, alive, _), (t1, _, _, _) in zip(
            self.samples, [*self.samples[1:], (until, 0, 0, None)], strict=True
        ):
            total += alive * max(min(t1, until) - t0, 0)
        return total

    def first_new_running(self, at: float, until: float) -> float | None:
        """Seconds from `at` until more replicas ran than at `at`; None if none did before `until`."""
        before = [running for t, running, _, _ in self.samples if t <= at] or [r for _, r, _, _ in self.samples[:1]]
        base = before[-1] if before else 0
        return next((t - at for t, running, _, _ in self.samples if at < t <= until and running > base), None)

    def reversals(self) -> int:
        """Changes of direction of the target: up then down (or down then up) is one."""
        targets = [target for _, _, _, target in self.samples if target is not None]
        steps = [b - a for a, b in itertools.pairwise(targets) if b != a]
        return sum(1 for a, b in itertools.pairwise(steps) if (a > 0) != (b > 0))

    def most(self) -> int:
        return max((alive for _, _, alive, _ in self.samples), default=0)


# --- one arm, one shape ----------------------------------------------------------------------


def play(lab: Lab, cluster: Cluster, app: App, shape: Shape, arrivals, send, args, tick=None) -> dict:
    """Send `arrivals` on time from a dispatcher thread; meanwhile Fleetdeck observes the cluster
    every `--observe-s` (and `tick` decides, for the scaler's arm). What the clients, Ray and
    the node saw."""
    before = lab.killed(app.name, app.deployment)
    results: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    client = httpx.Client(timeout=args.request_timeout_s, limits=httpx.Limits(max_connections=1024))
    senders: list[threading.Thread] = []

    def one(kind: str) -> None:
        started = time.monotonic()
        try:
            status = str(send(client, kind, shape.mixed).status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        with lock:
            results.append((time.monotonic() - started, status, kind))

    def dispatch(start: float) -> None:
        for at, kind in arrivals:
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            thread = threading.Thread(target=one, args=(kind,), daemon=True)
            thread.start()
            senders.append(thread)

    watch = ReplicaWatch(lab.head.dashboard_url, app.name, app.deployment)
    with MemorySampler() as memory, watch:
        start = time.monotonic()
        dispatcher = threading.Thread(target=dispatch, args=(start,), daemon=True)
        dispatcher.start()
        while dispatcher.is_alive() or any(t.is_alive() for t in list(senders)):
            due = time.monotonic() + args.observe_s
            observe(cluster)
            if tick is not None:
                tick()
            time.sleep(max(due - time.monotonic(), 0))
        ended = time.monotonic() - start
    client.close()
    observe(cluster)
    ok = sorted(latency for latency, status, _ in results if status == "200")
    statuses = Counter(status for _, status, _ in results)
    failed = len(results) - len(ok)
    firsts = [
        watch.first_new_running(at, nxt)
        for at, nxt in zip(shape.bursts, [*shape.bursts[1:], shape.span_s], strict=True)
    ]
    return {
        "oom_kills": len(lab.killed(app.name, app.deployment) - before),
        "requests": len(results),
        "ok": len(ok),
        "shed_503": statuses.get("503", 0),
        "other_failures": failed - statuses.get("503", 0),
        "failed": failed / len(results) if results else 0.0,
        "statuses": dict(sorted(statuses.items())),
        "goodput": len(ok) / shape.span_s,
        "p50_s": statistics.median(ok) if ok else None,
        "p99_s": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "replica_s": watch.replica_seconds(ended),
        "most_replicas": watch.most(),
        "first_new_running_s": firsts,
        "reversals": watch.reversals(),
        "ran_s": ended,
        "peak_used_bytes": memory.peak_bytes,
        "threshold_bytes": lab.threshold_bytes,
        "kinds": dict(Counter(kind for _, _, kind in results)) if shape.mixed else None,
    }


def fresh(lab: Lab, config: dict) -> None:
    """Remove the application, then deploy `config`: an arm's replica count (and Serve's
    autoscaling state) starts where its config starts it, not where the last arm left it."""
    lab.deploy({"applications": []}, timeout_s=120)
    lab.deploy(config)


# --- what the arms run -----------------------------------------------------------------------


def deployment_of(config: dict) -> dict:
    return config["applications"][0]["deployments"][0]


def sized_config(app: App, live: dict) -> dict:
    """The application's config with the deployment's sizing as the wizard left it live."""
    config = copy.deepcopy(app.config)
    deployment = deployment_of(config)
    for key in ("num_replicas", "max_ongoing_requests", "max_queued_requests", "autoscaling_config"):
        deployment.pop(key, None)
        if live.get(key) is not None:
            deployment[key] = live[key]
    if isinstance(deployment.get("autoscaling_config"), dict):
        deployment.pop("num_replicas", None)
    return config


def scaled_config(sized: dict, start: int) -> dict:
    """B''s config handed to an outside scaler, as the scaler's activation change makes it."""
    config = copy.deepcopy(sized)
    config["applications"][0]["external_scaler_enabled"] = True
    deployment = deployment_of(config)
    deployment.pop("autoscaling_config", None)
    deployment["num_replicas"] = start
    return config


class Bench:
    def __init__(self, lab: Lab, cluster: Cluster, app: App, args) -> None:
        self.lab, self.cluster, self.app, self.args = lab, cluster, app, args
        self.send = sender(app, lab.head.serve_url, args)
        self.shapes = shapes(args)
        self.arrivals = {name: shape.arrivals(args.seed) for name, shape in self.shapes.items()}
        self.idle_bytes = node_used_bytes()
        self.scaler: Scaler | None = None
        self.start = 1

    def run(self, label: str, config: dict, shape: str, tick=None, reset=None) -> dict:
        started = time.monotonic()
        try:
            fresh(self.lab, config)
        except (RayError, RuntimeError, TimeoutError):
            # A config Serve cannot start (or a head still busy with the last arm's kills).
            self.lab.wait_running(self.app.name)
        self.lab.settle(self.idle_bytes)
        observe(self.cluster)
        if reset is not None:
            reset()
        figures = play(
            self.lab, self.cluster, self.app, self.shapes[shape], self.arrivals[shape], self.send, self.args, tick
        )
        figures["config"] = deployment_of(config)
        print(f"  {shape:<6} {label:<32} {line(figures)} ({time.monotonic() - started:.0f} s)", flush=True)
        return figures

    # (0) and (B'): the incident and the wizard's sizing.

    def incident(self) -> dict:
        figures = self.run("as deployed (1 × 16, no queue bound)", self.app.config, "bursts")
        if not Incident.objects.filter(
            cluster=self.cluster, deployment_name=self.app.deployment, kind="oom_kill"
        ).exists():
            raise RuntimeError(
                "the application's own config was never OOM-killed: lower --headroom-gib or raise --burst-rps"
            )
        return figures

    def wizard_sizing(self) -> tuple[dict, dict]:
        """B''s config: what the wizard applies for the incident, every step through the REST API."""
        api = operator_client(self.cluster.team)
        incident = Incident.objects.filter(
            cluster=self.cluster, deployment_name=self.app.deployment, kind="oom_kill"
        ).first()
        objectives = {"latency_objective_ms": self.args.latency_objective_ms} if self.args.latency_objective_ms else {}
        wizard = call(api, "post", "/api/v1/wizards/", {"incident": incident.pk, **objectives})
        base = f"/api/v1/wizards/{wizard['id']}"
        if wizard["diagnosis"].get("needs_calibration") or pending(wizard, "calibration"):
            body = {"revision": wizard["revision"]}
            if self.args.mix:
                body["mix"] = mixed_calibration(self.app, self.args)
            wizard = call(api, "post", f"{base}/calibrate/", body)
            self.await_calibration(wizard)
            wizard = call(api, "post", f"{base}/replan/", {"revision": wizard["revision"]})
        positions = [s["position"] for s in pending(wizard, "config")]
        if not positions:
            raise RuntimeError(f"the wizard proposed no config step: {json.dumps(wizard['steps'])[:2000]}")
        call(api, "post", f"{base}/apply/", {"revision": wizard["revision"], "steps": positions})
        wizard = call(api, "get", f"{base}/")
        for change_id in {s["change"] for s in wizard["steps"] if s["position"] in positions}:
            protocol.run(change_id)
        self.lab.wait_running(self.app.name)
        with RayDashboard(self.lab.head.dashboard_url, timeout_s=10) as ray:
            live_app = ray.serve_applications().applications[self.app.name]
        live = next(d for d in live_app.deployed_app_config["deployments"] if d["name"] == self.app.deployment)
        about = {
            "wizard": wizard["id"],
            "latency_objective_ms": wizard["latency_objective_ms"],
            "memory": wizard["diagnosis"].get("memory"),
            "budget": wizard["diagnosis"].get("budget"),
        }
        return sized_config(self.app, live), about

    def await_calibration(self, wizard: dict) -> None:
        position = next(s["position"] for s in wizard["steps"] if s["kind"] == "calibration")
        calibration_id = WizardStep.objects.get(wizard_id=wizard["id"], position=position).calibration_id
        deadline = time.monotonic() + calibrations.timeout_s() + 60
        while time.monotonic() < deadline:
            calibration = calibrations.poll(calibration_id)
            if calibration.is_final:
                points = ", ".join(f"{p['x']}: {p['peak_bytes'] / 2**20:.0f} MiB" for p in calibration.points or [])
                print(f"  calibration #{calibration.pk} {calibration.state}: {points} {calibration.error}", flush=True)
                return
            observe(self.cluster)
            time.sleep(calibrations.poll_interval_s())
        raise RuntimeError(f"calibration {calibration_id} never finished")

    # (A): the sweep.

    def sweep(self, grid: list[tuple[int, int]]) -> tuple[dict, dict[str, dict]]:
        """Fixed configs on the bursts shape, fewest request slots first; a config at least as
        large as one that was OOM-killed is skipped (it admits at least as much)."""
        arms: dict[str, dict] = {}
        oomed: list[tuple[int, int]] = []
        for ongoing, replicas in sorted(grid, key=lambda g: (g[0] * g[1], g[1])):
            if any(ongoing >= m and replicas >= r for m, r in oomed):
                continue
            config = self.app.with_sizing(
                num_replicas=replicas, max_ongoing_requests=ongoing, max_queued_requests=2 * ongoing * replicas
            )
            figures = self.run(f"sweep {replicas} × {ongoing}, queue {2 * ongoing * replicas}", config, "bursts")
            figures["full_config"] = config
            arms[f"{replicas}×{ongoing}"] = figures
            if figures["oom_kills"]:
                oomed.append((ongoing, replicas))
        safe = {name: f for name, f in arms.items() if not f["oom_kills"]}
        if not safe:
            raise RuntimeError(f"every fixed config of the sweep was OOM-killed: {list(arms)}")
        best = max(safe, key=lambda name: (safe[name]["goodput"], -safe[name]["failed"]))
        return safe[best]["full_config"], arms

    # (C): the scaler.

    def take_control(self, sized: dict) -> dict:
        """Create the deployment's scaler and hand it the count through the change protocol, from
        B''s config running: what an operator does with the scaler card's buttons."""
        fresh(self.lab, sized)
        observe(self.cluster)
        deployment = Deployment.objects.get(
            application__cluster=self.cluster, application__name=self.app.name, name=self.app.deployment
        )
        self.scaler = create_shadow_scaler(
            ACTOR,
            deployment,
            min_replicas=self.args.scaler_min,
            max_replicas=self.args.scaler_max,
            latency_objective_ms=self.args.latency_objective_ms,
        )
        built = policies.build(self.scaler)
        if built.policy is None:
            raise RuntimeError(f"the scaler cannot decide: {built.why_not}")
        change = control.activate(ACTOR, self.scaler)
        protocol.run(change.pk)
        change = Change.objects.get(pk=change.pk)
        if change.state != ChangeState.SUCCEEDED:
            raise RuntimeError(f"the scaler's activation change {change.pk} {change.state}: {change.error}")
        self.scaler.refresh_from_db()
        print(
            f"  scaler #{self.scaler.pk} {self.scaler.mode}: {built.policy.concurrency} a replica at "
            f"{built.policy.service_s:.2f} s, replicas {self.scaler.min_replicas}–{self.scaler.max_replicas}, "
            f"memory ceiling {built.policy.memory_ceiling} ({built.ceiling_reason})",
            flush=True,
        )
        return {"policy": built.policy.__dict__, "ceiling_reason": built.ceiling_reason, "change": change.pk}

    def reset_scaler(self) -> None:
        """Each shape starts the scaler as activation leaves it: at its starting count, no decision
        yet, and the signals of this deploy only. Kills of other arms stay on record (they tell where
        the monitor kills) but are moved out of the window in which a kill stops scale-ups."""
        assert self.scaler is not None
        deployment = self.scaler.deployment
        SignalWindow.objects.filter(
            cluster=self.cluster, application_name=self.app.name, deployment_name=deployment.name
        ).delete()
        ScrapeState.objects.filter(cluster=self.cluster).delete()
        OomKillRecord.objects.filter(incident__cluster=self.cluster).update(seen_at=timezone.now() - timedelta(hours=2))
        ScalerDecision.objects.filter(scaler=self.scaler).delete()
        Scaler.objects.filter(pk=self.scaler.pk).update(
            mode=Scaler.Mode.ACTIVE, attention="", target=self.start, evaluated_at=timezone.now()
        )
        # Two scrapes make the first reading: the scaler never starts without one.
        observe(self.cluster)
        time.sleep(1.5)
        observe(self.cluster)

    def decide(self) -> None:
        assert self.scaler is not None
        shadow.evaluate(self.scaler.pk)

    def decisions(self) -> dict:
        assert self.scaler is not None
        rows = list(ScalerDecision.objects.filter(scaler=self.scaler).order_by("at", "id"))
        return {
            "by_kind": dict(Counter(r.kind for r in rows)),
            "sent": sum(1 for r in rows if r.applied),
            "errors": sorted({r.error for r in rows if r.error}),
            "moves": [f"{r.current}->{r.target} {r.kind}: {r.reason}" for r in rows if r.target != r.current][:8],
            "mode": Scaler.objects.get(pk=self.scaler.pk).mode,
        }


# --- the report ------------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "–"


def firsts_text(values: list[float | None]) -> str:
    return " / ".join(f"{v:.1f}" if v is not None else "–" for v in values)


def line(f: dict) -> str:
    return (
        f"{f['oom_kills']} OOM, {f['shed_503']} × 503, {f['other_failures']} other, failed {f['failed']:.1%}, "
        f"{f['goodput']:.2f} ok/s, p50 {seconds(f['p50_s'])} s, p99 {seconds(f['p99_s'])} s, "
        f"{f['replica_s']:.0f} replica-s (most {f['most_replicas']}), "
        f"new replica after {firsts_text(f['first_new_running_s'])} s, "
        f"{f['reversals']} reversal(s), peak {f['peak_used_bytes'] / GIB:.2f}/{f['threshold_bytes'] / GIB:.2f} GiB"
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratio_text(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "–"


def targets(shape: str, arms: dict[str, dict]) -> dict[str, tuple[bool, str]]:
    """Issue 37's targets for C on one shape."""
    c, a, b_sized = arms[C], arms[A], arms[B_SIZED]
    better_failed = min(a["failed"], b_sized["failed"])
    p99s = [f["p99_s"] for f in (a, b_sized) if f["p99_s"] is not None]
    out = {
        "0 OOM kills": (c["oom_kills"] == 0, f"{c['oom_kills']}"),
        "failed <= better of A and B'": (c["failed"] <= better_failed, f"{c['failed']:.1%} vs {better_failed:.1%}"),
        "p99 <= better of A and B'": (
            c["p99_s"] is not None and bool(p99s) and c["p99_s"] <= min(p99s),
            f"{seconds(c['p99_s'])} vs {seconds(min(p99s) if p99s else None)} s",
        ),
        "replica-s <= B''s": (
            c["replica_s"] <= b_sized["replica_s"],
            f"{c['replica_s']:.0f} vs {b_sized['replica_s']:.0f}",
        ),
    }
    if shape in BURST_SHAPES:
        out["failed <= 0.5 x A's"] = (
            c["failed"] <= FAILED_VS_A * a["failed"],
            f"{c['failed']:.1%} vs {a['failed']:.1%}",
        )
        p99 = ratio(c["p99_s"], a["p99_s"])
        out["p99 <= 0.8 x A's"] = (p99 is not None and p99 <= P99_VS_A, ratio_text(p99))
        rs = ratio(c["replica_s"], a["replica_s"])
        out["replica-s <= 0.75 x A's"] = (rs is not None and rs <= REPLICA_S_VS_A, ratio_text(rs))
    return out


def report(name: str, result: dict) -> None:
    print(f"\n== {name}: memory monitor at {result['threshold_bytes'] / GIB:.2f} GiB ==")
    print(f"A, the sweep's best fixed config: {sizing_text(result['fixed'])}")
    print(f"B', Serve's autoscaler as Fleetdeck sizes it: {sizing_text(result['sized'])}")
    print(f"C, Fleetdeck's scaler: {result['scaler']['policy']}")
    for shape, arms in result["shapes"].items():
        print(f"\n{name}, {shape}:")
        print(
            "| arm | OOM kills | 503 | other failed | failed | goodput | p50 | p99 | replica-s "
            "| new replica after | reversals |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for label in ARMS:
            f = arms.get(label)
            if f is None:
                print(f"| {label} | not run | | | | | | | | | |")
                continue
            print(
                f"| {label} | {f['oom_kills']} | {f['shed_503']} | {f['other_failures']} | {f['failed']:.1%} "
                f"| {f['goodput']:.2f} /s | {seconds(f['p50_s'])} s | {seconds(f['p99_s'])} s | {f['replica_s']:.0f} "
                f"| {firsts_text(f['first_new_running_s'])} s | {f['reversals']} |"
            )
        if not all(label in arms for label in (C, A, B_SIZED)):
            continue
        c = arms[C]
        for label in (A, B, B_SIZED):
            f = arms.get(label)
            if f is None:
                continue
            print(
                f"C / {label}: failed {ratio_text(ratio(c['failed'], f['failed']))}, p99 "
                f"{ratio_text(ratio(c['p99_s'], f['p99_s']))}, "
                f"replica-s {ratio_text(ratio(c['replica_s'], f['replica_s']))}, "
                f"goodput {ratio_text(ratio(c['goodput'], f['goodput']))}"
            )
        checks = targets(shape, arms)
        arms["targets"] = {t: {"met": met, "measured": measured} for t, (met, measured) in checks.items()}
        print(
            "targets: "
            + "; ".join(f"{t}: {measured} {'met' if met else 'MISSED'}" for t, (met, measured) in checks.items())
        )
        if c.get("decisions"):
            print(
                f"C's decisions: {c['decisions']['by_kind']}, {c['decisions']['sent']} sent; "
                f"{c['decisions']['moves'][:3]}"
            )


def sizing_text(config: dict) -> str:
    d = deployment_of(config)
    return ", ".join(
        f"{k}={d[k]}"
        for k in ("num_replicas", "max_ongoing_requests", "max_queued_requests", "autoscaling_config")
        if k in d
    )


# --- the run ---------------------------------------------------------------------------------


def run_app(app: App, args, output: dict) -> dict:
    lab = Lab.start(args.headroom_gib, extra_env={"RAY_metrics_report_interval_ms": "1000"})
    result: dict = {"shapes": {}}
    output["apps"][app.name] = result
    try:
        lab.deploy(app.config)
        cluster = register(lab, app, f"scaler-{app.name}")
        bench = Bench(lab, cluster, app, args)
        result.update(threshold_bytes=lab.threshold_bytes, idle_bytes=bench.idle_bytes)
        print(
            f"\n{app.name}: kill level {lab.threshold_bytes / GIB:.2f} GiB "
            f"(node at {bench.idle_bytes / GIB:.2f} GiB idle); "
            f"arrivals per shape { ({n: len(a) for n, a in bench.arrivals.items()}) }",
            flush=True,
        )
        result["as_deployed"] = bench.incident()
        sized, result["wizard"] = bench.wizard_sizing()
        result["sized"] = sized
        result["scaler"] = bench.take_control(sized)
        bench.start = bench.scaler.target or bench.scaler.min_replicas
        scaled = scaled_config(sized, bench.start)
        result["scaled"] = scaled
        if args.fixed:
            replicas, ongoing, bound = args.fixed
            result["fixed"], result["sweep"] = (
                app.with_sizing(num_replicas=replicas, max_ongoing_requests=ongoing, max_queued_requests=bound),
                {},
            )
        else:
            result["fixed"], result["sweep"] = bench.sweep(args.grid)
        save(args, output)
        for shape in args.shapes:
            arms = result["shapes"].setdefault(shape, {})
            if C in args.arms:
                arms[C] = bench.run(C, scaled, shape, tick=bench.decide, reset=bench.reset_scaler)
                arms[C]["decisions"] = bench.decisions()
            if B_SIZED in args.arms:
                arms[B_SIZED] = bench.run(B_SIZED, sized, shape)
            if A in args.arms:
                arms[A] = bench.run(A, result["fixed"], shape)
            if B in args.arms:
                arms[B] = bench.run(B, app.with_sizing(num_replicas="auto"), shape)
            save(args, output)
        return result
    finally:
        lab.stop()


def save(args, output: dict) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(output, indent=2, default=str))


def grid_arg(text: str) -> list[tuple[int, int]]:
    """ "2x2,3x2" -> [(ongoing, replicas)]: replicas × max_ongoing_requests."""
    out = []
    for item in text.split(","):
        replicas, ongoing = (int(v) for v in item.lower().split("x"))
        out.append((ongoing, replicas))
    return out


def fixed_arg(text: str) -> tuple[int, int, int]:
    """ "2x4/16" -> (replicas, ongoing, queue bound)."""
    shape, _, bound = text.partition("/")
    replicas, ongoing = (int(v) for v in shape.lower().split("x"))
    return replicas, ongoing, int(bound) if bound else 2 * replicas * ongoing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", choices=["plain", "reference", "both"], default="both")
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=["bursts", "ramp", "flash", "mixed"],
        default=["bursts", "ramp", "flash", "mixed"],
    )
    parser.add_argument("--quick", action="store_true", help="40 s shapes and a sweep of two configs")
    parser.add_argument("--json", type=Path, default=REPO / "var" / "bench" / "scaler_vs_builtin.json")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shape-s", type=float, default=60.0, help="each shape's length")
    parser.add_argument("--calm-rps", type=float, default=0.4)
    parser.add_argument("--burst-rps", type=float, default=4.5, help="more than memory lets any config serve")
    parser.add_argument(
        "--grid",
        type=grid_arg,
        default=None,
        help="the sweep's fixed configs, replicas×ongoing (default 2x2,3x2,2x4,4x2,3x4)",
    )
    parser.add_argument(
        "--fixed",
        type=fixed_arg,
        help="A's config instead of a sweep, replicas×ongoing/queue bound (e.g. 2x4/16): to re-run the other arms",
    )
    parser.add_argument(
        "--arms", nargs="+", choices=["C", "B'", "A", "B"], default=["C", "B'", "A", "B"], help="the arms to run"
    )
    parser.add_argument("--headroom-gib", type=float, default=4.0)
    parser.add_argument(
        "--observe-s", type=float, default=2.0, help="how often Fleetdeck reads the cluster (and C decides)"
    )
    parser.add_argument("--request-timeout-s", type=float, default=30.0)
    parser.add_argument("--latency-objective-ms", type=int, default=None, help="the operator's p99 objective")
    parser.add_argument(
        "--scaler-min", type=int, default=1, help="the scaler's floor (R11 sizes it as the calm's need: 1 here)"
    )
    parser.add_argument("--scaler-max", type=int, default=8)
    parser.add_argument(
        "--mix",
        action="store_true",
        help="calibrate B' and C with the mixed shape's requests as a mix (4 light to 1 heavy), as an operator "
        "who knows the traffic does; without it the wizard calibrates one request",
    )
    parser.add_argument("--light-mb", type=float, default=128.0)
    parser.add_argument("--heavy-factor", type=float, default=5.0)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--plain-alloc-mb", type=int, default=256)
    parser.add_argument("--plain-hold-s", type=float, default=2.0)
    parser.add_argument("--plain-base-mb", type=int, default=64)
    args = parser.parse_args()
    args.arms = [next(label for label in ARMS if label.startswith(f"({arm})")) for arm in args.arms]
    if args.quick:
        args.shape_s = min(args.shape_s, 40.0)
    args.grid = args.grid or (grid_arg("2x2,2x4") if args.quick else grid_arg("2x2,3x2,2x4,4x2,3x4"))
    from django.conf import settings

    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 180
    call_command("migrate", verbosity=0)
    names = ["plain", "reference"] if args.app == "both" else [args.app]
    runs = len(names) * (2 + len(args.grid) + 4 * len(args.shapes))
    print(
        f"scaler vs builtin: {', '.join(names)}; {runs} runs of about {args.shape_s + 35:.0f} s and a calibration each",
        flush=True,
    )
    builders = {"plain": plain_app, "reference": reference_app}
    output: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "apps": {}}
    started = time.monotonic()
    for name in names:
        run_app(builders[name](args), args, output)
        output["run_s"] = time.monotonic() - started
        save(args, output)
    for name, result in output["apps"].items():
        report(name, result)
    save(args, output)
    print(f"\nran {output['run_s'] / 60:.1f} min; results in {args.json}")


if __name__ == "__main__":
    main()
