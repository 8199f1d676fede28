"""What two scrapes of Ray's metrics say about each deployment and node. Pure functions.

Counters and histograms are cumulative per replica (and reset when a replica or the cluster
restarts), so every figure comes from the difference between two scrapes; a counter that went
down is taken as a reset and reported as a signal-quality warning instead of a negative rate."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from integrations.ray_metrics import Scrape

LATENCY = "ray_serve_deployment_processing_latency_ms"
REQUESTS = "ray_serve_deployment_request_counter_total"
ERRORS = "ray_serve_deployment_error_counter_total"
ONGOING = "ray_serve_replica_processing_queries"
QUEUED = "ray_serve_deployment_queued_queries"
REPLICA_STARTS = "ray_serve_replica_startup_latency_ms_count"
# What clients saw, counted by the Serve proxy per application: every answer (shed 503s and
# the 500 of a replica that died mid-request included) and the latency end to end, queueing
# included. The replica-side figures above miss both.
HTTP_REQUESTS = "ray_serve_num_http_requests_total"
HTTP_ERRORS = "ray_serve_num_http_error_requests_total"
HTTP_LATENCY = "ray_serve_http_request_latency_ms"
EVICTIONS = "ray_memory_manager_worker_eviction_total"
MEM_USED, MEM_TOTAL = "ray_node_mem_used", "ray_node_mem_total"
# GPU memory in MB; Ray exports these only on nodes with GPUs.
GRAM_USED, GRAM_AVAILABLE = "ray_node_gram_used", "ray_node_gram_available"
# Resident memory in MB summed per node over the processes of one title. A replica is titled
# "ray::ServeReplica:<app>:<deployment>" at rest, gains ".<method>" while it runs one, and is
# "ray::SERVE_REPLICA::<app>#<deployment>#<id>:ServeReplica:<app>:<deployment>.__init__" while it
# starts (left out: it reports no requests yet); a title no process carries any more is reported as 0.
# vLLM's engine metrics as Ray re-exports them (vllm/v1/metrics/ray_wrappers.py: `vllm:` names
# sanitised to `_`, Ray's `ray_` prefix, `_total` on counters), the names Ray's own LLM dashboard
# reads (ray/dashboard/modules/metrics/dashboards/data_llm_dashboard_panels.py). The engine runs in
# a worker of its own, so its series carry `model_name` and `WorkerId`, and an empty `ReplicaId`.
VLLM_RUNNING = "ray_vllm_num_requests_running"
VLLM_WAITING = "ray_vllm_num_requests_waiting"
VLLM_KV_USAGE = "ray_vllm_kv_cache_usage_perc"
VLLM_GENERATED = "ray_vllm_generation_tokens_total"
VLLM_PREEMPTIONS = "ray_vllm_num_preemptions_total"
VLLM_TTFT = "ray_vllm_time_to_first_token_seconds"
# The tokens each request brought (its prompt) and made (its generation), as vLLM counts them: the
# request sizes of an LLM deployment, known without any setup. Any other deployment's sizes come
# from a histogram its application exports and the operator names (Deployment.size_metric).
VLLM_PROMPT_TOKENS = "ray_vllm_request_prompt_tokens"
VLLM_GENERATION_TOKENS = "ray_vllm_request_generation_tokens"
COMPONENT_RSS = "ray_component_rss_mb"
# The unit of both: decimal megabytes.
PROCESS_MB = 10**6
# The same processes' unique memory (USS): what the node gets back when the process ends. RSS counts
# the pages every worker shares (Ray's and Python's libraries) once per replica.
COMPONENT_USS = "ray_component_uss_mb"
REPLICA_TITLE = "ServeReplica:"

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
    replicas: int = 0  # replicas reporting their ongoing requests
    rss_mb: float | None = None  # resident memory of all its replicas; None where Ray exports none
    uss_mb: float | None = None  # their unique memory, shared pages left out; None where Ray exports none
    # Requests per size bucket in the interval, from the histogram the operator named: {upper bound: count}.
    sizes: dict[str, float] = field(default_factory=dict)

    @property
    def oom_errors(self) -> float:
        return self.errors_by_type.get("OutOfMemoryError", 0.0)


@dataclass
class ApplicationSignals:
    requests: float = 0.0  # answers of any status
    errors_by_code: dict[str, float] = field(default_factory=dict)
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    # The histogram bucket p99 fell in, (lower, upper) ms, upper None when open-ended: an
    # interpolated p99 inside Ray's 10-60 s bucket could be either end of it.
    p99_between_ms: tuple[float, float | None] | None = None


def is_failure(code: str) -> bool:
    """A client request that was not served: 5xx, a proxy timeout (408), a client that gave up
    waiting (499), or the words older proxies used for those. Other 4xx are the client's own."""
    return code.startswith("5") or code in ("408", "499", "timeout", "disconnection")


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
class EngineSignals:
    """One served model's vLLM engines, all replicas together."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None  # the fullest engine's KV cache, 0-1
    generated_tokens: float = 0.0
    preemptions: float = 0.0
    ttft_p99_ms: float | None = None


@dataclass
class Reading:
    seconds: float
    deployments: dict[Key, DeploymentSignals]
    nodes: dict[str, NodeSignals]
    warnings: list[str]
    applications: dict[str, ApplicationSignals] = field(default_factory=dict)  # at the proxy; absent if it exports none
    engines: dict[str, EngineSignals] = field(default_factory=dict)  # by vLLM's model_name; absent without serve.llm
    # By vLLM's model_name: (prompt tokens, generation tokens), each {upper bound: requests in the interval}.
    model_sizes: dict[str, tuple[dict[str, float], dict[str, float]]] = field(default_factory=dict)


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


def replica_deployment(title: str, keys) -> Key | None:
    """The deployment whose replicas carry a process title, among `keys`; the longest name wins
    so that deployment "A" never takes the processes of "A.b"."""
    if not title.startswith("ray::") or REPLICA_TITLE not in title:
        return None
    rest = title.split(REPLICA_TITLE, 1)[1]
    if rest.endswith(".__init__"):
        return None  # a replica still starting reports no requests yet: its memory would look like theirs
    matches = [key for key in keys if rest == f"{key[0]}:{key[1]}" or rest.startswith(f"{key[0]}:{key[1]}.")]
    return max(matches, key=lambda key: len(key[0]) + len(key[1])) if matches else None


def add_replica_memory(deployments: dict, titled: list[tuple[str, float]], attr: str = "rss_mb") -> None:
    """Attribute per-title memory (MB; resident, or unique with `attr` "uss_mb") to the deployments
    whose replicas carry the title."""
    for title, mb in titled:
        if (key := replica_deployment(title, list(deployments))) is not None:
            setattr(deployments[key], attr, (getattr(deployments[key], attr) or 0.0) + mb)


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


def bucket_of(buckets: list[tuple[float, float]], q: float) -> tuple[float, float | None] | None:
    """The (lower, upper) bounds of the cumulative bucket holding quantile `q`; upper None past the last bound."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    lower = 0.0
    for bound, count in buckets:
        if count >= q * total:
            return lower, (None if bound == float("inf") else bound)
        lower = bound
    return lower, None


