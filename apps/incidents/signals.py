"""What two scrapes of Ray's metrics say about each deployment and node. Pure functions.

Counters and histograms are cumulative per replica (and reset when a replica or the cluster
restarts), so every figure comes from the difference between two scrapes; a counter that went
down is taken as a reset and reported as a signal-quality warning instead of a negative rate."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from apps.incidents.ray_metrics import Scrape

LATENCY = "ray_serve_deployment_processing_latency_ms"
REQUESTS = "ray_serve_deployment_request_counter_total"
ERRORS = "ray_serve_deployment_error_counter_total"
ONGOING = "ray_serve_replica_processing_queries"
QUEUED = "ray_serve_deployment_queued_queries"
REPLICA_STARTS = "ray_serve_replica_startup_latency_ms_count"
HTTP_ERRORS = "ray_serve_num_http_error_requests_total"
EVICTIONS = "ray_memory_manager_worker_eviction_total"
MEM_USED, MEM_TOTAL = "ray_node_mem_used", "ray_node_mem_total"
# GPU memory in MB; Ray exports these only on nodes with GPUs.
GRAM_USED, GRAM_AVAILABLE = "ray_node_gram_used", "ray_node_gram_available"

Key = tuple[str, str]  # (application, deployment)


@dataclass
class DeploymentSignals:
    requests: float = 0.0
    errors: float = 0.0
    errors_by_type: dict[str, float] = field(default_factory=dict)
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    ongoing: float = 0.0
    queued: float = 0.0
    replica_starts: float = 0.0

    @property
    def oom_errors(self) -> float:
        return self.errors_by_type.get("OutOfMemoryError", 0.0)


@dataclass
class NodeSignals:
    ip: str
    mem_used: float
    mem_total: float
    evictions: dict[str, float] = field(default_factory=dict)  # worker name -> kills in the interval
    gpu_used_mb: float | None = None
    gpu_total_mb: float | None = None

    @property
    def mem_fraction(self) -> float | None:
        return self.mem_used / self.mem_total if self.mem_total else None

    @property
    def gpu_fraction(self) -> float | None:
        return self.gpu_used_mb / self.gpu_total_mb if self.gpu_total_mb else None


@dataclass
class Reading:
    seconds: float
    deployments: dict[Key, DeploymentSignals]
    nodes: dict[str, NodeSignals]
    warnings: list[str]


def _series_key(labels: dict[str, str], *drop: str) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _deltas(prev: Scrape, cur: Scrape, name: str, warnings: list[str]) -> list[tuple[dict, float]]:
    """Per-series increase of a counter between the scrapes; a new series counts from zero."""
    before = {_series_key(s.labels): s.value for s in prev.named(name)}
    out = []
    reset = False
    for sample in cur.named(name):
        old = before.get(_series_key(sample.labels), 0.0)
        delta = sample.value - old
        if delta < 0:
            reset, delta = True, sample.value
        out.append((sample.labels, delta))
    if reset:
        warnings.append(f"{name}: a counter went backwards (a replica or the cluster restarted); counted from zero.")
    return out


def _deployment(labels: dict) -> Key | None:
    app, dep = labels.get("application"), labels.get("deployment")
    return (app, dep) if app and dep else None


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Quantile from cumulative (upper bound, count) buckets, interpolated inside a bucket."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            span = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / span if span else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


def read(prev: Scrape, cur: Scrape) -> Reading:
    warnings: list[str] = []
    deployments: dict[Key, DeploymentSignals] = defaultdict(DeploymentSignals)
    for labels, delta in _deltas(prev, cur, REQUESTS, warnings):
        if key := _deployment(labels):
            deployments[key].requests += delta
    for labels, delta in _deltas(prev, cur, ERRORS, warnings):
        if key := _deployment(labels):
            deployments[key].errors += delta
            kind = labels.get("exception_type", "unknown")
            deployments[key].errors_by_type[kind] = deployments[key].errors_by_type.get(kind, 0.0) + delta
    for labels, delta in _deltas(prev, cur, REPLICA_STARTS, warnings):
        if key := _deployment(labels):
            deployments[key].replica_starts += delta
    buckets: dict[Key, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, delta in _deltas(prev, cur, f"{LATENCY}_bucket", warnings):
        if key := _deployment(labels):
            buckets[key][float(labels.get("le", "inf"))] += delta
    for key, by_bound in buckets.items():
        series = sorted(by_bound.items())
        deployments[key].p50_ms = quantile(series, 0.50)
        deployments[key].p95_ms = quantile(series, 0.95)
        deployments[key].p99_ms = quantile(series, 0.99)
    for name, attr in ((ONGOING, "ongoing"), (QUEUED, "queued")):
        for sample in cur.named(name):
            if key := _deployment(sample.labels):
                setattr(deployments[key], attr, getattr(deployments[key], attr) + sample.value)
    if not cur.named(f"{LATENCY}_bucket") and cur.named(REQUESTS):
        warnings.append(f"{LATENCY} histograms are missing: no latency percentiles.")
    nodes: dict[str, NodeSignals] = {}
    used = {s.labels.get("ip", ""): s.value for s in cur.named(MEM_USED)}
    for sample in cur.named(MEM_TOTAL):
        ip = sample.labels.get("ip", "")
        nodes[ip] = NodeSignals(ip=ip, mem_used=used.get(ip, 0.0), mem_total=sample.value)
    gram_used: dict[str, float] = defaultdict(float)
    gram_total: dict[str, float] = defaultdict(float)
    for sample in cur.named(GRAM_USED):
        gram_used[sample.labels.get("ip", "")] += sample.value
        gram_total[sample.labels.get("ip", "")] += sample.value
    for sample in cur.named(GRAM_AVAILABLE):
        gram_total[sample.labels.get("ip", "")] += sample.value
    for ip, total in gram_total.items():
        if ip in nodes and total:
            nodes[ip].gpu_used_mb, nodes[ip].gpu_total_mb = gram_used[ip], total
    for labels, delta in _deltas(prev, cur, EVICTIONS, warnings):
        node = nodes.setdefault(labels.get("ip", labels.get("NodeAddress", "")), NodeSignals(labels.get("NodeAddress", ""), 0.0, 0.0))
        if delta:
            name = labels.get("Name", "unknown")
            node.evictions[name] = node.evictions.get(name, 0.0) + delta
    return Reading(seconds=max(cur.at - prev.at, 0.0), deployments=dict(deployments), nodes=nodes, warnings=warnings)


KEPT = (f"{LATENCY}_bucket", REQUESTS, ERRORS, REPLICA_STARTS, EVICTIONS, ONGOING, QUEUED, MEM_USED, MEM_TOTAL, GRAM_USED, GRAM_AVAILABLE)


def relevant(scrape: Scrape) -> Scrape:
    """Only the series the readings use: a busy node exposes ~760 KB, we keep a few KB."""
    return Scrape(at=scrape.at, samples=[s for s in scrape.samples if s.name in KEPT])


def point(at: float, seconds: float, d: DeploymentSignals) -> dict:
    return {
        "t": round(at, 1), "p50": _r(d.p50_ms), "p95": _r(d.p95_ms), "p99": _r(d.p99_ms),
        "rps": round(d.requests / seconds, 3) if seconds else None, "errors": d.errors,
        "ongoing": d.ongoing, "queued": d.queued, "starts": d.replica_starts,
    }


def node_point(at: float, node: NodeSignals) -> dict:
    return {
        "t": round(at, 1), "mem": round(node.mem_fraction, 4) if node.mem_fraction is not None else None,
        "mem_used": node.mem_used, "mem_total": node.mem_total,
        "gpu": round(node.gpu_fraction, 4) if node.gpu_fraction is not None else None,
        "evictions": sum(node.evictions.values()),
    }


def _r(value):
    return round(value, 1) if value is not None else None


SUMMED = {"errors", "starts", "evictions"}
AVERAGED = {"rps"}


def compact(points: list[dict], now: float, *, raw_s: float = 3600, bucket_s: float = 300, retention_s: float = 86400) -> list[dict]:
    """Raw points for `raw_s`, then one point per `bucket_s`, nothing older than `retention_s`.
    Summaries keep the worst of gauges and latencies, the sum of counts, the mean of rates."""
    recent = [p for p in points if p["t"] >= now - raw_s]
    old: dict[int, list[dict]] = {}
    for p in points:
        if now - retention_s <= p["t"] < now - raw_s:
            old.setdefault(int(p["t"] // bucket_s), []).append(p)
    summarized = []
    for bucket in sorted(old):
        group = old[bucket]
        summary = {"t": group[-1]["t"], "summary": len(group)}
        for key in {k for g in group for k in g} - {"t", "summary"}:
            values = [g[key] for g in group if isinstance(g.get(key), (int, float))]
            if key in SUMMED:
                summary[key] = sum(values)
            elif key in AVERAGED:
                summary[key] = round(sum(values) / len(values), 3) if values else None
            else:
                summary[key] = max(values) if values else None
        summarized.append(summary)
    return summarized + recent
