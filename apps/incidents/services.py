"""Turning signals into incidents: open one per deployment and kind, extend it with later
signals, resolve it after a quiet period. Notes, acknowledgements and resolutions."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.clusters.models import Cluster, ClusterEvent, Reachability
from apps.clusters.services import dashboard_for
from apps.fleet import llm, metric_readings
from apps.fleet.models import Deployment
from apps.incidents import cluster_history, detectors, prometheus_readings, webhooks
from apps.incidents.causes import (
    LatencyContext,
    OomContext,
    change_in_effect,
    rank_engine_stuck_causes,
    rank_latency_causes,
    rank_oom_causes,
    rank_pressure_causes,
    rank_ratchet_causes,
    severity,
)
from apps.incidents.models import (
    Incident,
    IncidentEvent,
    NodeWindow,
    OomKillRecord,
    ScrapeState,
    SignalWindow,
    WebhookDelivery,
)
from apps.incidents.oom import OomKill, culprit, oom_kills
from integrations import ray_metrics
from integrations.ray.errors import RayError
from integrations.ray.observation import DEAD_ACTORS, Observation
from integrations.ray.payloads import StatePage

HANDLE = Permission(Role.OPERATOR, "handle incidents")

RECENT = timedelta(minutes=15)
# Readings an OOM incident keeps from before it began: the build-up to the kill.
LEAD = timedelta(minutes=30)
# An hour of readings at a sync every 30 s, the build-up included: evidence travels with every
# incident the API lists, so a long incident keeps its latest ones.
KEPT_POINTS = 120
OPEN = [Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED]


def on_cluster_synced(sender, cluster_id: int, outcome, **kwargs) -> None:
    # OOM evidence lives in the state API, not in Serve's status: the sync reads the dead actors
    # with every sync, and when they are as the last applied sync read them there is nothing new.
    if not outcome.unchanged:
        detect(cluster_id, outcome.observation, resolve=False)


def on_batch_synced(sender, outcomes, **kwargs) -> None:
    # Detection resolves quiet incidents too, by the clock alone; unchanged syncs skip detection.
    if any(outcome.ok for outcome in outcomes):
        resolve_quiet()


def detect(cluster_id: int, observation: Observation | None = None, *, resolve: bool = True) -> list[int]:
    """Read OOM evidence from the state API (or from the dead actors a sync read) and open or
    extend incidents, then resolve quiet ones unless `resolve` is False (a batch sync resolves
    them once for all its clusters). Returns incident ids touched."""
    cluster = Cluster.objects.filter(pk=cluster_id, reachability=Reachability.OK).first()
    if cluster is None:
        return []
    page: StatePage | None
    try:
        if observation is None:
            with dashboard_for(cluster) as ray:
                page = ray.list_actors(**DEAD_ACTORS)
        else:
            page = observation.dead_actors()
    except RayError:
        page = None
    if page is None:
        return []  # the sync records reachability; no evidence, no incident
    known = set(OomKillRecord.objects.filter(incident__cluster=cluster).values_list("actor_id", flat=True))
    fresh = [kill for kill in oom_kills(page.items) if kill.actor_id not in known]
    by_deployment: dict[tuple[str, str], list[OomKill]] = defaultdict(list)
    for kill in fresh:
        by_deployment[culprit(kill)].append(kill)
    per_node = Counter(kill.node_ip for kill in fresh)
    deployments_per_node: dict[str, set] = defaultdict(set)
    for kill in fresh:
        deployments_per_node[kill.node_ip].add(culprit(kill))
    # Nodes where replicas were killed together: of several deployments, or (checked per deployment in
    # _context) of one that runs several replicas; a one-replica deployment killed again after its restart is not.
    crowded = {ip: len(deployments_per_node[ip]) > 1 for ip, count in per_node.items() if count > 1}
    metrics = _metrics_evidence(cluster) if fresh else {}
    touched = [
        _record_oom(cluster, app, dep, kills, crowded, metrics) for (app, dep), kills in sorted(by_deployment.items())
    ]
    if resolve:
        resolve_quiet()
    return touched


def _metrics_evidence(cluster: Cluster) -> dict:
    """Totals since start from one scrape of Ray's metrics, when the cluster has an endpoint."""
    if not cluster.metrics_url:
        return {}
    try:
        reading = metric_readings.read(
            ray_metrics.Scrape(at=0),
            ray_metrics.scrape(
                cluster.metrics_url, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S, names=metric_readings.SCRAPED
            ),
        )
    except ray_metrics.MetricsUnavailable as exc:
        return {"metrics_warning": exc.message}
    return {
        "nodes": [
            {
                "ip": n.ip,
                "memory_used_fraction": round(n.mem_fraction, 3) if n.mem_fraction else None,
                "memory_monitor_kills": n.evictions,
            }
            for n in reading.nodes.values()
        ],
        "out_of_memory_errors": {
            f"{app}/{dep}": d.oom_errors for (app, dep), d in reading.deployments.items() if d.oom_errors
        },
        "metrics_warnings": reading.warnings,
    }


