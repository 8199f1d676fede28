"""Request sizes: what a deployment's traffic brings, in tokens, bytes or items, as the histograms
that count it say. The playbook asks operators to watch request sizes next to concurrency, queue
length and memory; a calibration can size from them (an observed mix).

Where the sizes come from: vLLM's prompt and generation token histograms for a serve.llm deployment
(no setup), else the histogram an application exports with `ray.serve.metrics.Histogram` and the
operator names here. Each signal point of the deployment keeps the requests per bucket in its
interval ("size_in", "size_out": {upper bound: count}, see metric_readings.point); the functions
below read those points. Ray exports the application's histogram with the deployment and
application tags Serve adds, which is how its series find their deployment."""

from __future__ import annotations

import re
from collections.abc import Iterable

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.fleet.metric_readings import Key, bound_text, quantile
from apps.fleet.models import Deployment

SET_SIZE_METRIC = Permission(Role.OPERATOR, "name the histogram of a deployment's request sizes")

UNITS = ("tokens", "bytes", "items")
# Prometheus's metric names; Ray prefixes an application's own with "ray_".
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


def named_metrics(cluster_id: int) -> dict[Key, str]:
    """The histogram each deployment of the cluster has named: {(application, deployment): name}."""
    rows = (
        Deployment.objects.filter(application__cluster_id=cluster_id, removed_at__isnull=True)
        .exclude(size_metric="")
        .values_list("application__name", "name", "size_metric")
    )
    return {(app, dep): metric for app, dep, metric in rows}


def clean_metric(metric: str) -> str:
    """The histogram's name as the readings want it: without a series suffix an operator may have
    copied from a scrape. ValueError says what a name is."""
    metric = (metric or "").strip()
    for suffix in HISTOGRAM_SUFFIXES:
        if metric.endswith(suffix):
            metric = metric[: -len(suffix)]
            break
    if metric and not METRIC_NAME.match(metric):
        raise ValueError(
            f"{metric!r} is not a Prometheus metric name (letters, digits, _ and :, not starting with a digit)."
        )
    return metric


def set_size_metric(actor: Actor, deployment: Deployment, *, metric: str, unit: str) -> Deployment:
    """Name (or, with an empty name, forget) the histogram of the deployment's request sizes."""
    metric = clean_metric(metric)
    if metric and unit not in UNITS:
        raise ValueError(f"The unit is one of {', '.join(UNITS)}, not {unit!r}: what the histogram counts.")
    deployment.size_metric, deployment.size_unit = metric, unit if metric else ""
    deployment.save(update_fields=["size_metric", "size_unit", "updated_at"])
    record(
        actor,
        "deployment.size_metric",
        deployment,
        team=deployment.application.cluster.team,
        changes={"size_metric": metric, "size_unit": deployment.size_unit},
    )
    return deployment


def source(deployment: Deployment, is_llm: bool) -> dict | None:
    """Where the deployment's sizes come from: {"metric", "unit", "output"}, or None when nothing counts them.
    `output` names what size_out counts (an LLM's generated tokens)."""
    if deployment.size_metric:
        return {"metric": deployment.size_metric, "unit": deployment.size_unit or "items", "output": None}
    if is_llm:
        return {"metric": "vLLM's prompt tokens", "unit": "tokens", "output": "generated tokens"}
    return None


def merged(points: Iterable[dict], key: str = "size_in") -> list[tuple[float, float]]:
    """The requests per bucket over the points: [(upper bound, count)], by bound, +Inf last."""
    total: dict[float, float] = {}
    for p in points:
        for bound, count in (p.get(key) or {}).items():
            total[float(bound)] = total.get(float(bound), 0.0) + count
    return sorted(total.items())


def cumulative(buckets: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, running = [], 0.0
    for bound, count in buckets:
        running += count
        out.append((bound, running))
    return out


def quantiles(buckets: list[tuple[float, float]]) -> dict:
    """p50/p90/p99 of the sizes (interpolated inside a bucket), and the requests counted."""
    series = cumulative(buckets)
    out: dict = {"requests": round(series[-1][1]) if series else 0}
    for q, name in QUANTILES:
        value = quantile(series, q) if series else None
        out[name] = round(value, 1) if value is not None else None
    return out


def over_time(points: list[dict], key: str = "size_in") -> list[dict]:
    """One entry per point that counted requests: {"t", "p50", "p90", "p99", "requests"}."""
    return [{"t": p["t"], **quantiles(merged([p], key))} for p in points if p.get(key)]


def classes(buckets: list[tuple[float, float]], most: int) -> list[dict]:
    """The sizes of a mix that stands for the observed traffic: at most `most` classes, each
    {"size", "share" (percent), "above"} where "size" is the upper bound of its heaviest bucket, so no
    request of the class is heavier than what is measured. Adjacent buckets merge where they carry the
    least traffic, so the heavy tail keeps classes of its own. The open bucket past the histogram's
    last bound has no upper bound: its requests are counted at the last bound and flagged "above"."""
    filled = [(bound, count) for bound, count in buckets if count > 0]
    total = sum(count for _, count in filled)
    if not filled or total <= 0 or most < 1:
        return []
    finite = [bound for bound, _ in buckets if bound != float("inf")]
    groups = [[bound, count] for bound, count in filled]
    while len(groups) > most:
        pair = min(range(len(groups) - 1), key=lambda i: groups[i][1] + groups[i + 1][1])
        groups[pair : pair + 2] = [[groups[pair + 1][0], groups[pair][1] + groups[pair + 1][1]]]
    out = []
    for bound, count in groups:
        above = bound == float("inf")
        size = max(finite) if above and finite else bound
        if above and not finite:
            return []  # a histogram with only +Inf says nothing about sizes
        out.append(
            {"size": int(size) if float(size).is_integer() else size, "share": 100 * count / total, "above": above}
        )
    # Rounded to the hundredth, the largest share absorbing the rounding, so they add up to 100.
    for entry in out:
        entry["share"] = round(entry["share"], 2)
    largest = max(out, key=lambda e: e["share"])
    largest["share"] = round(largest["share"] + 100 - sum(e["share"] for e in out), 2)
    return out


# Requests during a latency spike this much larger (p90) than before it point at their size (LAT-4);
# each side needs this many requests counted for its p90 to mean anything.
GROWTH = 2.0
MIN_REQUESTS = 10


def growth(points: list[dict], recent: int, key: str = "size_in") -> tuple[float, float] | None:
    """(p90 of the sizes in the last `recent` points, p90 in the points before them), or None where
    either side counted fewer than MIN_REQUESTS requests."""
    during, before = merged(points[-recent:], key), merged(points[:-recent], key)
    if min(sum(n for _, n in during), sum(n for _, n in before)) < MIN_REQUESTS:
        return None
    p90_during, p90_before = quantile(cumulative(during), 0.9), quantile(cumulative(before), 0.9)
    if p90_during is None or p90_before is None:
        return None
    return p90_during, p90_before


def bucket_label(bound: float) -> str:
    return "above the last bound" if bound == float("inf") else f"≤ {bound_text(bound)}"
