"""Turning signals into incidents: open one per deployment and kind, extend it with later
signals, resolve it after a quiet period. Notes, acknowledgements and resolutions."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.changes.models import Change
from apps.clusters.models import Cluster, ClusterEvent, Reachability
from apps.clusters.ray_dashboard import RayError
from apps.clusters.services import dashboard_for
from apps.fleet.models import Deployment
from apps.incidents import detectors, prometheus, ray_metrics, signals, webhooks
from apps.incidents.causes import (
    LatencyContext,
    OomContext,
    rank_latency_causes,
    rank_oom_causes,
    rank_pressure_causes,
    rank_ratchet_causes,
    severity,
)
from apps.incidents.models import Incident, IncidentEvent, NodeWindow, OomKillRecord, ScrapeState, SignalWindow
from apps.incidents.oom import OomKill, oom_kills

RECENT = timedelta(minutes=15)
OPEN = [Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED]


def detect(cluster_id: int) -> list[int]:
    """Read OOM evidence from the state API and open or extend incidents. Returns incident ids touched."""
    cluster = Cluster.objects.filter(pk=cluster_id, reachability=Reachability.OK).first()
    if cluster is None:
        return []
    try:
        with dashboard_for(cluster) as ray:
            page = ray.list_actors(filters=[("state", "=", "DEAD")], detail=True, limit=10_000)
    except RayError:
        return []  # the sync records reachability; no evidence, no incident
    known = set(OomKillRecord.objects.filter(incident__cluster=cluster).values_list("actor_id", flat=True))
    fresh = [kill for kill in oom_kills(page.items) if kill.actor_id not in known]
    by_deployment: dict[tuple[str, str], list[OomKill]] = defaultdict(list)
    for kill in fresh:
        by_deployment[(kill.application, kill.deployment)].append(kill)
    per_node = Counter(kill.node_ip for kill in fresh)
    crowded = sorted(ip for ip, count in per_node.items() if count > 1)
    metrics = _metrics_evidence(cluster) if fresh else {}
    touched = [_record_oom(cluster, app, dep, kills, crowded, metrics) for (app, dep), kills in sorted(by_deployment.items())]
    resolve_quiet()
    return touched


def _metrics_evidence(cluster: Cluster) -> dict:
    """Totals since start from one scrape of Ray's metrics, when the cluster has an endpoint."""
    if not cluster.metrics_url:
        return {}
    try:
        reading = signals.read(ray_metrics.Scrape(at=0), ray_metrics.scrape(cluster.metrics_url, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S))
    except ray_metrics.MetricsUnavailable as exc:
        return {"metrics_warning": exc.message}
    return {
        "nodes": [{"ip": n.ip, "memory_used_fraction": round(n.mem_fraction, 3) if n.mem_fraction else None,
                   "memory_monitor_kills": n.evictions} for n in reading.nodes.values()],
        "out_of_memory_errors": {f"{app}/{dep}": d.oom_errors for (app, dep), d in reading.deployments.items() if d.oom_errors},
        "metrics_warnings": reading.warnings,
    }


def _deployment(cluster: Cluster, app: str, dep: str) -> Deployment | None:
    return Deployment.objects.filter(application__cluster=cluster, application__name=app, name=dep).first() if dep else None


def _open_or_extend(cluster: Cluster, app: str, dep: str, kind: str, *, count: int, severity_for, build, detected: str, extended: str,
                    node_ip: str = "", deployment: Deployment | None = None) -> Incident:
    """One open incident per deployment and kind: later signals extend it. `build()` makes the
    causes and evidence only when a new incident opens; `severity_for(total)` grades it."""
    now = timezone.now()
    incident = (
        Incident.objects.select_for_update()
        .filter(cluster=cluster, application_name=app, deployment_name=dep, node_ip=node_ip, kind=kind, status__in=OPEN)
        .first()
    )
    if incident is None:
        causes, evidence = build()
        where = f"node {node_ip}" if node_ip else f"{app}/{dep}"
        incident = Incident.objects.create(
            kind=kind, cluster=cluster, application_name=app, deployment_name=dep, node_ip=node_ip,
            deployment=deployment,
            title=f"{Incident.Kind(kind).label} of {where} on {cluster.name}", started_at=now, last_signal_at=now,
            signal_count=count, severity=severity_for(count), causes=causes, evidence=evidence,
        )
        IncidentEvent.objects.create(incident=incident, kind=IncidentEvent.Kind.DETECTED, message=detected)
        webhooks.queue_for(incident)
    else:
        incident.signal_count += count
        incident.last_signal_at = now
        incident.severity = max(incident.severity, severity_for(incident.signal_count), key=_severity_rank)
        incident.save(update_fields=["signal_count", "last_signal_at", "severity"])
        IncidentEvent.objects.create(incident=incident, kind=IncidentEvent.Kind.EXTENDED, message=extended)
    return incident