def _deployment(cluster: Cluster, app: str, dep: str) -> Deployment | None:
    return (
        Deployment.objects.filter(application__cluster=cluster, application__name=app, name=dep).first()
        if dep
        else None
    )


def open_or_extend(
    cluster: Cluster,
    app: str,
    dep: str,
    kind: str,
    *,
    count: int,
    severity_for,
    build,
    detected: str,
    extended: str,
    node_ip: str = "",
    deployment: Deployment | None = None,
) -> Incident:
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
            kind=kind,
            cluster=cluster,
            application_name=app,
            deployment_name=dep,
            node_ip=node_ip,
            deployment=deployment,
            title=f"{Incident.Kind(kind).label} of {where} on {cluster.name}",
            started_at=now,
            last_signal_at=now,
            signal_count=count,
            severity=severity_for(count),
            causes=causes,
            evidence=evidence,
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


def _record_oom(
    cluster: Cluster, app: str, dep: str, kills: list[OomKill], crowded: dict[str, bool], metrics: dict
) -> int:
    now = timezone.now()
    deployment = _deployment(cluster, app, dep)
    controller_killed = cluster.events.filter(
        kind=ClusterEvent.Kind.CONTROLLER_RESTARTED, created_at__gte=now - RECENT
    ).exists()

    def build():
        ctx, not_counted = _context(cluster, app, deployment, len(kills), crowded, controller_killed, now)
        started = cluster_history.session_start(cluster, now)
        session = {"session": {"name": cluster.session_name, "started_at": started.isoformat() if started else None}}
        counted = {"changes_not_counted": not_counted} if not_counted else {}
        return rank_oom_causes(ctx), _evidence(deployment, ctx) | metrics | session | counted

    beside = _killed_beside(app, dep, kills)
    with transaction.atomic():
        incident = open_or_extend(
            cluster,
            app,
            dep,
            Incident.Kind.OOM_KILL,
            count=len(kills),
            build=build,
            deployment=deployment,
            severity_for=lambda total: severity(total, controller_killed),
            detected=f"{len(kills)} replica(s) killed by Ray's memory monitor.{beside}",
            extended=f"{len(kills)} more replica(s) killed.{beside}",
        )
        OomKillRecord.objects.bulk_create(
            [
                OomKillRecord(
                    incident=incident,
                    actor_id=k.actor_id,
                    replica=k.replica,
                    killed_deployment=""
                    if (k.application, k.deployment) == (app, dep)
                    else f"{k.application}/{k.deployment}",
                    node_ip=k.node_ip,
                    used_bytes=k.used_bytes,
                    threshold_bytes=k.threshold_bytes,
                    message=k.message,
                )
                for k in kills
            ],
            ignore_conflicts=True,
        )
        _keep_windows(incident)
    return incident.pk


def _killed_beside(app: str, dep: str, kills: list[OomKill]) -> str:
    others = sorted({f"{k.application}/{k.deployment}" for k in kills if (k.application, k.deployment) != (app, dep)})
    if not others:
        return ""
    return (
        f" Counted here: replicas of {', '.join(others)} killed in the same pass while a replica of {app}/{dep} "
        "held the memory (Ray's message lists what each held)."
    )


