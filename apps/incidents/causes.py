"""Ranking suspected causes of an OOM kill from what Fleetdeck knows. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from apps.core.catalogue import cause
from apps.fleet.request_sizes import GROWTH as SIZE_GROWTH


@dataclass(frozen=True)
class OomContext:
    kills: int
    max_ongoing_requests: int | None
    autoscaling_target: float | None
    minutes_since_change: float | None  # a change or recycle on the cluster touching this app
    change_label: str
    nodes_with_several_kills: list[str]
    controller_killed: bool


@dataclass(frozen=True)
class RecentChange:
    """A change Fleetdeck pushed to the cluster shortly before a kill."""

    label: str
    at: datetime
    # The Ray session its config was first seen running in; "" while no sync has seen it.
    session: str = ""
    # When its rolling update was over (verified, or its rollback finished); None while it runs.
    ended_at: datetime | None = None
    # Whether it started new replicas at all: Serve reconfigures most options in place.
    replaced_replicas: bool = True


@dataclass(frozen=True)
class ClusterHistory:
    """What can have replaced a change's replicas or config since it was pushed."""

    session: str  # the session the kill happened in
    restarts: tuple[datetime, ...] = ()  # when a sync saw a new session
    foreign_revisions: tuple[datetime, ...] = ()  # the application's config revisions that Fleetdeck did not make
    killed_at: datetime | None = None  # when the kill came


# Serve stops an old replica gracefully after its successor is healthy (graceful_shutdown_timeout_s,
# 20 s by default, plus its wait loop): both versions' memory may be held that long after a
# rolling update verified.
OLD_REPLICAS_LINGER = timedelta(minutes=1)


def change_in_effect(changes: list[RecentChange], history: ClusterHistory) -> tuple[RecentChange | None, list[str]]:
    """The latest change that can still explain a kill, and why each later one cannot. A rolling
    update doubles replicas only while it runs: once it was over (and the old replicas gone) only
    one version was alive, after a cluster restart every replica started again without it, and
    after a config revision Fleetdeck did not make the replicas run that config instead."""
    not_counted = []
    for change in sorted(changes, key=lambda c: c.at, reverse=True):
        why = _superseded(change, history)
        if why is None:
            return change, not_counted
        not_counted.append(f"{change.label[:1].upper()}{change.label[1:]} is not counted: {why}")
    return None, not_counted


def _superseded(change: RecentChange, history: ClusterHistory) -> str | None:
    if not change.replaced_replicas:
        return (
            "it changed only options Serve applies to the running replicas (concurrency, queue, autoscaling, "
            "user_config), so it started no new replicas and no two versions were alive together."
        )
    if change.session and history.session and change.session != history.session:
        return f"it ran on Ray session {change.session}, and the cluster has restarted since (now {history.session})."
    # Without a session seen for the change, a restart recorded after it is the evidence.
    restarts = [t for t in history.restarts if t > change.at]
    if not change.session and restarts:
        return (
            f"the cluster restarted {_minutes(min(restarts) - change.at)} after it; every replica started again since."
        )
    replaced = [t for t in history.foreign_revisions if t > change.at]
    if replaced:
        return (
            f"{_minutes(min(replaced) - change.at)} after it, the application's config changed outside Fleetdeck; "
            "its replicas run that config now."
        )
    if change.ended_at and history.killed_at and change.ended_at + OLD_REPLICAS_LINGER < history.killed_at:
        return (
            f"its rolling update was over {_minutes(history.killed_at - change.ended_at)} before the kill, so no "
            "replicas of two versions were alive together."
        )
    return None


def _minutes(delta) -> str:
    minutes = delta.total_seconds() / 60
    return f"{minutes:.0f} min" if minutes >= 1 else "less than a minute"