def _record_oom(cluster: Cluster, app: str, dep: str, kills: list[OomKill], crowded: list[str], metrics: dict) -> int:
    now = timezone.now()
    deployment = _deployment(cluster, app, dep)
    controller_killed = cluster.events.filter(kind=ClusterEvent.Kind.CONTROLLER_RESTARTED, created_at__gte=now - RECENT).exists()

    def build():
        ctx = _context(cluster, app, deployment, len(kills), crowded, controller_killed, now)
        window = SignalWindow.objects.filter(cluster=cluster, application_name=app, deployment_name=dep).first()
        series = {"series": window.points[-60:]} if window and window.points else {}
        return rank_oom_causes(ctx), _evidence(deployment, ctx) | metrics | series

    with transaction.atomic():
        incident = _open_or_extend(
            cluster, app, dep, Incident.Kind.OOM_KILL, count=len(kills), build=build, deployment=deployment,
            severity_for=lambda total: severity(total, controller_killed),
            detected=f"{len(kills)} replica(s) killed by Ray's memory monitor.", extended=f"{len(kills)} more replica(s) killed.",
        )
        OomKillRecord.objects.bulk_create(
            [OomKillRecord(incident=incident, actor_id=k.actor_id, replica=k.replica, node_ip=k.node_ip, used_bytes=k.used_bytes,
                           threshold_bytes=k.threshold_bytes, message=k.message) for k in kills],
            ignore_conflicts=True,
        )
    return incident.pk


def _severity_rank(value: str) -> int:
    return ["warning", "major", "critical"].index(value)


def _context(cluster, app, deployment, kills, crowded, controller_killed, now) -> OomContext:
    change = (
        Change.objects.filter(cluster=cluster)
        .filter(Q(started_at__gte=now - RECENT) | Q(finished_at__gte=now - RECENT))
        .order_by("-started_at")
        .first()
    )
    touched = change is not None and app in change.touched_applications
    return OomContext(
        kills=kills,
        max_ongoing_requests=deployment.max_ongoing_requests if deployment else None,
        autoscaling_target=deployment.autoscaling_target_ongoing_requests if deployment else None,
        minutes_since_change=((now - (change.started_at or change.created_at)).total_seconds() / 60) if touched else None,
        change_label=f"change #{change.pk} ({change.reason[:80]})" if touched else "",
        nodes_with_several_kills=crowded,
        controller_killed=controller_killed,
    )


def _evidence(deployment: Deployment | None, ctx: OomContext) -> dict:
    settings_then = {}
    if deployment is not None:
        settings_then = {
            "max_ongoing_requests": deployment.max_ongoing_requests,
            "max_queued_requests": deployment.max_queued_requests,
            "autoscaling": [deployment.autoscaling_min_replicas, deployment.autoscaling_max_replicas,
                            deployment.autoscaling_target_ongoing_requests] if deployment.autoscaling else None,
            "running_replicas": deployment.running_replicas,
        }
    return {"settings_at_detection": settings_then, "controller_killed_too": ctx.controller_killed,
            "nodes_with_several_kills": ctx.nodes_with_several_kills}


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
    try:
        reading = prometheus.read(cluster.prometheus_url, cluster.prometheus_selector, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S)
    except ray_metrics.MetricsUnavailable as exc:
        ScrapeState.objects.update_or_create(cluster=cluster, defaults={"at": 0, "samples": [], "error": exc.message})
        return None
    ScrapeState.objects.update_or_create(cluster=cluster, defaults={"at": time.time(), "samples": [], "error": "", "warnings": reading.warnings})
    return time.time(), reading


def _scrape_reading(cluster: Cluster):
    state = ScrapeState.objects.filter(cluster=cluster).first()
    try:
        current = signals.relevant(ray_metrics.scrape(cluster.metrics_url, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S))
    except ray_metrics.MetricsUnavailable as exc:
        ScrapeState.objects.update_or_create(cluster=cluster, defaults={"at": state.at if state else 0, "samples": state.samples if state else [],
                                                                       "error": exc.message})
        return None
    ScrapeState.objects.update_or_create(cluster=cluster, defaults={
        "at": current.at, "samples": [[s.name, s.labels, s.value] for s in current.samples], "error": "",
    })
    if state is None or not state.samples:
        return None  # a rate needs two scrapes
    previous = ray_metrics.Scrape(at=state.at, samples=[ray_metrics.Sample(n, labels, v) for n, labels, v in state.samples])
    reading = signals.read(previous, current)
    if reading.warnings:
        ScrapeState.objects.filter(cluster=cluster).update(warnings=reading.warnings)
    return current.at, reading