def _keep_windows(incident: Incident) -> None:
    """Copy the readings around an OOM incident into its evidence: the deployment's and those of
    the nodes where its replicas were killed, from a while before it began, never from before
    its session began (readings from before a restart are of replicas long gone), and only while
    that session lasts."""
    session = incident.evidence.get("session") or {}
    if session.get("name") != incident.cluster.session_name:
        return
    since = incident.started_at - LEAD
    if session.get("started_at"):
        since = max(since, datetime.fromisoformat(session["started_at"]))
    evidence = dict(incident.evidence)
    window = SignalWindow.objects.filter(
        cluster=incident.cluster, application_name=incident.application_name, deployment_name=incident.deployment_name
    ).first()
    if window is not None:
        evidence["series"] = _merged(evidence.get("series") or [], window.points, since.timestamp())
    ips = set(incident.oom_kills.exclude(node_ip="").values_list("node_ip", flat=True))
    nodes = dict(evidence.get("node_memory") or {})
    for node in NodeWindow.objects.filter(cluster=incident.cluster, node_ip__in=ips):
        readings = [{"t": p["t"], "mem_used": p.get("mem_used"), "mem_total": p.get("mem_total")} for p in node.points]
        nodes[node.node_ip] = _merged(nodes.get(node.node_ip) or [], readings, since.timestamp())
    if nodes:
        evidence["node_memory"] = nodes
    if evidence != incident.evidence:
        incident.evidence = evidence
        Incident.objects.filter(pk=incident.pk).update(evidence=evidence)


def _merged(kept: list[dict], points: list[dict], since: float) -> list[dict]:
    """Readings kept so far plus new ones at or after `since`, one per time, the latest `KEPT_POINTS`."""
    by_time = {point["t"]: point for point in points if point["t"] >= since}
    by_time.update({point["t"]: point for point in kept})
    return [by_time[t] for t in sorted(by_time)][-KEPT_POINTS:]


def _severity_rank(value: str) -> int:
    return ["warning", "major", "critical"].index(value)


def killed_together(crowded: dict[str, bool], replicas: int) -> list[str]:
    """The nodes where replicas died together: several deployments' kills, or one deployment's that runs
    several replicas. A one-replica deployment killed again after its restart was not crowded, only killed twice."""
    return sorted(ip for ip, several_deployments in crowded.items() if several_deployments or replicas > 1)


def _context(cluster, app, deployment, kills, crowded, controller_killed, now) -> tuple[OomContext, list[str]]:
    """The kill's context, and why recent changes that no longer run are not suspected."""
    changes, history = cluster_history.before_kill(cluster, app, now, RECENT)
    change, not_counted = change_in_effect(changes, history)
    replicas = (deployment.target_replicas or deployment.running_replicas or 1) if deployment else 1
    context = OomContext(
        kills=kills,
        max_ongoing_requests=deployment.max_ongoing_requests if deployment else None,
        autoscaling_target=deployment.autoscaling_target_ongoing_requests if deployment else None,
        minutes_since_change=(now - change.at).total_seconds() / 60 if change else None,
        change_label=change.label if change else "",
        nodes_with_several_kills=killed_together(crowded, replicas),
        controller_killed=controller_killed,
    )
    return context, not_counted


def _evidence(deployment: Deployment | None, ctx: OomContext) -> dict:
    settings_then = {}
    if deployment is not None:
        settings_then = {
            "max_ongoing_requests": deployment.max_ongoing_requests,
            "max_queued_requests": deployment.max_queued_requests,
            "autoscaling": [
                deployment.autoscaling_min_replicas,
                deployment.autoscaling_max_replicas,
                deployment.autoscaling_target_ongoing_requests,
            ]
            if deployment.autoscaling
            else None,
            "running_replicas": deployment.running_replicas,
        }
    return {
        "settings_at_detection": settings_then,
        "controller_killed_too": ctx.controller_killed,
        "nodes_with_several_kills": ctx.nodes_with_several_kills,
    }


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
        reading = prometheus_readings.read(
            cluster.prometheus_url, cluster.prometheus_selector, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S
        )
    except ray_metrics.MetricsUnavailable as exc:
        ScrapeState.objects.update_or_create(cluster=cluster, defaults={"at": 0, "samples": [], "error": exc.message})
        return None
    ScrapeState.objects.update_or_create(
        cluster=cluster, defaults={"at": time.time(), "samples": [], "error": "", "warnings": reading.warnings}
    )
    return time.time(), reading