def rank_oom_causes(ctx: OomContext) -> list[dict]:
    found: list[tuple[int, str, str]] = []
    if ctx.minutes_since_change is not None:
        found.append(
            (
                0,
                "OOM-7",
                f"The kill came {ctx.minutes_since_change:.0f} min after {ctx.change_label}: a rolling update starts "
                "new replicas before the old ones free their memory.",
            )
        )
    concurrency = ctx.max_ongoing_requests
    if concurrency is not None and concurrency > 2:
        found.append(
            (
                1,
                "OOM-2",
                f"Each replica accepts up to {concurrency} requests at once (max_ongoing_requests {concurrency}); "
                "memory peaks multiply with requests in flight.",
            )
        )
    if ctx.nodes_with_several_kills:
        found.append(
            (
                2,
                "OOM-4",
                f"Several replicas were killed together on {', '.join(ctx.nodes_with_several_kills)}: replicas per "
                "node times model size may exceed the node.",
            )
        )
    low = concurrency is not None and concurrency <= 2
    found.append(
        (
            3 if not low else 1,
            "OOM-1",
            "Concurrency is already low, so single requests are large (long inputs, big batches, binary bodies)."
            if low
            else "Large requests (long inputs, big batches, binary bodies) raise the peak of every request in flight.",
        )
    )
    found.append((4, "OOM-5", "If memory grew slowly before the kill, the allocator kept it: recycle on a schedule."))
    found.sort(key=lambda item: item[0])
    return [cause(cause_id, reason, rank) for rank, (_, cause_id, reason) in enumerate(found, start=1)]


def severity(kills: int, controller_killed: bool) -> str:
    if kills >= 3 or controller_killed:
        return "critical"
    return "major" if kills == 2 else "warning"


@dataclass(frozen=True)
class LatencyContext:
    cold_start: bool
    queue_building: bool
    ongoing: float
    queued: float
    max_ongoing_requests: int | None
    running_replicas: int | None
    at_max_replicas: bool
    memory_pressure: bool
    kv_cache_full: bool = False  # a serve.llm engine's KV cache at 95 % or more
    preemptions: float = 0.0  # sequences its engines preempted in the recent readings
    # (p90 request size during the spike, p90 before it) and its unit, where the sizes are counted.
    sizes_p90: tuple[float, float] | None = None
    size_unit: str = ""


def rank_latency_causes(ctx: LatencyContext) -> list[dict]:
    found: list[tuple[int, str, str]] = []
    if ctx.cold_start:
        found.append(
            (
                0,
                "LAT-1",
                "Replicas started just before or during the spike: first requests pay for model load and warmup.",
            )
        )
    saturated = (
        ctx.max_ongoing_requests
        and ctx.running_replicas
        and ctx.ongoing >= ctx.max_ongoing_requests * ctx.running_replicas
    )
    if ctx.queue_building or ctx.queued > 0 or saturated:
        where = (
            "with replicas at the autoscaling maximum"
            if ctx.at_max_replicas
            else "faster than the autoscaler adds replicas"
        )
        found.append(
            (
                0 if not ctx.cold_start else 1,
                "LAT-2",
                f"{ctx.queued:.0f} requests queued and {ctx.ongoing:.0f} in flight: the queue grows {where}.",
            )
        )
    if ctx.kv_cache_full or ctx.preemptions:
        found.append(
            (
                0,
                "LAT-9",
                f"The engine's KV cache was {'full' if ctx.kv_cache_full else 'short'}"
                f"{f' and it preempted {ctx.preemptions:.0f} sequence(s)' if ctx.preemptions else ''}: requests wait "
                "for cache blocks, and preempted ones start their prefill again.",
            )
        )
    if ctx.memory_pressure:
        found.append(
            (2, "LAT-6", "A node is above 90 % memory: collection and memory-pressure pauses slow every request.")
        )
    if not found or (ctx.queued == 0 and not ctx.cold_start):
        found.append(
            (
                3,
                "LAT-3",
                "Latency rose while requests were not queued: work may block the replica's event loop or threads.",
            )
        )
    found.append(_payload_cause(ctx))
    found.sort(key=lambda item: item[0])
    return [cause(cause_id, reason, rank) for rank, (_, cause_id, reason) in enumerate(found, start=1)]


def _payload_cause(ctx: LatencyContext) -> tuple[int, str, str]:
    """LAT-4: ranked with the first causes when the requests grew during the spike, else last, with
    the sizes that rule it out where they are counted."""
    if ctx.sizes_p90 is None:
        return (
            4,
            "LAT-4",
            "If large payloads arrived during the spike, serialization dominates: keep blobs out of request bodies.",
        )
    during, before = ctx.sizes_p90
    sizes = f"p90 {during:,.0f} {ctx.size_unit} during the spike against {before:,.0f} before"
    if during >= SIZE_GROWTH * before:
        return (
            1,
            "LAT-4",
            f"Requests were larger during the spike ({sizes}): each one costs more to read, serialize and compute. "
            "Cap the input size and keep blobs out of request bodies.",
        )
    return 4, "LAT-4", f"Request sizes did not grow ({sizes}): large payloads are unlikely to be the cause."


