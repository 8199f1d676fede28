"""What the real-cluster benchmarks share: a private Ray head whose memory monitor trips a few GiB
above what the machine used before it started (the stand-in for a GPU node's memory), a seeded
bursty closed-loop load, Fleetdeck watching the cluster inline the way its worker does, and what
the clients, Ray's state API and the node saw meanwhile.

Import this after `django.setup()`.
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from apps.clusters.models import Cluster
from apps.demo.local_ray import LocalRayHead, memory_monitor_env, memory_usage, threshold_for_headroom
from apps.fleet import sync
from apps.incidents import ingest
from apps.incidents import services as incidents
from apps.incidents.oom import oom_kills
from integrations.ray.dashboard import RayDashboard
from integrations.ray.errors import RayError


def node_used_bytes() -> int:
    return memory_usage()[0]


_PROMPT_NUMBERS, _PROMPT_LOCK = itertools.count(), threading.Lock()


def numbered(body: dict) -> dict:
    """`body` with a prompt no request of this run sent before, as long as the original: an app's
    answer cache must never stand in for its model, and an arm that only changes sizing keeps its
    replicas, and their cache, from the arm before."""
    with _PROMPT_LOCK:
        n = next(_PROMPT_NUMBERS)
    return {**body, "prompt": f"{n:08d} {body['prompt']}"[: len(body["prompt"])]}


def observe(cluster: Cluster) -> None:
    """One pass of what the worker does for a cluster: sync, OOM evidence, metrics."""
    sync.sync_cluster(cluster.pk)
    incidents.detect(cluster.pk)
    ingest.collect_metrics(cluster.pk)


@dataclass
class Lab:
    head: LocalRayHead
    threshold_fraction: float

    @classmethod
    def start(cls, headroom_gib: float, extra_env: dict[str, str] | None = None) -> Lab:
        threshold = threshold_for_headroom(headroom_gib)
        head = LocalRayHead.start(extra_env={**memory_monitor_env(threshold), **(extra_env or {})})
        try:
            head.wait_ready()
        except BaseException:
            head.stop()
            raise
        return cls(head=head, threshold_fraction=threshold)

    @property
    def threshold_bytes(self) -> int:
        return int(memory_usage()[1] * self.threshold_fraction)

    def register(self, name: str, team) -> Cluster:
        head = self.head
        return Cluster.objects.create(
            name=name,
            team=team,
            dashboard_url=head.dashboard_url,
            ray_version="2.60.0",
            serve_url=head.serve_url,
            metrics_url=f"http://127.0.0.1:{head.ports['metrics-export-port']}/metrics",
        )

    def killed(self, application: str, deployment: str) -> set[str]:
        """Replica actors of that deployment that Ray's memory monitor killed, ever."""
        for attempt in range(3):
            try:
                with RayDashboard(self.head.dashboard_url, timeout_s=10) as ray:
                    page = ray.list_actors(filters=[("state", "=", "DEAD")], detail=True, limit=10_000)
                break
            except RayError:
                # Right after a kill the dashboard can be too busy to answer once.
                if attempt == 2:
                    raise
                time.sleep(5)
        return {k.actor_id for k in oom_kills(page.items) if (k.application, k.deployment) == (application, deployment)}

    def deploy(self, config: dict, timeout_s: float = 180) -> None:
        try:
            self.head.deploy(config, timeout_s=timeout_s)
        except RayError:
            self.wait_running(config["applications"][0]["name"], timeout_s=timeout_s)

    def wait_running(self, application: str, timeout_s: float = 180) -> None:
        """Back to RUNNING, which after an OOM kill takes the Serve controller's restart; a
        dashboard too busy to answer in time is asked again."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.head.wait_running({application}, timeout_s=max(deadline - time.monotonic(), 1))
            except RayError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def settle(self, baseline_bytes: int, *, slack_bytes: int = 256 * 2**20, timeout_s: float = 30) -> None:
        """Wait until the node's memory is back near `baseline_bytes`, so one arm's leftovers do
        not count against the next arm's headroom."""
        deadline = time.monotonic() + timeout_s
        while node_used_bytes() > baseline_bytes + slack_bytes and time.monotonic() < deadline:
            time.sleep(1)

    def stop(self) -> None:
        self.head.stop()