def _scrape_reading(cluster: Cluster):
    state = ScrapeState.objects.filter(cluster=cluster).first()
    try:
        current = metric_readings.relevant(
            ray_metrics.scrape(
                cluster.metrics_url, timeout_s=settings.FLEETDECK_RAY_TIMEOUT_S, names=metric_readings.SCRAPED
            )
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
    reading = metric_readings.read(previous, current)
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
    engines = {
        where: reading.engines[model]
        for model, where in llm.deployments_by_model(cluster.pk, set(reading.engines)).items()
    }
    deployments = reading.deployments | {
        key: metric_readings.DeploymentSignals() for key in engines.keys() - set(reading.deployments)
    }
    for (app, dep), values in sorted(deployments.items()):
        signals, _ = SignalWindow.objects.get_or_create(cluster=cluster, application_name=app, deployment_name=dep)
        point = metric_readings.point(
            at, reading.seconds, values, reading.applications.get(app), engines.get((app, dep))
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
        cluster=cluster, kind=Incident.Kind.OOM_KILL, status__in=OPEN
    ).select_related("cluster"):
        _keep_windows(incident)
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
        incident = open_or_extend(
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
    return LatencyContext(
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
    deployment = _deployment(cluster, app, dep)
    with transaction.atomic():
        incident = open_or_extend(
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
    deployment = _deployment(cluster, app, dep)

    def build():
        ctx = _latency_context(deployment, points, pressure=pressure)
        return rank_latency_causes(ctx), {
            "summary": finding.summary,
            "baseline_p99_ms": finding.baseline,
            "peak_p99_ms": finding.peak,
            "series": points[-60:],
        }

    with transaction.atomic():
        incident = open_or_extend(
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


def resolve_quiet(now=None) -> int:
    now = now or timezone.now()
    quiet = Incident.objects.filter(
        status__in=OPEN, last_signal_at__lt=now - timedelta(seconds=settings.FLEETDECK_INCIDENT_QUIET_S)
    )
    count = 0
    for incident in quiet:
        incident.status, incident.resolved_at = Incident.Status.RESOLVED, now
        incident.save(update_fields=["status", "resolved_at"])
        IncidentEvent.objects.create(
            incident=incident,
            kind=IncidentEvent.Kind.RESOLVED,
            message=f"No new signal for {settings.FLEETDECK_INCIDENT_QUIET_S // 60} min: resolved automatically.",
        )
        webhooks.queue_for(incident, WebhookDelivery.Event.RESOLVED)
        count += 1
    return count


def add_note(actor: Actor, incident: Incident, text: str) -> IncidentEvent:
    event = IncidentEvent.objects.create(
        incident=incident, kind=IncidentEvent.Kind.NOTE, message=text.strip()[:4000], author=actor.user
    )
    record(actor, "incident.note", incident, team=incident.cluster.team)
    return event


def set_status(actor: Actor, incident: Incident, status: str) -> Incident:
    transitions: dict[str, tuple[list[Incident.Status], IncidentEvent.Kind]] = {
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
    if status == Incident.Status.RESOLVED:
        webhooks.queue_for(incident, WebhookDelivery.Event.RESOLVED)
    return incident


def open_for(deployment: Deployment) -> Incident | None:
    return Incident.objects.filter(
        cluster_id=deployment.application.cluster_id,
        application_name=deployment.application.name,
        deployment_name=deployment.name,
        status__in=OPEN,
    ).first()


def recycle_hold(deployment: Deployment) -> str | None:
    """Registered with `apps.fleet.holds`: a recycle waits while an incident is open on the deployment."""
    incident = open_for(deployment)
    return f"Incident #{incident.pk} ({incident.title}) is open on this deployment." if incident else None
