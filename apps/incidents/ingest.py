"""Metrics readings into incidents: a reading (from Prometheus when the cluster names one, else by
differencing two scrapes of Ray's endpoint) is added to the deployment and node windows, and the
latency, queue, engine and memory detectors run on them. Runs as the metrics job, never inside a
sync (apps.incidents.metrics_jobs)."""

from __future__ import annotations

import time
from typing import cast

from django.conf import settings
from django.db import transaction

from apps.clusters.models import Cluster
from apps.fleet import llm, metric_readings, request_sizes
from apps.fleet.models import Deployment
from apps.incidents import detectors, prometheus_readings, services
from apps.incidents.causes import (
    LatencyContext,
    rank_engine_stuck_causes,
    rank_latency_causes,
    rank_pressure_causes,
    rank_ratchet_causes,
)
from apps.incidents.models import (
    Incident,
    NodeWindow,
    ScrapeState,
    SignalWindow,
)
from integrations import ray_metrics


def collect_metrics(cluster_id: int) -> list[int]:
    """Take a metrics reading (from Prometheus when configured, else by differencing two scrapes
    of Ray's endpoint), add it to the deployment and node windows, and run the detectors.
    Returns the incident ids opened or extended."""
    cluster = Cluster.objects.filter(pk=cluster_id).exclude(metrics_url="", prometheus_url="").first()
    if cluster is None:
        return []
    taken = _prometheus_reading(cluster) if cluster.prometheus_url else _scrape_reading(cluster)
    return _apply_reading(cluster, *taken) if taken else []


def _prometheus_reading(cluster: Cluster):
    state = ScrapeState.objects.filter(cluster=cluster).first()
    previous_at = state.at if state else 0.0
    span = prometheus_readings.interval(previous_at, time.time())
    if span is None:
        return None
    end, seconds = span
    try:
        reading = prometheus_readings.read(
            cluster.prometheus_url,
            cluster.prometheus_selector,
            end=end,
            seconds=seconds,
            timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S,
            size_metrics=request_sizes.named_metrics(cluster.pk),
        )
    except ray_metrics.MetricsUnavailable as exc:
        # The previous reading's end is kept: the next one counts the whole gap, once, as a scrape would.
        ScrapeState.objects.update_or_create(cluster=cluster, defaults={"at": previous_at, "error": exc.message})
        return None
    ScrapeState.objects.update_or_create(
        cluster=cluster, defaults={"at": end, "samples": [], "error": "", "warnings": reading.warnings}
    )
    return end, reading


def _scrape_reading(cluster: Cluster):
    state = ScrapeState.objects.filter(cluster=cluster).first()
    size_metrics = request_sizes.named_metrics(cluster.pk)
    sized = metric_readings.size_series(size_metrics)
    try:
        current = metric_readings.relevant(
            ray_metrics.scrape(
                cluster.metrics_url,
                timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S,
                names=metric_readings.SCRAPED | sized,
            ),
            sized,
        )
    except ray_metrics.MetricsUnavailable as exc:
        ScrapeState.objects.update_or_create(
            cluster=cluster,
            defaults={"at": state.at if state else 0, "samples": state.samples if state else [], "error": exc.message},
        )
        return None
    ScrapeState.objects.update_or_create(
        cluster=cluster,
        defaults={
            "at": current.at,
            "samples": [[s.name, s.labels, s.value] for s in current.samples],
            "error": "",
        },
    )
    if state is None or not state.samples:
        return None  # a rate needs two scrapes
    previous = ray_metrics.Scrape(
        at=state.at, samples=[ray_metrics.Sample(n, labels, v) for n, labels, v in state.samples]
    )
    reading = metric_readings.read(previous, current, size_metrics)
    if reading.warnings:
        ScrapeState.objects.filter(cluster=cluster).update(warnings=reading.warnings)
    return current.at, reading


def _apply_reading(cluster: Cluster, at: float, reading: metric_readings.Reading) -> list[int]:
    touched, pressure = [], False
    for ip, node in sorted(reading.nodes.items()):
        window, _ = NodeWindow.objects.get_or_create(cluster=cluster, node_ip=ip)
        window.save_points(metric_readings.compact([*window.points, metric_readings.node_point(at, node)], now=at))
        for finding in (
            detectors.memory_pressure(window.points),
            detectors.memory_pressure(window.points, key="gpu"),
            detectors.memory_ratchet(window.points),
        ):
            if finding:
                pressure = pressure or finding.kind == "memory_pressure"
                touched.append(_record_node(cluster, ip, finding, window.points))
    serving = llm.deployments_by_model(cluster.pk, set(reading.engines) | set(reading.model_sizes))
    engines = {where: reading.engines[model] for model, where in serving.items() if model in reading.engines}
    model_sizes = {
        where: reading.model_sizes[model] for model, where in serving.items() if model in reading.model_sizes
    }
    deployments = reading.deployments | {
        key: metric_readings.DeploymentSignals()
        for key in (engines.keys() | model_sizes.keys()) - set(reading.deployments)
    }
    for (app, dep), values in sorted(deployments.items()):
        signals, _ = SignalWindow.objects.get_or_create(cluster=cluster, application_name=app, deployment_name=dep)
        point = metric_readings.point(
            at,
            reading.seconds,
            values,
            reading.applications.get(app),
            engines.get((app, dep)),
            model_sizes.get((app, dep)),
        )
        signals.save_points(metric_readings.compact([*signals.points, point], now=at))
        if stuck := detectors.engine_stuck(signals.points):
            touched.append(_record_engine_stuck(cluster, app, dep, stuck, signals.points))
        finding = detectors.latency_spike(signals.points)
        if finding:
            touched.append(_record_latency(cluster, app, dep, finding, signals.points, pressure))
        elif queue := detectors.queue_buildup(signals.points):
            # Caught before it becomes a spike: the queue grows faster than replicas are added.
            touched.append(_record_queue(cluster, app, dep, queue, signals.points))
    # An open OOM incident's charts follow the readings after the kill: whether memory came back down.
    for incident in Incident.objects.filter(
        cluster=cluster, kind=Incident.Kind.OOM_KILL, status__in=services.OPEN
    ).select_related("cluster"):
        services.keep_windows(incident)
    return touched