def rank_engine_stuck_causes() -> list[dict]:
    return [
        cause(
            "LLM-1",
            "Requests wait in the engine and no token is generated, while the replica answers its health check: "
            "the engine core died or hangs under a live replica. Restarting the replica (a recycle) brings a new "
            "engine; a health check that asks the engine for a token catches it next time.",
            1,
        )
    ]


def rank_pressure_causes(busy: list[tuple[str, str, int]]) -> list[dict]:
    """Memory near the limit, before anything is killed: what on the cluster can multiply memory."""
    found = []
    if busy:
        names = ", ".join(f"{app}/{dep} ({n})" for app, dep, n in busy)
        found.append(("OOM-2", f"Deployments taking more than 2 requests at once per replica: {names}."))
    found.append(
        ("OOM-4", "Replicas per node times model size plus caches may not fit: check placement and cache bounds.")
    )
    found.append(("OOM-3", "Large return values or ray.put per request fill the object store on top of the heap."))
    found.append(("OOM-5", "If it only grows between restarts, the allocator keeps memory: recycle on a schedule."))
    return [cause(cause_id, reason, rank) for rank, (cause_id, reason) in enumerate(found, start=1)]


def rank_ratchet_causes() -> list[dict]:
    return [
        cause(
            "OOM-5",
            "Memory only grew over hours and never came back: allocator fragmentation or caching allocators keep it. "
            "A rolling recycle returns it.",
            1,
        ),
        cause("OOM-4", "An unbounded cache grows with every new key: bound it by size and TTL.", 2),
    ]


@dataclass(frozen=True)
class KernelOomContext:
    """A Ray container the kernel OOM-killed, as Kubernetes reported it."""

    pod: str
    container: str
    limit_bytes: float | None
    ray_memory_bytes: int | None  # what Ray plans with on that node, when known
    ray_memory_source: str  # where that figure comes from ("Ray's dashboard", "rayStartParams memory")


def rank_kernel_oom_causes(ctx: KernelOomContext) -> list[dict]:
    """The kernel, not Ray's memory monitor, killed the container: OOM-6 first, with the
    container limit set against the memory Ray believes it has."""
    gib = 2**30
    what = f"The kernel OOM-killed {ctx.container} in pod {ctx.pod}"
    if ctx.limit_bytes is None:
        first = (
            f"{what}, which has no memory limit: the node ran out and the kernel chose it. Ray's memory monitor sizes "
            "itself from the whole node, so it never saw this coming. Set requests.memory = limits.memory (K1)."
        )
    elif ctx.ray_memory_bytes is not None and ctx.ray_memory_bytes > ctx.limit_bytes:
        first = (
            f"{what} at its {ctx.limit_bytes / gib:.1f} GiB container limit, while Ray plans with "
            f"{ctx.ray_memory_bytes / gib:.1f} GiB ({ctx.ray_memory_source}): Ray's memory monitor acts at a fraction "
            "of what Ray believes it has, so the kernel acted first. Align Ray's --memory and object store with the "
            "limit (K1)."
        )
    elif ctx.ray_memory_bytes is not None:
        first = (
            f"{what} at its {ctx.limit_bytes / gib:.1f} GiB container limit; Ray plans with "
            f"{ctx.ray_memory_bytes / gib:.1f} GiB ({ctx.ray_memory_source}), so the memory that tipped it over was "
            "outside Ray's accounting (object store shared memory, sidecars) or grew faster than the monitor polls. "
            "Leave headroom between Ray's sizes and the limit (K1)."
        )
    else:
        first = (
            f"{what} at its {ctx.limit_bytes / gib:.1f} GiB container limit: a kill by the kernel rather than by "
            "Ray's memory monitor means Ray believed it had room. Ray's own view of the node was not available to "
            "compare: check that Ray's --memory and object store fit inside the limit (K1)."
        )
    return [
        cause("OOM-6", first, 1),
        cause(
            "OOM-3",
            "An object store sized from the host's memory rather than the container's fills the limit together "
            "with the heap.",
            2,
        ),
        cause("OOM-2", "Replicas on this pod that accept many requests at once multiply their per-request memory.", 3),
    ]