def _bucket_increases(prev: Scrape, cur: Scrape, name: str, key_of, warnings: list[str]) -> dict:
    """Per key, the cumulative bucket increases of histogram `name` between the scrapes, summed over
    the series of a key: {upper bound: count}."""
    buckets: dict = defaultdict(lambda: defaultdict(float))
    for labels, delta in _deltas(prev, cur, f"{name}_bucket", warnings):
        if key := key_of(labels):
            buckets[key][float(labels.get("le", "inf"))] += delta
    return buckets


def _percentiles(prev: Scrape, cur: Scrape, name: str, key_of, warnings: list[str]) -> dict:
    """p50/p95/p99 per key of a histogram's bucket increases, summed over the series of a key."""
    out = {}
    for key, by_bound in _bucket_increases(prev, cur, name, key_of, warnings).items():
        series = sorted(by_bound.items())
        out[key] = (quantile(series, 0.50), quantile(series, 0.95), quantile(series, 0.99), bucket_of(series, 0.99))
    return out


def bound_text(bound: float) -> str:
    """A bucket's upper bound as a JSON key: Prometheus's own "+Inf", whole numbers without ".0"."""
    if bound == float("inf"):
        return "+Inf"
    return str(int(bound)) if bound.is_integer() else repr(bound)


def bucket_counts(prev: Scrape, cur: Scrape, name: str, key_of, warnings: list[str]) -> dict:
    """Per key, the requests that fell in each bucket of histogram `name` between the scrapes:
    {upper bound text: count}, one bucket's own count (not cumulative), so that readings add up."""
    increases = _bucket_increases(prev, cur, name, key_of, warnings)
    return {key: counts for key, by_bound in increases.items() if (counts := own_counts(by_bound))}


