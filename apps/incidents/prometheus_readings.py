"""The readings of `metric_readings.py` computed by PromQL on a Prometheus server instead of by
differencing two scrapes; `integrations.prometheus` sends the queries.

A reading covers the whole seconds since the cluster's previous one and counts what happened in
them, as a difference of scrapes does: consumers sum counts and seconds across readings."""

from __future__ import annotations

from collections.abc import Mapping

from apps.fleet.metric_readings import (
    COMPONENT_RSS,
    COMPONENT_USS,
    ONGOING,
    VLLM_GENERATION_TOKENS,
    VLLM_PROMPT_TOKENS,
    ApplicationSignals,
    DeploymentSignals,
    NodeSignals,
    Reading,
    add_replica_memory,
    own_counts,
)
from integrations.prometheus import query

# Fleetdeck cannot know the Prometheus's scrape interval, and rate() over a range holding fewer
# than two samples answers no series at all, which would read as no traffic. Two minutes hold two
# at Prometheus's default 1 m scrape interval, the one assumption the fixed 2 m window made before.
MIN_RANGE_S = 120


def interval(previous_at: float, now: float) -> tuple[float, int] | None:
    """(end, seconds) of a reading taken at `now`: the whole seconds since the previous reading
    (`previous_at`, 0 when there was none), ending where the next reading will start, so that
    readings neither overlap nor leave gaps. None while not a second has passed.

    A first reading covers MIN_RANGE_S: Prometheus holds that history and no other reading counted
    it, so the cluster's windows get a full reading at once instead of one sync later."""
    if not previous_at:
        return now, MIN_RANGE_S
    seconds = int(now - previous_at)
    return (previous_at + seconds, seconds) if seconds >= 1 else None


