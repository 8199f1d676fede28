"""Turning signals into incidents: open one per deployment and kind, extend it with later
signals, record OOM kills with their evidence, resolve quiet ones. Metrics readings come in
through `ingest`; what people do to an incident is in `actions`."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.clusters.models import Cluster, ClusterEvent, Reachability
from apps.clusters.services import dashboard_for
from apps.fleet import metric_readings, metric_sources
from apps.fleet.models import Deployment
from apps.incidents import cluster_history, webhooks
from apps.incidents.causes import (
    OomContext,
    change_in_effect,
    rank_oom_causes,
    severity,
)
from apps.incidents.models import (
    Incident,
    IncidentEvent,
    NodeWindow,
    OomKillRecord,
    SignalWindow,
    WebhookDelivery,
)
from apps.incidents.oom import OomKill, culprit, oom_kills
from integrations import ray_metrics
from integrations.ray.errors import RayError
from integrations.ray.observation import DEAD_ACTORS, Observation
from integrations.ray.payloads import StatePage

RECENT = timedelta(minutes=15)
# Readings an OOM incident keeps from before it began: the build-up to the kill.
LEAD = timedelta(minutes=30)
# An hour of readings at a sync every 30 s, the build-up included: evidence travels with every
# incident the API lists, so a long incident keeps its latest ones.
KEPT_POINTS = 120
OPEN = [Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED]
# What the OOM evidence shows: nodes' memory and the monitor's kills, replicas' OutOfMemoryErrors.
EVIDENCE = (
    metric_readings.MEM_USED,
    metric_readings.MEM_TOTAL,
    metric_readings.EVICTIONS,
    metric_readings.ERRORS,
)


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
    """Totals since start from the cluster's metrics source (its Prometheus, else its endpoint), when it has one."""
    if not cluster.has_metrics_source:
        return {}
    try:
        reading = metric_readings.read(ray_metrics.Scrape(at=0), metric_sources.current(cluster, EVIDENCE))
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


def deployment_of(cluster: Cluster, app: str, dep: str) -> Deployment | None:
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
    deployment = deployment_of(cluster, app, dep)
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
        keep_windows(incident)
    return incident.pk


def _killed_beside(app: str, dep: str, kills: list[OomKill]) -> str:
    others = sorted({f"{k.application}/{k.deployment}" for k in kills if (k.application, k.deployment) != (app, dep)})
    if not others:
        return ""
    return (
        f" Counted here: replicas of {', '.join(others)} killed in the same pass while a replica of {app}/{dep} "
        "held the memory (Ray's message lists what each held)."
    )


def keep_windows(incident: Incident) -> None:
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