def own_counts(cumulative: dict[float, float]) -> dict[str, float]:
    """Cumulative counts by upper bound to each bucket's own {bound text: count}; empty when all are 0."""
    below, counts = 0.0, {}
    for bound, total in sorted(cumulative.items()):
        counts[bound_text(bound)] = round(max(total - below, 0.0), 3)
        below = max(below, total)
    return counts if any(counts.values()) else {}


def _application(labels: dict) -> str | None:
    return labels.get("application") or None  # "" is the proxy's own routes (/-/healthz, 404s)


def _applications(prev: Scrape, cur: Scrape, warnings: list[str]) -> dict[str, ApplicationSignals]:
    apps: dict[str, ApplicationSignals] = defaultdict(ApplicationSignals)
    for labels, delta in _deltas(prev, cur, HTTP_REQUESTS, warnings):
        if app := _application(labels):
            apps[app].requests += delta
    for labels, delta in _deltas(prev, cur, HTTP_ERRORS, warnings):
        if (app := _application(labels)) and delta:
            code = labels.get("error_code", "unknown")
            apps[app].errors_by_code[code] = apps[app].errors_by_code.get(code, 0.0) + delta
    for app, (p50, p95, p99, between) in _percentiles(prev, cur, HTTP_LATENCY, _application, warnings).items():
        apps[app].p50_ms, apps[app].p95_ms, apps[app].p99_ms, apps[app].p99_between_ms = p50, p95, p99, between
    return dict(apps)


def read(prev: Scrape, cur: Scrape, size_metrics: Mapping[Key, str] | None = None) -> Reading:
    """What happened between the scrapes. `size_metrics` names, per deployment, the histogram of
    request sizes its application exports (see size_series)."""
    warnings: list[str] = []
    deployments: dict[Key, DeploymentSignals] = defaultdict(DeploymentSignals)
    size_metrics = size_metrics or {}
    for metric in sorted(set(size_metrics.values())):
        for key, counts in bucket_counts(prev, cur, metric, _deployment, warnings).items():
            if size_metrics.get(key) == metric:
                deployments[key].sizes = counts
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
    for key, (p50, p95, p99, _) in _percentiles(prev, cur, LATENCY, _deployment, warnings).items():
        deployments[key].p50_ms, deployments[key].p95_ms, deployments[key].p99_ms = p50, p95, p99
    for name, attr in ((ONGOING, "ongoing"), (QUEUED, "queued")):
        for sample in cur.named(name):
            if key := _deployment(sample.labels):
                setattr(deployments[key], attr, getattr(deployments[key], attr) + sample.value)
    for sample in cur.named(ONGOING):
        if key := _deployment(sample.labels):
            deployments[key].replicas += 1
    add_replica_memory(deployments, [(s.labels.get("Component", ""), s.value) for s in cur.named(COMPONENT_RSS)])
    add_replica_memory(
        deployments, [(s.labels.get("Component", ""), s.value) for s in cur.named(COMPONENT_USS)], "uss_mb"
    )
    if not cur.named(f"{LATENCY}_bucket") and cur.named(REQUESTS):
        warnings.append(f"{LATENCY} histograms are missing: no latency percentiles.")
    nodes = _node_memory(prev, cur)
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
        if not delta:
            # A node known only from an unchanged counter has nothing to say; a point of zeros
            # would read as a node with no memory.
            continue
        node = nodes.setdefault(
            labels.get("ip", labels.get("NodeAddress", "")), NodeSignals(labels.get("NodeAddress", ""), 0.0, 0.0)
        )
        name = labels.get("Name", "unknown")
        node.evictions[name] = node.evictions.get(name, 0.0) + delta
    applications = _applications(prev, cur, warnings)
    return Reading(
        seconds=max(cur.at - prev.at, 0.0),
        deployments=dict(deployments),
        nodes=nodes,
        warnings=warnings,
        applications=applications,
        engines=_engines(prev, cur, warnings),
        model_sizes=_model_sizes(prev, cur, warnings),
    )


def _model_sizes(prev: Scrape, cur: Scrape, warnings: list[str]) -> dict:
    prompts = bucket_counts(prev, cur, VLLM_PROMPT_TOKENS, _model, warnings)
    generations = bucket_counts(prev, cur, VLLM_GENERATION_TOKENS, _model, warnings)
    return {model: (prompts.get(model, {}), generations.get(model, {})) for model in prompts.keys() | generations}


def _model(labels: dict) -> str | None:
    return labels.get("model_name") or None


