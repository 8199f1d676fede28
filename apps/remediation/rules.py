"""Config lint: each rule looks at one deployment (or the cluster) and says what is wrong, why it
matters, and the patch that fixes it. Pure functions over `Subject`; ids are stable for muting."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from apps.changes.serve_options import parse_version, unknown_fields
from apps.llm.planner import MemoryPlan
from apps.llm.recognise import LLMModel
from apps.remediation import llm_rules, schedulable


@dataclass(frozen=True)
class Subject:
    cluster_name: str
    ray_version: str
    application: str
    deployment: str
    effective: dict
    submitted: dict
    running_replicas: int = 0
    has_recycle_schedule: bool = False
    has_warmup: bool = False
    cold_starts_observed: bool = False
    cold_start_ratio: float | None = None  # p99 right after replica starts / steady p50
    memory_ratchet: bool = False
    # What Ray reserves per replica, and the replicas it has not placed or started yet.
    required_resources: dict = field(default_factory=dict)
    target_replicas: int | None = None
    waiting_replicas: int = 0
    waiting_since_s: float | None = None  # when the oldest of them was started (Ray's clock)
    waiting_for_s: float | None = None  # how long it has waited
    waiting_threshold_s: float = 60.0
    # The nodes' resources, {IP: {resource: [used, total]}}; None when never read.
    node_resources: dict | None = None
    autoscaling_detail: dict | None = None
    p99_processing_ms: float | None = None  # the highest p99 of the deployment's kept readings
    # A serve.llm deployment: what it serves, its memory plan when one can be made, and vLLM's measured p99 TTFT.
    llm: LLMModel | None = None
    llm_plan: MemoryPlan | None = None
    llm_gpu_memory_gib: float | None = None
    p99_ttft_s: float | None = None


@dataclass(frozen=True)
class Hit:
    rule: str
    severity: str
    evidence: dict
    patch: dict | None = None
    action: str = ""  # "schedule" or "warmup" when the fix is not a config patch
    message: str = ""  # this occurrence's own explanation, with its figures


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    remedy: str
    why: str
    check: Callable[[Subject], Hit | None]
    scope: str = "deployment"
    extra: dict = field(default_factory=dict)


def _auto(s: Subject) -> dict | None:
    auto = s.effective.get("autoscaling_config")
    return auto if isinstance(auto, dict) else None


def _gpus(s: Subject) -> float:
    return float((s.effective.get("ray_actor_options") or {}).get("num_gpus") or 0)


def gpu_concurrency(s: Subject) -> Hit | None:
    if s.llm:  # a vLLM engine batches: its own rules size it (llm-ongoing-unbounded)
        return None
    cap = s.effective.get("max_ongoing_requests")
    if _gpus(s) > 0 and isinstance(cap, int) and cap > 2:
        patch = {"max_ongoing_requests": 2}
        if (_auto(s) or {}).get("target_ongoing_requests", 0) > 2:
            patch["autoscaling_config"] = {"target_ongoing_requests": 1}
        return Hit("gpu-concurrency", "major", {"num_gpus": _gpus(s), "max_ongoing_requests": cap}, patch)
    return None


def heavy_autoscaling(s: Subject) -> Hit | None:
    if _gpus(s) <= 0 or s.llm:  # a target of 1 is wrong for a batching engine (llm-target-one)
        return None
    auto = _auto(s)
    if auto is None:
        replicas = max(2, s.running_replicas)
        return Hit(
            "heavy-autoscaling",
            "warning",
            {"autoscaling": None, "replicas": s.running_replicas},
            {
                "autoscaling_config": {
                    "min_replicas": 2,
                    "max_replicas": max(4, 2 * replicas),
                    "target_ongoing_requests": 1,
                    "upscale_delay_s": 5,
                    "downscale_delay_s": 90,
                }
            },
        )
    target = auto.get("target_ongoing_requests")
    if isinstance(target, (int, float)) and target > 2:
        return Hit(
            "heavy-autoscaling",
            "warning",
            {"target_ongoing_requests": target},
            {"autoscaling_config": {"target_ongoing_requests": 1}},
        )
    return None


def unbounded_queue(s: Subject) -> Hit | None:
    if s.effective.get("max_queued_requests", -1) != -1:
        return None
    cap = s.effective.get("max_ongoing_requests") or 5
    replicas = (_auto(s) or {}).get("max_replicas") or s.effective.get("num_replicas") or max(1, s.running_replicas)
    # Enough to absorb about four rounds of the fleet's concurrency; beyond that, fail fast.
    bound = max(8, 4 * int(cap) * int(replicas))
    return Hit(
        "unbounded-queue",
        "warning",
        {"max_queued_requests": -1, "max_ongoing_requests": cap, "max_replicas": replicas},
        {"max_queued_requests": bound},
    )


def short_downscale(s: Subject) -> Hit | None:
    delay = (_auto(s) or {}).get("downscale_delay_s")
    if s.cold_starts_observed and isinstance(delay, (int, float)) and delay < 60:
        return Hit(
            "short-downscale",
            "warning",
            {"downscale_delay_s": delay, "cold_starts_observed": True},
            {"autoscaling_config": {"downscale_delay_s": 300}},
        )
    return None


def single_replica(s: Subject) -> Hit | None:
    auto = _auto(s)
    minimum = auto.get("min_replicas") if auto else s.effective.get("num_replicas")
    surge = s.effective.get("max_surge_percent") or 0
    if not isinstance(minimum, int) or minimum >= 2 or not (s.has_recycle_schedule or not surge):
        return None
    patch = {"autoscaling_config": {"min_replicas": 2}} if auto else {"num_replicas": 2}
    if auto and (auto.get("max_replicas") or 0) < 2:
        patch["autoscaling_config"]["max_replicas"] = 2
    return Hit(
        "single-replica",
        "warning",
        {"min_replicas": minimum, "max_surge_percent": surge, "recycle_schedule": s.has_recycle_schedule},
        patch,
    )


def cap_below_target(s: Subject) -> Hit | None:
    cap, target = s.effective.get("max_ongoing_requests"), (_auto(s) or {}).get("target_ongoing_requests")
    if isinstance(cap, (int, float)) and isinstance(target, (int, float)) and cap < target:
        return Hit(
            "cap-below-target",
            "major",
            {"max_ongoing_requests": cap, "target_ongoing_requests": target},
            {"autoscaling_config": {"target_ongoing_requests": max(1, cap)}},
        )
    return None


def ignored_settings(s: Subject) -> Hit | None:
    options = {k: v for k, v in s.submitted.items() if k != "name"}
    problems = unknown_fields(options) if parse_version(s.ray_version) >= (2, 10) else []
    if not problems:
        return None
    patch: dict = {}
    if "max_concurrent_queries" in options:
        patch.update(max_concurrent_queries=None, max_ongoing_requests=options["max_concurrent_queries"])
    inner = options.get("autoscaling_config") if isinstance(options.get("autoscaling_config"), dict) else {}
    if "max_ongoing_requests" in inner:
        patch.update(
            autoscaling_config={"max_ongoing_requests": None}, max_ongoing_requests=inner["max_ongoing_requests"]
        )
    return Hit("ignored-settings", "major", {"ignored": problems}, patch or None)


def memory_ratchet(s: Subject) -> Hit | None:
    if s.memory_ratchet and not s.has_recycle_schedule:
        return Hit(
            "recycle-missing", "warning", {"memory_ratchet": True, "recycle_schedule": False}, None, action="schedule"
        )
    return None


def warmup_missing(s: Subject) -> Hit | None:
    if s.cold_start_ratio is not None and s.cold_start_ratio >= 5 and not s.has_warmup:
        return Hit(
            "warmup-missing",
            "warning",
            {"cold_start_over_steady_p50": round(s.cold_start_ratio, 1)},
            None,
            action="warmup",
        )
    return None


def _per_replica(s: Subject) -> dict[str, float]:
    return {str(k): float(v) for k, v in s.required_resources.items()} or schedulable.demand_of(
        s.effective.get("ray_actor_options") or {}
    )


def replicas_unschedulable(s: Subject) -> Hit | None:
    if not s.waiting_replicas or s.waiting_for_s is None or s.waiting_for_s < s.waiting_threshold_s:
        return None
    per_replica = _per_replica(s)
    evidence = {
        "waiting_replicas": s.waiting_replicas,
        # When, not how long: evidence that changes with every sync would rewrite the finding each time.
        "waiting_since": datetime.fromtimestamp(s.waiting_since_s or 0, tz=UTC).isoformat(timespec="seconds"),
        "running_replicas": s.running_replicas,
        "target_replicas": s.target_replicas,
        "per_replica": per_replica,
    }
    if s.node_resources is None:
        message = "The cluster's resources could not be read: which resource is missing is not known."
        return Hit("replicas-unschedulable", "major", evidence, message=message)
    if schedulable.reports_no_resources(s.node_resources):
        message = (
            "The cluster's nodes report no resources (/api/cluster_status lists no CPU, GPU or memory on any "
            "node): no replica can be placed, and the missing resource cannot be named. Check that the nodes' "
            "raylets are alive and registered with the head."
        )
        return Hit("replicas-unschedulable", "major", {**evidence, "nodes_report_no_resources": True}, message=message)
    short = schedulable.unplaceable(per_replica, s.node_resources)
    if short is None:
        # A node has room now: the replica is placed or its constructor is slow, not a resource problem.
        return None
    evidence.update(missing=short.missing, most_free_on_one_node=short.most_free)
    return Hit("replicas-unschedulable", "major", evidence, message=short.text(per_replica))


def max_replicas_unreachable(s: Subject) -> Hit | None:
    auto = _auto(s)
    maximum = (auto or {}).get("max_replicas")
    if not isinstance(maximum, int) or not s.node_resources or schedulable.reports_no_resources(s.node_resources):
        return None
    per_replica = _per_replica(s)
    fits, binding = schedulable.replicas_that_fit(per_replica, s.node_resources)
    if not binding or maximum <= fits:
        return None
    needed = maximum * per_replica[binding]
    total = schedulable.total_of(binding, s.node_resources)
    text = schedulable.amount_text
    message = (
        f"max_replicas {maximum} × {text(per_replica[binding])} {binding} per replica needs {text(needed)} {binding}; "
        f"the cluster's nodes have {text(total)} {binding} in all ({text(needed - total)} {binding} short), so at most "
        f"{fits} replicas fit even with nothing else running."
    )
    minimum = auto.get("min_replicas") or 0
    patch = {"autoscaling_config": {"max_replicas": fits}} if fits >= max(minimum, 1) else None
    evidence = {
        "max_replicas": maximum,
        "replicas_that_fit": fits,
        "resource": binding,
        "needed": needed,
        "cluster_total": total,
        "short": needed - total,
    }
    return Hit("max-replicas-unreachable", "warning", evidence, patch, message=message)


def autoscaling_metrics_unhealthy(s: Subject) -> Hit | None:
    detail = s.autoscaling_detail or {}
    health = detail.get("metrics_health")
    if not health or health == "healthy":
        return None
    errors = list(detail.get("errors") or [])[-5:]
    message = (
        f"Serve reports the autoscaler's metrics as {health}: it decides on stale or missing request counts, "
        "so the target may not follow the load." + (f" Last errors: {'; '.join(errors)}" if errors else "")
    )
    return Hit(
        "autoscaling-metrics-unhealthy",
        "major",
        {"metrics_health": health, "scaling_status": detail.get("scaling_status"), "errors": errors},
        message=message,
    )


def graceful_shutdown_short(s: Subject) -> Hit | None:
    timeout = s.effective.get("graceful_shutdown_timeout_s")
    loop = s.effective.get("graceful_shutdown_wait_loop_s") or 0
    if s.p99_processing_ms is None or not isinstance(timeout, (int, float)) or timeout * 1000 >= s.p99_processing_ms:
        return None
    p99_s = s.p99_processing_ms / 1000
    # The replica looks for requests still running once per wait loop, so a request of p99 length
    # that began just as the drain started is seen done at most one loop later.
    suggested = math.ceil(p99_s + loop)
    message = (
        f"A replica being stopped waits at most {timeout:g} s for its requests, and the slowest 1 % take "
        f"{p99_s:.1f} s here: a recycle or a rolling update cuts them off. {suggested} s (p99 plus one "
        f"{loop:g} s wait loop) lets them finish."
    )
    return Hit(
        "graceful-shutdown-short",
        "warning",
        {
            "graceful_shutdown_timeout_s": timeout,
            "graceful_shutdown_wait_loop_s": loop,
            "p99_processing_s": round(p99_s, 2),
            "suggested_timeout_s": suggested,
        },
        {"graceful_shutdown_timeout_s": suggested},
        message=message,
    )


RULES = [
    Rule(
        "gpu-concurrency",
        "GPU deployment takes more than 2 requests at once",
        "R1",
        "A GPU replica that accepts many requests at once multiplies its per-request memory: a burst turns into an "
        "OOM kill of the replica and often of the Serve controller with it. One or two at a time keeps the peak "
        "bounded; scale out instead.",
        gpu_concurrency,
    ),
    Rule(
        "heavy-autoscaling",
        "Heavy deployment without queue-based autoscaling",
        "R2",
        "Without autoscaling, or with a target above two requests per replica, queues grow on the replicas you have "
        "instead of adding replicas: latency climbs first, then memory. A target of about one, two replicas minimum, "
        "fast upscale and slow downscale keeps queues short.",
        heavy_autoscaling,
    ),
    Rule(
        "unbounded-queue",
        "Unbounded queue (max_queued_requests -1)",
        "R10",
        "An unbounded queue turns overload into minutes of latency and memory held by waiting requests. A bound "
        "makes overload fail fast with 503, which clients can retry elsewhere; the suggested bound absorbs about "
        "four rounds of the deployment's concurrency.",
        unbounded_queue,
    ),
    Rule(
        "short-downscale",
        "Replicas scaled down quickly while cold starts hurt",
        "R2",
        "Replicas were started recently and the downscale delay is under a minute: the autoscaler removes replicas "
        "it will need again soon, and each new one pays a cold start (LAT-1).",
        short_downscale,
    ),
    Rule(
        "single-replica",
        "A single replica during recycles or updates",
        "R9",
        "With one replica and no surge, every recycle or config change that replaces replicas leaves the deployment "
        "with none for a few seconds (measured 2–3 s): requests queue or fail. Two replicas make a rolling "
        "replacement invisible.",
        single_replica,
    ),
    Rule(
        "cap-below-target",
        "max_ongoing_requests below the autoscaling target",
        "R2",
        "A replica never carries more than max_ongoing_requests, so an autoscaling target above it is never reached "
        "and the deployment never scales up, however long the queue.",
        cap_below_target,
    ),
    Rule(
        "ignored-settings",
        "Settings Serve ignores",
        "R1",
        "Serve drops unknown and legacy fields without a word: the config says one thing and the replicas run "
        "another (a legacy max_concurrent_queries leaves the default of 5 in force). What runs is what counts.",
        ignored_settings,
    ),
    Rule(
        "recycle-missing",
        "Memory ratchets up and no recycle is scheduled",
        "R8",
        "Node memory only grew over hours: allocators and caches keep memory between requests until the memory "
        "monitor kills a replica. A scheduled rolling recycle returns it before that.",
        memory_ratchet,
    ),
    Rule(
        "warmup-missing",
        "Cold starts far slower than steady state, and no warmup",
        "R6",
        "Right after replicas start, latency is many times the steady p50: the first requests pay for model load and "
        "kernel warmup. A warmup after every recycle and change makes that cost invisible to users.",
        warmup_missing,
    ),
    Rule(
        "replicas-unschedulable",
        "Replicas wait because no node can place them",
        "",
        "Serve asks Ray for each replica's resources; when no node has them free, the replica stays STARTING "
        "or PENDING and the deployment runs below its target, however long the queue. Free the named resource, "
        "add nodes that have it, or ask for less per replica.",
        replicas_unschedulable,
    ),
    Rule(
        "max-replicas-unreachable",
        "max_replicas more than the cluster can ever hold",
        "R2",
        "The autoscaler may ask for up to max_replicas, but the cluster's nodes cannot hold that many replicas "
        "even when nothing else runs: under load the deployment stops short of the target it asked for and "
        "its queue grows. A max_replicas the nodes can hold makes the ceiling honest, or the nodes must grow.",
        max_replicas_unreachable,
    ),
    Rule(
        "autoscaling-metrics-unhealthy",
        "Autoscaling metrics delayed or unavailable",
        "R2",
        "Serve's autoscaler decides from the request counts replicas and handles report; when those arrive late "
        "or not at all, it scales on stale figures: too late under a burst, or not at all.",
        autoscaling_metrics_unhealthy,
    ),
    Rule(
        "graceful-shutdown-short",
        "graceful_shutdown_timeout_s shorter than the p99 processing time",
        "R9",
        "When Serve stops a replica (a recycle, a rolling update, a downscale) it waits up to "
        "graceful_shutdown_timeout_s for the requests in flight, then kills the replica: requests slower than "
        "that fail. The wait loop only sets how often it looks; the timeout is what cuts.",
        graceful_shutdown_short,
    ),
    Rule(
        "llm-ongoing-unbounded",
        "LLM deployment takes far more requests than its engine batches",
        "R1",
        "serve.llm sets max_ongoing_requests to 1e9: Serve keeps sending requests to a replica whose vLLM engine "
        "runs at most max_num_seqs of them, the rest wait inside it, latency grows without bound and the health "
        "check times out behind them (ray#54070: 951 pending, a restart every 30 minutes). max_num_seqs lets Serve "
        "queue and route the excess to other replicas.",
        llm_rules.ongoing_unbounded,
    ),
    Rule(
        "llm-gpu-memory-utilization",
        "gpu_memory_utilization outside the safe range for the GPU and its sharing",
        "",
        "vLLM preallocates gpu_memory_utilization of the GPU. Too high and there is no room left for CUDA graphs "
        "and the CUDA context, captured after the KV cache: OOM at start. Too low and the weights leave nothing "
        "for the cache. On a shared or fractional GPU nothing keeps replicas apart (vllm PR#1821).",
        llm_rules.gpu_memory_utilization,
    ),
    Rule(
        "llm-max-model-len",
        "max_model_len unset or more than the KV cache holds",
        "",
        "vLLM refuses to start when one max_model_len sequence does not fit the KV cache (vllm#2418), and an unset "
        "max_model_len takes the model's whole context, which OOMed Ray's own quickstart (ray PR#58463).",
        llm_rules.max_model_len,
    ),
    Rule(
        "llm-health-check-short",
        "Health-check timeout shorter than the p99 time to first token",
        "R9",
        "serve.llm's health check times out at 10 s. Under load it waits like any request; when the slowest first "
        "tokens take longer, the check fails and Serve kills a replica that was working.",
        llm_rules.health_check_short,
    ),
    Rule(
        "llm-target-one",
        "Autoscaling target of one request on a batching LLM engine",
        "R2",
        "A vLLM engine serves many sequences in one batch; a target of one request per replica adds a GPU replica "
        "for every request and leaves each batch nearly empty.",
        llm_rules.target_of_one,
    ),
]

CLUSTER_RULES = [
    Rule(
        "dashboard-auth",
        "Ray dashboard without authentication",
        "",
        "Anyone who reaches this cluster's dashboard can replace or delete every Serve application with one request. "
        "Ray 2.52 and later support token authentication; enable it and give Fleetdeck the token.",
        lambda s: None,
        scope="cluster",
    ),
]

# The playbook's Kubernetes checks. They judge KubeRay resources and pods, not a Serve config, so
# `apps.kubernetes.checks` computes them from what the Kubernetes API reports; these entries give them a
# title and a reason on the findings page, in the API and for muting. None is an R-remedy.
KUBE_RULES = [
    Rule(
        "K1",
        "Ray container memory does not fit its Kubernetes limit",
        "",
        "A Ray container needs a memory request and limit, and the memory and object store Ray plans with must fit "
        "inside that limit. When Ray believes it has more than the container may use, its memory monitor never "
        "reaches its threshold: the kernel kills the whole pod instead of one replica, with the raylet, every "
        "replica on it and, on the head, the Serve controller (OOM-6).",
        lambda s: None,
        scope="kubernetes",
    ),
    Rule(
        "K2",
        "An HPA or KEDA scales workers that Ray already scales",
        "",
        "Two autoscalers on the same Ray workers react to the same load: they overwrite each other's replica counts, "
        "overshoot, and scale in pods that still hold running replicas. Let Serve autoscaling drive the Ray "
        "autoscaler and remove the external scaler.",
        lambda s: None,
        scope="kubernetes",
    ),
    Rule(
        "K3",
        "Pods stuck Terminating past their deadline",
        "",
        "A pod still Terminating after its grace period keeps its memory and GPU while the pod replacing it starts, "
        "so rolling updates and scale-in briefly need both on the node (OOM-7). Finalizers nobody removes and "
        "unresponsive kubelets are the usual reasons.",
        lambda s: None,
        scope="kubernetes",
    ),
    Rule(
        "K4",
        "GPU pods with too little CPU",
        "",
        "KubeRay hands the container's CPU to Ray, and every Serve replica asks for a CPU next to its GPU: below one "
        "CPU per GPU some GPUs never get a replica. The host-side work that feeds a GPU (parsing, tokenization, "
        "batching) also throttles, which shows up as latency spikes with the GPU idle (LAT-3).",
        lambda s: None,
        scope="kubernetes",
    ),
]
KUBE_IDS = frozenset(rule.id for rule in KUBE_RULES)
# The findings that say why a deployment runs below the replicas it asked for.
WHY_NOT_AT_TARGET = ("replicas-unschedulable", "max-replicas-unreachable", "autoscaling-metrics-unhealthy")

BY_ID = {rule.id: rule for rule in RULES + CLUSTER_RULES + KUBE_RULES}


def evaluate(subject: Subject) -> list[Hit]:
    return [hit for rule in RULES if (hit := rule.check(subject))]


def cluster_hits(auth_mode: str) -> list[Hit]:
    return [Hit("dashboard-auth", "major", {"authentication_mode": auth_mode})] if auth_mode == "disabled" else []