def _apply_reading(cluster: Cluster, at: float, reading: signals.Reading) -> list[int]:
    touched, pressure = [], False
    for ip, node in sorted(reading.nodes.items()):
        window, _ = NodeWindow.objects.get_or_create(cluster=cluster, node_ip=ip)
        window.points = signals.compact([*window.points, signals.node_point(at, node)], now=at)
        window.save(update_fields=["points", "updated_at"])
        for finding in (detectors.memory_pressure(window.points), detectors.memory_pressure(window.points, key="gpu"),
                        detectors.memory_ratchet(window.points)):
            if finding:
                pressure = pressure or finding.kind == "memory_pressure"
                touched.append(_record_node(cluster, ip, finding, window.points))
    for (app, dep), values in sorted(reading.deployments.items()):
        window, _ = SignalWindow.objects.get_or_create(cluster=cluster, application_name=app, deployment_name=dep)
        point = signals.point(at, reading.seconds, values, reading.applications.get(app))
        window.points = signals.compact([*window.points, point], now=at)
        window.save(update_fields=["points", "updated_at"])
        finding = detectors.latency_spike(window.points)
        if finding:
            touched.append(_record_latency(cluster, app, dep, finding, window.points, pressure))
        elif queue := detectors.queue_buildup(window.points):
            # Caught before it becomes a spike: the queue grows faster than replicas are added.
            touched.append(_record_queue(cluster, app, dep, queue, window.points))
    return touched


def _record_node(cluster: Cluster, ip: str, finding, points: list[dict]) -> int:
    busy = list(Deployment.objects.filter(application__cluster=cluster, removed_at__isnull=True, max_ongoing_requests__gt=2)
                .select_related("application").values_list("application__name", "name", "max_ongoing_requests")[:5])
    kind = Incident.Kind.MEMORY_RATCHET if finding.kind == "memory_ratchet" else Incident.Kind.MEMORY_PRESSURE

    def build():
        causes = rank_ratchet_causes() if kind == Incident.Kind.MEMORY_RATCHET else rank_pressure_causes(busy)
        return causes, {"summary": finding.summary, "node_series": points[-120:]}

    with transaction.atomic():
        incident = _open_or_extend(
            cluster, "", "", kind, node_ip=ip, count=1, build=build,
            severity_for=lambda total: "major" if finding.peak >= 0.95 else "warning",
            detected=finding.summary, extended=finding.summary,
        )
    return incident.pk


def _latency_context(deployment: Deployment | None, points: list[dict], *, pressure: bool) -> LatencyContext:
    recent = points[-detectors.SUSTAIN:]
    return LatencyContext(
        cold_start=detectors.cold_start(points),
        queue_building=detectors.queue_building(points),
        # The busiest recent reading, not the last one: queues drain as a spike ends.
        ongoing=max(p.get("ongoing") or 0 for p in recent),
        queued=max(p.get("queued") or 0 for p in recent),
        max_ongoing_requests=deployment.max_ongoing_requests if deployment else None,
        running_replicas=deployment.running_replicas if deployment else None,
        at_max_replicas=bool(deployment and deployment.autoscaling
                             and deployment.running_replicas >= (deployment.autoscaling_max_replicas or 0)),
        memory_pressure=pressure,
    )


def _record_queue(cluster: Cluster, app: str, dep: str, finding, points: list[dict]) -> int:
    deployment = _deployment(cluster, app, dep)

    def build():
        ctx = _latency_context(deployment, points, pressure=False)
        return rank_latency_causes(ctx), {"summary": finding.summary, "series": points[-60:]}

    with transaction.atomic():
        incident = _open_or_extend(cluster, app, dep, Incident.Kind.QUEUE_BUILDUP, count=1, build=build, deployment=deployment,
                                   severity_for=lambda total: "major" if finding.peak >= 50 else "warning",
                                   detected=finding.summary, extended=finding.summary)
    return incident.pk