def _engines(prev: Scrape, cur: Scrape, warnings: list[str]) -> dict[str, EngineSignals]:
    engines: dict[str, EngineSignals] = defaultdict(EngineSignals)
    for name, attr in ((VLLM_RUNNING, "running"), (VLLM_WAITING, "waiting")):
        for sample in cur.named(name):
            if model := _model(sample.labels):
                setattr(engines[model], attr, getattr(engines[model], attr) + sample.value)
    for sample in cur.named(VLLM_KV_USAGE):
        if model := _model(sample.labels):
            engines[model].kv_usage = max(engines[model].kv_usage or 0.0, sample.value)
    for name, attr in ((VLLM_GENERATED, "generated_tokens"), (VLLM_PREEMPTIONS, "preemptions")):
        for labels, delta in _deltas(prev, cur, name, warnings):
            if model := _model(labels):
                setattr(engines[model], attr, getattr(engines[model], attr) + delta)
    for model, (_, _, p99, _) in _percentiles(prev, cur, VLLM_TTFT, _model, warnings).items():
        engines[model].ttft_p99_ms = p99 * 1000 if p99 is not None else None
    return dict(engines)


KEPT = (
    f"{LATENCY}_bucket",
    REQUESTS,
    ERRORS,
    REPLICA_STARTS,
    EVICTIONS,
    ONGOING,
    QUEUED,
    MEM_USED,
    MEM_TOTAL,
    GRAM_USED,
    GRAM_AVAILABLE,
    HTTP_REQUESTS,
    HTTP_ERRORS,
    f"{HTTP_LATENCY}_bucket",
    VLLM_RUNNING,
    VLLM_WAITING,
    VLLM_KV_USAGE,
    VLLM_GENERATED,
    VLLM_PREEMPTIONS,
    f"{VLLM_TTFT}_bucket",
    f"{VLLM_PROMPT_TOKENS}_bucket",
    f"{VLLM_GENERATION_TOKENS}_bucket",
)


def size_series(size_metrics: Mapping[Key, str]) -> frozenset[str]:
    """The series to scrape for the applications' own size histograms: their buckets only."""
    return frozenset(f"{metric}_bucket" for metric in size_metrics.values())


# What a scrape parses at all: the readings' series and the per-process memory they pick replicas from.
def _node_memory(prev: Scrape, cur: Scrape) -> dict[str, NodeSignals]:
    """Each node's memory gauges, from `cur`, else from `prev` for a node `cur` lacks them for.
    At a short RAY_metrics_report_interval_ms (1 s, for a scaler) Ray's exporter leaves a node's
    gauges out of about every other scrape; the previous scrape's figures are one reading old,
    while leaving the node out would hide it from every memory budget for that reading."""
    nodes: dict[str, NodeSignals] = {}
    for scrape in (prev, cur):
        used = {s.labels.get("ip", ""): s.value for s in scrape.named(MEM_USED)}
        for sample in scrape.named(MEM_TOTAL):
            ip = sample.labels.get("ip", "")
            nodes[ip] = NodeSignals(ip=ip, mem_used=used.get(ip, 0.0), mem_total=sample.value)
    return nodes


SCRAPED = frozenset((*KEPT, COMPONENT_RSS, COMPONENT_USS))


def relevant(scrape: Scrape, extra: frozenset[str] = frozenset()) -> Scrape:
    """Only the series the readings use (`extra`: the size histograms operators named): a busy
    node exposes ~760 KB, we keep a few KB."""
    return Scrape(
        at=scrape.at,
        samples=[
            s
            for s in scrape.samples
            if s.name in KEPT
            or s.name in extra
            or (s.name in (COMPONENT_RSS, COMPONENT_USS) and REPLICA_TITLE in s.labels.get("Component", ""))
        ],
    )


