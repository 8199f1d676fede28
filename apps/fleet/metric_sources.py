"""A cluster's Ray series as they stand now: from the Prometheus it names (the setup recommended
for large fleets, which then need no metrics URL), else from Ray's own metrics endpoint. Either
gives a `Scrape` of totals, so `metric_readings.read` differences both the same way."""

from __future__ import annotations

from collections.abc import Collection

from django.conf import settings

from integrations import prometheus, ray_metrics
from integrations.ray_metrics import MetricsUnavailable, Scrape


def source(cluster) -> str:
    """Which source `current` reads, as kept beside a reading: totals of two sources (Prometheus
    adds its own labels) cannot be differenced."""
    return "prometheus" if cluster.prometheus_url else "metrics"


def current(cluster, names: Collection[str]) -> Scrape:
    """The series of `names` now. MetricsUnavailable says which source failed: a cluster with both
    would otherwise leave the reader guessing which one to fix."""
    timeout_s = settings.FLEETDECK_RAY_TIMEOUT_S
    try:
        if cluster.prometheus_url:
            return prometheus.series(cluster.prometheus_url, names, cluster.prometheus_selector, timeout_s=timeout_s)
        return ray_metrics.scrape(cluster.metrics_url, timeout_s=timeout_s, names=names)
    except MetricsUnavailable as exc:
        where = "Prometheus" if cluster.prometheus_url else "Metrics endpoint"
        raise MetricsUnavailable(f"{where}: {exc.message}", transient=exc.transient) from exc