def _record_latency(cluster: Cluster, app: str, dep: str, finding, points: list[dict], pressure: bool) -> int:
    deployment = _deployment(cluster, app, dep)

    def build():
        ctx = _latency_context(deployment, points, pressure=pressure)
        return rank_latency_causes(ctx), {"summary": finding.summary, "baseline_p99_ms": finding.baseline, "peak_p99_ms": finding.peak,
                                          "series": points[-60:]}

    with transaction.atomic():
        incident = _open_or_extend(
            cluster, app, dep, Incident.Kind.LATENCY_SPIKE, count=1, build=build, deployment=deployment,
            severity_for=lambda total: "critical" if finding.peak > 10_000 else ("major" if total > 2 or finding.peak > 2_000 else "warning"),
            detected=finding.summary, extended=finding.summary,
        )
        evidence = dict(incident.evidence)
        evidence["series"] = points[-60:]
        evidence["peak_p99_ms"] = max(evidence.get("peak_p99_ms") or 0, finding.peak)
        Incident.objects.filter(pk=incident.pk).update(evidence=evidence)
    return incident.pk


def resolve_quiet(now=None) -> int:
    now = now or timezone.now()
    quiet = Incident.objects.filter(status__in=OPEN, last_signal_at__lt=now - timedelta(seconds=settings.FLEETDECK_INCIDENT_QUIET_S))
    count = 0
    for incident in quiet:
        incident.status, incident.resolved_at = Incident.Status.RESOLVED, now
        incident.save(update_fields=["status", "resolved_at"])
        IncidentEvent.objects.create(incident=incident, kind=IncidentEvent.Kind.RESOLVED,
                                     message=f"No new signal for {settings.FLEETDECK_INCIDENT_QUIET_S // 60} min: resolved automatically.")
        count += 1
    return count


def add_note(actor: Actor, incident: Incident, text: str) -> IncidentEvent:
    event = IncidentEvent.objects.create(incident=incident, kind=IncidentEvent.Kind.NOTE, message=text.strip()[:4000], author=actor.user)
    record(actor, "incident.note", incident, team=incident.cluster.team)
    return event


def set_status(actor: Actor, incident: Incident, status: str) -> Incident:
    transitions = {
        Incident.Status.ACKNOWLEDGED: ([Incident.Status.OPEN], IncidentEvent.Kind.ACKNOWLEDGED),
        Incident.Status.RESOLVED: (OPEN, IncidentEvent.Kind.RESOLVED),
    }
    allowed, event = transitions[status]
    if incident.status not in allowed:
        raise ValueError(f"The incident is {incident.get_status_display().lower()}.")
    incident.status = status
    incident.resolved_at = timezone.now() if status == Incident.Status.RESOLVED else None
    incident.save(update_fields=["status", "resolved_at"])
    IncidentEvent.objects.create(incident=incident, kind=event, author=actor.user, message=f"By {actor.name}.")
    record(actor, f"incident.{status}", incident, team=incident.cluster.team)
    return incident


def open_for(deployment: Deployment) -> Incident | None:
    return Incident.objects.filter(
        cluster_id=deployment.application.cluster_id, application_name=deployment.application.name,
        deployment_name=deployment.name, status__in=OPEN,
    ).first()


def related_work(incident: Incident) -> list[dict]:
    """Changes and maintenance runs on the incident's application around its window, for the
    timeline: what an operator asks first is "what did we change?"."""
    return related_work_for([incident])[incident.pk]


def related_work_for(incidents: list[Incident]) -> dict[int, list[dict]]:
    """`related_work` of a page of incidents in two queries, not two per incident."""
    from apps.maintenance.models import MaintenanceRun

    if not incidents:
        return {}
    clusters = {incident.cluster_id for incident in incidents}
    since = min(incident.started_at for incident in incidents) - RECENT
    changes = list(Change.objects.filter(cluster_id__in=clusters, created_at__gte=since).order_by("created_at", "id"))
    runs = list(MaintenanceRun.objects.filter(cluster_id__in=clusters, created_at__gte=since).order_by("created_at", "id"))
    return {incident.pk: _related(incident, changes, runs) for incident in incidents}


def _related(incident: Incident, changes: list[Change], runs: list) -> list[dict]:
    since = incident.started_at - RECENT
    items = []
    for change in changes:
        if change.cluster_id != incident.cluster_id or change.created_at < since:
            continue
        if not incident.application_name or incident.application_name in change.touched_applications:
            items.append({"at": change.started_at or change.created_at, "kind": "change", "id": change.pk,
                          "text": f"Change #{change.pk} ({change.get_state_display().lower()}): {change.reason}"})
    for run in runs:
        if run.cluster_id != incident.cluster_id or run.created_at < since:
            continue
        if incident.deployment_id and run.deployment_id != incident.deployment_id:
            continue
        items.append({"at": run.started_at or run.created_at, "kind": "maintenance", "id": run.pk,
                      "text": f"{run.get_kind_display()} run #{run.pk} ({run.get_state_display().lower()})"})
    return sorted(items, key=lambda item: item["at"])