def point(
    at: float,
    seconds: float,
    d: DeploymentSignals,
    app: ApplicationSignals | None = None,
    engine: EngineSignals | None = None,
    model_sizes: tuple[dict, dict] | None = None,
) -> dict:
    """A deployment's reading; `app` is what its application's clients saw at the proxy, copied
    into every deployment of the application because a wizard watches one deployment, rarely the
    ingress. Without proxy series the http keys are absent, which is not the same as zero."""
    out = {
        "t": round(at, 1),
        "p50": _r(d.p50_ms),
        "p95": _r(d.p95_ms),
        "p99": _r(d.p99_ms),
        "rps": round(d.requests / seconds, 3) if seconds else None,
        "errors": d.errors,
        "ongoing": d.ongoing,
        "queued": d.queued,
        "starts": d.replica_starts,
        "seconds": round(seconds, 1),
    }
    if d.rss_mb is not None and d.replicas:
        out |= {"rss_mb": round(d.rss_mb, 1), "replicas": d.replicas}
        if d.uss_mb is not None:
            out["uss_mb"] = round(d.uss_mb, 1)
    if app is not None:
        out |= {
            "http": app.requests,
            "http_errors": dict(app.errors_by_code),
            "http_p50": _r(app.p50_ms),
            "http_p95": _r(app.p95_ms),
            "http_p99": _r(app.p99_ms),
        }
        if app.p99_between_ms is not None:
            out["http_p99_between"] = list(app.p99_between_ms)
    if engine is not None:
        # The serve.llm deployment's engines: what they hold and whether they produce anything.
        out |= {
            "llm_running": engine.running,
            "llm_waiting": engine.waiting,
            "kv_usage": round(engine.kv_usage, 4) if engine.kv_usage is not None else None,
            "gen_tokens": engine.generated_tokens,
            "preemptions": engine.preemptions,
            "ttft_p99": round(engine.ttft_p99_ms / 1000, 3) if engine.ttft_p99_ms is not None else None,
        }
    # Request sizes per bucket; the named histogram wins over vLLM's prompts, which it was named to replace.
    prompts, generations = model_sizes or ({}, {})
    if sizes := d.sizes or prompts:
        out["size_in"] = dict(sizes)
    if generations:
        out["size_out"] = dict(generations)
    return out


def node_point(at: float, node: NodeSignals) -> dict:
    return {
        "t": round(at, 1),
        "mem": round(node.mem_fraction, 4) if node.mem_fraction is not None else None,
        "mem_used": node.mem_used,
        "mem_total": node.mem_total,
        "gpu": round(node.gpu_fraction, 4) if node.gpu_fraction is not None else None,
        "evictions": sum(node.evictions.values()),
    }


def _r(value):
    return round(value, 1) if value is not None else None


SUMMED = {"errors", "starts", "evictions", "seconds", "http", "gen_tokens", "preemptions"}
SUMMED_BY_KEY = {"http_errors", "size_in", "size_out"}
AVERAGED = {"rps"}


def compact(
    points: list[dict], now: float, *, raw_s: float = 3600, bucket_s: float = 300, retention_s: float = 86400
) -> list[dict]:
    """Raw points for `raw_s`, then one point per `bucket_s`, nothing older than `retention_s`.
    Summaries keep the worst of gauges and latencies, the sum of counts (per status code too), the mean of rates.
    A raw point is summarised with its whole bucket, once all of it is older than `raw_s` (so the
    raw part spans up to `raw_s + bucket_s`): the summaries then change once a bucket, not at every
    reading, and a window stored in two parts (incidents.models.Window) rewrites only the raw one."""
    cutoff = (now - raw_s) // bucket_s * bucket_s
    recent = [p for p in points if p["t"] >= cutoff]
    old: dict[int, list[dict]] = {}
    for p in points:
        if now - retention_s <= p["t"] < cutoff:
            old.setdefault(int(p["t"] // bucket_s), []).append(p)
    summarized = []
    for bucket in sorted(old):
        group = old[bucket]
        if len(group) == 1 and "summary" in group[0]:
            # Summarised when it aged past `raw_s`: a summary of one summary is itself.
            summarized.append(group[0])
            continue
        # A bucket gains one aged raw point per reading: a summary so far counts as the readings it holds.
        weights = [g.get("summary", 1) for g in group]
        summary = {"t": group[-1]["t"], "summary": sum(weights)}
        for key in {k for g in group for k in g} - {"t", "summary"}:
            values = [g[key] for g in group if isinstance(g.get(key), (int, float))]
            if key in SUMMED_BY_KEY:
                merged: dict[str, float] = {}
                for g in group:
                    for code, n in (g.get(key) or {}).items():
                        merged[code] = merged.get(code, 0) + n
                summary[key] = merged
            elif key in SUMMED:
                summary[key] = sum(values)
            elif key in AVERAGED:
                pairs = [
                    (g[key], w) for g, w in zip(group, weights, strict=True) if isinstance(g.get(key), (int, float))
                ]
                summary[key] = round(sum(v * w for v, w in pairs) / sum(w for _, w in pairs), 3) if pairs else None
            else:
                summary[key] = max(values) if values else None
        summarized.append(summary)
    return summarized + recent