def read(
    base_url: str,
    selector: str = "",
    *,
    end: float | None = None,
    seconds: int = MIN_RANGE_S,
    timeout_s: float = 5.0,
    transport=None,
    size_metrics: Mapping[tuple[str, str], str] | None = None,
) -> Reading:
    """What happened in the `seconds` up to `end` (None: Prometheus's now). `transport` replaces
    the client's own (tests replay captured answers through it). `size_metrics` names each
    deployment's histogram of request sizes, as for metric_readings.read."""
    sel = "{" + selector + "}" if selector else ""
    by = "application, deployment"
    # Counts are rates times the reading's own seconds. Under MIN_RANGE_S the rate is that of the
    # last MIN_RANGE_S: smoothed, yet readings that follow each other still count each request once.
    window = f"{max(seconds, MIN_RANGE_S)}s"

    def q(promql: str) -> list[tuple[dict, float]]:
        return query(base_url, promql, at=end, timeout_s=timeout_s, transport=transport)

    deployments: dict[tuple[str, str], DeploymentSignals] = {}

    def dep(labels: dict) -> DeploymentSignals | None:
        key = (labels.get("application"), labels.get("deployment"))
        return deployments.setdefault(key, DeploymentSignals()) if all(key) else None

    # Quantiles over the counts' range rather than a fixed window, so that they describe the requests
    # the reading counts: a spike shows in the reading it happened in and leaves with its range.
    for q_value, attr in ((0.5, "p50_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
        for labels, value in q(
            f"histogram_quantile({q_value}, sum by ({by}, le) "
            f"(rate(ray_serve_deployment_processing_latency_ms_bucket{sel}[{window}])))"
        ):
            if (d := dep(labels)) is not None and value == value:  # NaN when there was no traffic
                setattr(d, attr, value)
    for labels, value in q(f"sum by ({by}) (rate(ray_serve_deployment_request_counter_total{sel}[{window}]))"):
        if (d := dep(labels)) is not None:
            d.requests = value * seconds
    for labels, value in q(
        f"sum by ({by}, exception_type) (rate(ray_serve_deployment_error_counter_total{sel}[{window}]))"
    ):
        if (d := dep(labels)) is not None and value:
            d.errors += value * seconds
            d.errors_by_type[labels.get("exception_type", "unknown")] = value * seconds
    for metric, attr in (
        ("ray_serve_replica_processing_queries", "ongoing"),
        ("ray_serve_deployment_queued_queries", "queued"),
    ):
        for labels, value in q(f"sum by ({by}) ({metric}{sel})"):
            if (d := dep(labels)) is not None:
                setattr(d, attr, value)
    for labels, value in q(f"sum by ({by}) (rate(ray_serve_replica_startup_latency_ms_count{sel}[{window}]))"):
        if (d := dep(labels)) is not None:
            d.replica_starts = value * seconds
    for labels, value in q(f"count by ({by}) ({ONGOING}{sel})"):
        if (d := dep(labels)) is not None:
            d.replicas = int(value)
    add_replica_memory(
        deployments,
        [(labels.get("Component", ""), value) for labels, value in q(f"sum by (Component) ({COMPONENT_RSS}{sel})")],
    )
    add_replica_memory(
        deployments,
        [(labels.get("Component", ""), value) for labels, value in q(f"sum by (Component) ({COMPONENT_USS}{sel})")],
        "uss_mb",
    )
    applications = _applications(q, sel, window, seconds)
    nodes: dict[str, NodeSignals] = {}
    total = {labels.get("ip", ""): value for labels, value in q(f"sum by (ip) (ray_node_mem_total{sel})")}
    for labels, value in q(f"sum by (ip) (ray_node_mem_used{sel})"):
        ip = labels.get("ip", "")
        nodes[ip] = NodeSignals(ip=ip, mem_used=value, mem_total=total.get(ip, 0.0))
    gram_used = {labels.get("ip", ""): value for labels, value in q(f"sum by (ip) (ray_node_gram_used{sel})")}
    for labels, value in q(f"sum by (ip) (ray_node_gram_available{sel})"):
        ip = labels.get("ip", "")
        if ip in nodes:
            nodes[ip].gpu_used_mb, nodes[ip].gpu_total_mb = gram_used.get(ip, 0.0), gram_used.get(ip, 0.0) + value
    warnings = (
        []
        if deployments
        else ["Prometheus has no Serve series for this selector: check it matches the cluster's labels."]
    )
    size_metrics = size_metrics or {}
    for metric in sorted(set(size_metrics.values())):
        for (app, name), counts in _bucket_counts(q, f"{metric}_bucket{sel}", by, window, seconds).items():
            if size_metrics.get((app, name)) == metric and (d := dep({"application": app, "deployment": name})):
                d.sizes = counts
    prompts = _bucket_counts(q, f"{VLLM_PROMPT_TOKENS}_bucket{sel}", "model_name", window, seconds)
    generations = _bucket_counts(q, f"{VLLM_GENERATION_TOKENS}_bucket{sel}", "model_name", window, seconds)
    return Reading(
        seconds=float(seconds),
        deployments=deployments,
        nodes=nodes,
        warnings=warnings,
        applications=applications,
        model_sizes={
            model[0]: (prompts.get(model, {}), generations.get(model, {})) for model in prompts.keys() | generations
        },
    )


def _bucket_counts(q, series: str, by: str, window: str, seconds: float) -> dict[tuple, dict[str, float]]:
    """Per `by` key (a tuple of its labels' values), the requests per bucket of a histogram in the
    reading, each bucket's own count as metric_readings.bucket_counts gives it."""
    labels_by = [name.strip() for name in by.split(",")]
    cumulative: dict[tuple, dict[float, float]] = {}
    for labels, value in q(f"sum by ({by}, le) (rate({series}[{window}]))"):
        key = tuple(labels.get(name, "") for name in labels_by)
        if all(key) and value == value:
            cumulative.setdefault(key, {})[float(labels.get("le", "inf"))] = value * seconds
    return {key: counts for key, by_bound in cumulative.items() if (counts := own_counts(by_bound))}


def _applications(q, sel: str, window: str, seconds: float) -> dict[str, ApplicationSignals]:
    """What clients saw at the Serve proxies, per application. Counts are rates times `seconds`,
    like the deployments' requests, so that failed / answered is a ratio of the same window."""
    apps: dict[str, ApplicationSignals] = {}

    def app(labels: dict) -> ApplicationSignals | None:
        name = labels.get("application")
        return apps.setdefault(name, ApplicationSignals()) if name else None  # "" is the proxy's own routes

    for labels, value in q(f"sum by (application) (rate(ray_serve_num_http_requests_total{sel}[{window}]))"):
        if (a := app(labels)) is not None:
            a.requests = value * seconds
    for labels, value in q(
        f"sum by (application, error_code) (rate(ray_serve_num_http_error_requests_total{sel}[{window}]))"
    ):
        if (a := app(labels)) is not None and value:
            a.errors_by_code[labels.get("error_code", "unknown")] = value * seconds
    for q_value, attr in ((0.5, "p50_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
        for labels, value in q(
            f"histogram_quantile({q_value}, sum by (application, le) "
            f"(rate(ray_serve_http_request_latency_ms_bucket{sel}[{window}])))"
        ):
            if (a := app(labels)) is not None and value == value:  # NaN when there was no traffic
                setattr(a, attr, value)
    return apps