def _record_node(cluster: Cluster, ip: str, finding, points: list[dict]) -> int:
    # max_ongoing_requests__gt=2 leaves out the NULLs the column's type allows.
    busy = cast(
        list[tuple[str, str, int]],
        list(
            Deployment.objects.filter(application__cluster=cluster, removed_at__isnull=True, max_ongoing_requests__gt=2)
            .select_related("application")
            .values_list("application__name", "name", "max_ongoing_requests")[:5]
        ),
    )
    kind = Incident.Kind.MEMORY_RATCHET if finding.kind == "memory_ratchet" else Incident.Kind.MEMORY_PRESSURE

    def build():
        causes = rank_ratchet_causes() if kind == Incident.Kind.MEMORY_RATCHET else rank_pressure_causes(busy)
        return causes, {"summary": finding.summary, "node_series": points[-120:]}

    with transaction.atomic():
        incident = services.open_or_extend(
            cluster,
            "",
            "",
            kind,
            node_ip=ip,
            count=1,
            build=build,
            severity_for=lambda total: "major" if finding.peak >= 0.95 else "warning",
            detected=finding.summary,
            extended=finding.summary,
        )
    return incident.pk


def _latency_context(deployment: Deployment | None, points: list[dict], *, pressure: bool) -> LatencyContext:
    recent = points[-detectors.SUSTAIN :]
    source = request_sizes.source(deployment, llm.could_serve_llm(deployment)) if deployment else None
    return LatencyContext(
        sizes_p90=request_sizes.growth(points, detectors.SUSTAIN) if source else None,
        size_unit=source["unit"] if source else "",
        cold_start=detectors.cold_start(points),
        queue_building=detectors.queue_building(points),
        # The busiest recent reading, not the last one: queues drain as a spike ends.
        ongoing=max(p.get("ongoing") or 0 for p in recent),
        queued=max(p.get("queued") or 0 for p in recent),
        max_ongoing_requests=deployment.max_ongoing_requests if deployment else None,
        running_replicas=deployment.running_replicas if deployment else None,
        at_max_replicas=bool(
            deployment
            and deployment.autoscaling
            and deployment.running_replicas >= (deployment.autoscaling_max_replicas or 0)
        ),
        memory_pressure=pressure,
        kv_cache_full=max((p.get("kv_usage") or 0) for p in recent) >= detectors.KV_FULL,
        preemptions=sum(p.get("preemptions") or 0 for p in recent),
    )


def _record_signal(cluster: Cluster, app: str, dep: str, kind: str, finding, causes, severity_for) -> int:
    """Open or extend the deployment's incident of `kind` from a detector's finding; `causes(deployment)`
    ranks them when the incident opens."""
    deployment = services.deployment_of(cluster, app, dep)
    with transaction.atomic():
        incident = services.open_or_extend(
            cluster,
            app,
            dep,
            kind,
            count=1,
            build=lambda: causes(deployment),
            deployment=deployment,
            severity_for=severity_for,
            detected=finding.summary,
            extended=finding.summary,
        )
    return incident.pk


def _record_queue(cluster: Cluster, app: str, dep: str, finding, points: list[dict]) -> int:
    def causes(deployment):
        ctx = _latency_context(deployment, points, pressure=False)
        return rank_latency_causes(ctx), {"summary": finding.summary, "series": points[-60:]}

    return _record_signal(
        cluster,
        app,
        dep,
        Incident.Kind.QUEUE_BUILDUP,
        finding,
        causes,
        lambda total: "major" if finding.peak >= 50 else "warning",
    )


def _record_engine_stuck(cluster: Cluster, app: str, dep: str, finding, points: list[dict]) -> int:
    return _record_signal(
        cluster,
        app,
        dep,
        Incident.Kind.ENGINE_STUCK,
        finding,
        lambda deployment: (rank_engine_stuck_causes(), {"summary": finding.summary, "series": points[-60:]}),
        lambda total: "critical" if finding.peak >= 10 else "major",
    )


def _record_latency(cluster: Cluster, app: str, dep: str, finding, points: list[dict], pressure: bool) -> int:
    deployment = services.deployment_of(cluster, app, dep)

    def build():
        ctx = _latency_context(deployment, points, pressure=pressure)
        return rank_latency_causes(ctx), {
            "summary": finding.summary,
            "baseline_p99_ms": finding.baseline,
            "peak_p99_ms": finding.peak,
            "series": points[-60:],
        }

    with transaction.atomic():
        incident = services.open_or_extend(
            cluster,
            app,
            dep,
            Incident.Kind.LATENCY_SPIKE,
            count=1,
            build=build,
            deployment=deployment,
            severity_for=lambda total: (
                "critical" if finding.peak > 10_000 else ("major" if total > 2 or finding.peak > 2_000 else "warning")
            ),
            detected=finding.summary,
            extended=finding.summary,
        )
        evidence = dict(incident.evidence)
        evidence["series"] = points[-60:]
        evidence["peak_p99_ms"] = max(evidence.get("peak_p99_ms") or 0, finding.peak)
        Incident.objects.filter(pk=incident.pk).update(evidence=evidence)
    return incident.pk