class MemorySampler:
    """The node's peak memory while it runs, sampled as often as the memory monitor looks."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, node_used_bytes())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Burst:
    """`clients` clients start at `at_s`; each sends one request after another until
    `at_s + duration_s` (at least one request each), as a closed loop. A client whose request
    failed waits `RETRY_AFTER_S` before the next, as client libraries do: without it, a proxy
    that refuses connections turns the clients into a busy loop that starves the node."""

    at_s: float
    clients: int
    duration_s: float = 0.0


def bursty_schedule(seed: int, *, bursts: int, period_s: float, sizes: list[int], duration_s: float) -> list[Burst]:
    """The same schedule for every arm: burst sizes drawn from `sizes` with `seed`, every size
    appearing once before any repeats, so the largest burst is always in it."""
    rng = random.Random(seed)
    drawn: list[int] = []
    while len(drawn) < bursts:
        drawn += rng.sample(sizes, len(sizes))
    return [Burst(at_s=i * period_s, clients=n, duration_s=duration_s) for i, n in enumerate(drawn[:bursts])]


class SeededKinds:
    """Which kind of request each send of a replay is, the same sequence for every arm: `weights`
    (kind -> integer weight, e.g. {"light": 4, "heavy": 1}) drawn with `seed` in blocks where every
    kind appears exactly its weight, each block shuffled, so the split holds within every few
    requests. `restart()` before each replay; `counts` is what the last replay sent."""

    def __init__(self, seed: int, weights: dict[str, int]) -> None:
        self.seed, self.weights = seed, dict(weights)
        self._lock = threading.Lock()
        self.restart()

    def restart(self) -> None:
        with self._lock:
            self._rng = random.Random(self.seed)
            self._block: list[str] = []
            self.counts: Counter = Counter()

    def next(self) -> str:
        with self._lock:
            if not self._block:
                self._block = [kind for kind, weight in self.weights.items() for _ in range(weight)]
                self._rng.shuffle(self._block)
            kind = self._block.pop()
            self.counts[kind] += 1
            return kind


def span_s(schedule: list[Burst]) -> float:
    return max(b.at_s + b.duration_s for b in schedule)


Send = Callable[[httpx.Client], httpx.Response]
RETRY_AFTER_S = 0.5


def replay(
    lab: Lab,
    cluster: Cluster,
    schedule: list[Burst],
    send: Send,
    *,
    application: str,
    deployment: str,
    request_timeout_s: float = 120.0,
) -> dict:
    """Play `schedule` with `send`; Fleetdeck observes meanwhile. Returns what the clients, Ray
    and the node saw."""
    before = lab.killed(application, deployment)
    results: list[tuple[float, str]] = []
    lock = threading.Lock()
    clients = max(b.clients for b in schedule)
    client = httpx.Client(timeout=request_timeout_s, limits=httpx.Limits(max_connections=clients * len(schedule)))

    def loop(until: float) -> None:
        while True:
            started = time.monotonic()
            try:
                status = str(send(client).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            with lock:
                results.append((time.monotonic() - started, status))
            if time.monotonic() >= until:
                return
            if status != "200":
                time.sleep(RETRY_AFTER_S)

    threads = []
    started = time.monotonic()
    with MemorySampler() as memory:
        for burst in schedule:
            while time.monotonic() < started + burst.at_s:
                observe(cluster)
                time.sleep(max(min(1.0, started + burst.at_s - time.monotonic()), 0))
            for _ in range(burst.clients):
                thread = threading.Thread(target=loop, args=(started + burst.at_s + burst.duration_s,), daemon=True)
                thread.start()
                threads.append(thread)
        while any(t.is_alive() for t in threads):
            observe(cluster)
            time.sleep(1)
        elapsed = time.monotonic() - started
    client.close()
    observe(cluster)
    ok = sorted(latency for latency, status in results if status == "200")
    return {
        "oom_kills": len(lab.killed(application, deployment) - before),
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_rate": (len(results) - len(ok)) / len(results),
        "statuses": dict(sorted(Counter(status for _, status in results).items())),
        "p50_s": statistics.median(ok) if ok else None,
        "p99_s": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "goodput": len(ok) / elapsed,
        "elapsed_s": elapsed,
        "peak_used_bytes": memory.peak_bytes,
        "threshold_bytes": lab.threshold_bytes,
    }
