"""Fleet inventory sync: read a cluster through the adapter, upsert what changed, nothing more.

An unchanged cluster costs reads plus one UPDATE of its sync timestamps: applications,
deployments and revisions are compared first and written only when they differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.clusters.models import Cluster, ClusterEvent, Reachability
from apps.clusters.services import dashboard_for, mark_unreachable
from apps.core import jobs
from apps.core.jobs import Job
from apps.core.secrets import SecretUnreadable
from apps.fleet.autoscaling import detail_json, is_waiting, sample_decision, waiting_since
from apps.fleet.configs import application_revision, config_hash, key_settings, submitted_deployment
from apps.fleet.models import Application, ConfigRevision, Deployment, ScalingSample
from apps.fleet.signals import cluster_synced
from integrations.ray.errors import RayError
from integrations.ray.payloads import ApplicationStatus, DeploymentStatus, ServeStatus, VersionInfo

log = logging.getLogger(__name__)

# Ray has no effective config for an application while it (re)builds or after a failed deploy;
# a revision taken then would record a config nobody asked for.
TRANSIENT_APP_STATUSES = {"DEPLOYING", "DEPLOY_FAILED", "DELETING", "NOT_STARTED"}


@dataclass
class SyncOutcome:
    cluster_id: int
    ok: bool
    error: str = ""
    writes: int = 0
    revisions: int = 0
    events: list[str] = field(default_factory=list)


def sync_and_announce(cluster_id: int) -> SyncOutcome | None:
    """The worker's sync: after a cluster answered, the apps that read with every sync do."""
    outcome = sync_cluster(cluster_id)
    if outcome is not None and outcome.ok:
        cluster_synced.send(sender=SyncOutcome, cluster_id=cluster_id, outcome=outcome)
    return outcome


def sync_cluster(cluster_id: int) -> SyncOutcome | None:
    cluster = Cluster.objects.filter(pk=cluster_id).select_related("team").first()
    if cluster is None:
        return None
    started = time.monotonic()
    try:
        with dashboard_for(cluster) as ray:
            version = ray.version()
            serve = ray.serve_applications()
            resources = _node_resources(ray, cluster, serve)
    except RayError as exc:
        mark_unreachable(cluster, exc, at=timezone.now())
        return SyncOutcome(cluster_id, ok=False, error=exc.message)
    except SecretUnreadable as exc:
        mark_unreachable(cluster, RayError(str(exc)), at=timezone.now())
        return SyncOutcome(cluster_id, ok=False, error=str(exc))
    return apply_observation(
        cluster_id, version, serve, duration_ms=int((time.monotonic() - started) * 1000), resources=resources
    )


def _node_resources(ray, cluster: Cluster, serve: ServeStatus) -> dict | None:
    """The nodes' resources when a replica waits to be placed or the last reading is old; None
    when not asked, {} when the read failed (the stored reading stays)."""
    waiting = any(
        is_waiting(replica.state)
        for app in serve.applications.values()
        for dep in app.deployments.values()
        for replica in dep.replicas
    )
    max_age = timedelta(seconds=settings.FLEETDECK_NODE_RESOURCES_MAX_AGE_S)
    fresh = cluster.node_resources_at is not None and timezone.now() - cluster.node_resources_at < max_age
    if fresh and not waiting:
        return None
    try:
        usage = ray.resource_usage()
    except RayError as exc:
        # The attempt still counts: a dashboard that cannot answer is asked again when a replica
        # waits or the reading is old, not at every sync.
        log.warning("cluster %s: node resources not read: %s", cluster.pk, exc.message)
        return {}
    return {ip: {name: list(figures) for name, figures in sorted(res.items())} for ip, res in sorted(usage.items())}


def apply_observation(
    cluster_id: int, version: VersionInfo, serve: ServeStatus, *, duration_ms: int, resources: dict | None = None
) -> SyncOutcome:
    outcome = SyncOutcome(cluster_id, ok=True)
    now = timezone.now()
    with transaction.atomic():
        # Serialises concurrent syncs of one cluster (a manual one racing the periodic one).
        cluster = Cluster.objects.select_for_update().get(pk=cluster_id)
        cluster_changes = _cluster_changes(cluster, version, serve, outcome)
        changed = _upsert_applications(cluster, serve, version.session_name, now, outcome)
        if changed or cluster_changes:
            cluster_changes["last_change_seen_at"] = now
        cluster_changes.update(last_sync_at=now, last_sync_duration_ms=duration_ms)
        if resources is not None:
            cluster_changes.update(node_resources_at=now, **({"node_resources": resources} if resources else {}))
        Cluster.objects.filter(pk=cluster_id).update(**cluster_changes)
    return outcome


def _cluster_changes(cluster: Cluster, version: VersionInfo, serve: ServeStatus, outcome: SyncOutcome) -> dict:
    changes: dict = {}
    events: list[tuple[str, str]] = []
    if cluster.reachability != Reachability.OK:
        if cluster.reachability != Reachability.UNKNOWN:
            events.append((ClusterEvent.Kind.RECOVERED, "The dashboard answers again."))
        changes.update(reachability=Reachability.OK, last_error="")
    if cluster.session_name and version.session_name != cluster.session_name:
        events.append(
            (
                ClusterEvent.Kind.SESSION_CHANGED,
                f"Session {cluster.session_name} ended; now {version.session_name}. Every actor restarted.",
            )
        )
    if cluster.ray_version and version.ray_version != cluster.ray_version:
        events.append((ClusterEvent.Kind.VERSION_CHANGED, f"Ray {cluster.ray_version} → {version.ray_version}."))
    if serve.running != cluster.serve_running and cluster.last_sync_at is not None:
        kind = ClusterEvent.Kind.SERVE_STARTED if serve.running else ClusterEvent.Kind.SERVE_STOPPED
        events.append((kind, ""))
    elif (
        serve.running
        and cluster.serve_controller_start_time
        and serve.controller_start_time
        and version.session_name == cluster.session_name
        and serve.controller_start_time > cluster.serve_controller_start_time + 1
    ):
        # A controller that restarts inside one session was usually killed: Ray's memory
        # monitor takes it down with greedy replicas, and the Serve API shows nothing else.
        events.append(
            (
                ClusterEvent.Kind.CONTROLLER_RESTARTED,
                "The Serve controller restarted without a cluster restart (often an OOM kill).",
            )
        )
    for name, value in (
        ("ray_version", version.ray_version),
        ("ray_commit", version.ray_commit),
        ("session_name", version.session_name),
        ("serve_running", serve.running),
        ("serve_controller_start_time", serve.controller_start_time),
        ("serve_http_port", serve.http_port),
    ):
        if getattr(cluster, name) != value:
            changes[name] = value
    ClusterEvent.objects.bulk_create([ClusterEvent(cluster=cluster, kind=k, message=m) for k, m in events])
    outcome.events = [kind for kind, _ in events]
    outcome.writes += len(events)
    return changes


def _upsert_applications(cluster: Cluster, serve: ServeStatus, session: str, now, outcome: SyncOutcome) -> bool:
    existing = {app.name: app for app in Application.objects.filter(cluster=cluster)}
    deployments_by_app: dict[int, dict[str, Deployment]] = {}
    for deployment in Deployment.objects.filter(application__cluster=cluster):
        deployments_by_app.setdefault(deployment.application_id, {})[deployment.name] = deployment
    changed = False
    for name, observed in serve.applications.items():
        app = existing.get(name) or Application(cluster=cluster, name=name)
        changed |= _save_if_changed(app, _application_fields(observed), outcome)
        changed |= _upsert_deployments(app, observed, deployments_by_app.get(app.pk, {}), now, outcome)
        changed |= _record_revision(app, observed, session, outcome)
    for name, app in existing.items():
        if name not in serve.applications and app.removed_at is None:
            Application.objects.filter(pk=app.pk).update(removed_at=now, status="REMOVED")
            Deployment.objects.filter(application=app, removed_at__isnull=True).update(removed_at=now)
            outcome.writes += 1
            changed = True
    return changed


def _application_fields(observed: ApplicationStatus) -> dict:
    return {
        "status": observed.status,
        "message": observed.message,
        "route_prefix": observed.route_prefix,
        "import_path": str((observed.deployed_app_config or {}).get("import_path") or ""),
        "deployed_app_config": observed.deployed_app_config,
        "last_deployed_time_s": observed.last_deployed_time_s,
    }


def _upsert_deployments(app: Application, observed: ApplicationStatus, existing: dict, now, outcome) -> bool:
    changed = False
    samples = []
    for name, dep in observed.deployments.items():
        row = existing.get(name) or Deployment(application=app, name=name)
        before = (row.target_replicas, row.running_replicas, row.waiting_replicas) if row.pk else None
        fields = _deployment_fields(dep, submitted_deployment(observed.deployed_app_config, name))
        if _save_if_changed(row, fields, outcome):
            changed = True
            after = (row.target_replicas, row.running_replicas, row.waiting_replicas)
            if after != before:
                decision = sample_decision(dep.autoscaling_detail, before[0] if before else None, row.target_replicas)
                samples.append(
                    ScalingSample(
                        deployment=row,
                        observed_at=now,
                        target=after[0],
                        running=after[1],
                        waiting=after[2],
                        decision=decision,
                    )
                )
    if samples:
        ScalingSample.objects.bulk_create(samples)
        outcome.writes += 1
    # During a rebuild Ray lists no deployments at all; that is not a removal.
    if observed.deployments:
        gone = [row.pk for name, row in existing.items() if name not in observed.deployments and row.removed_at is None]
        if gone:
            Deployment.objects.filter(pk__in=gone).update(removed_at=now, status="REMOVED")
            outcome.writes += len(gone)
            changed = True
    return changed


def _deployment_fields(dep: DeploymentStatus, submitted: dict) -> dict:
    states = dep.replica_states
    return {
        "status": dep.status,
        "status_trigger": dep.status_trigger,
        "message": dep.message,
        "effective_config": dep.deployment_config,
        "submitted_config": submitted,
        "replica_states": states,
        "running_replicas": states.get("RUNNING", 0),
        "target_replicas": dep.target_num_replicas,
        "required_resources": dep.required_resources,
        "autoscaling_detail": detail_json(dep.autoscaling_detail),
        "waiting_replicas": sum(1 for replica in dep.replicas if is_waiting(replica.state)),
        "waiting_since_s": waiting_since(dep.replicas),
        **key_settings(dep.deployment_config),
    }


def _record_revision(app: Application, observed: ApplicationStatus, session: str, outcome: SyncOutcome) -> bool:
    if observed.status in TRANSIENT_APP_STATUSES or not observed.deployments:
        return False
    config = application_revision(
        observed.deployed_app_config, {name: dep.deployment_config for name, dep in observed.deployments.items()}
    )
    digest = config_hash(config)
    if digest == app.config_hash:
        return False
    ConfigRevision.objects.create(
        application=app, cluster_id=app.cluster_id, config_hash=digest, config=config, ray_session=session
    )
    Application.objects.filter(pk=app.pk).update(config_hash=digest)
    app.config_hash = digest
    outcome.writes += 2
    outcome.revisions += 1
    return True


def _save_if_changed(row, fields: dict, outcome: SyncOutcome) -> bool:
    """Write a new, returning or changed row; leave an identical one alone."""
    if row.pk is not None and row.removed_at is None and all(getattr(row, k) == v for k, v in fields.items()):
        return False
    for key, value in fields.items():
        setattr(row, key, value)
    row.removed_at = None
    row.save()
    outcome.writes += 1
    return True


def due_syncs() -> Iterator[Job]:
    """The tick's syncs; each expires when the next claim would send it again."""
    for cluster_id in claim_due_clusters():
        yield Job(jobs.SYNC_CLUSTER, (cluster_id,), options={"expires": settings.FLEETDECK_SYNC_INTERVAL_S})


def claim_due_clusters(now=None) -> list[int]:
    """Claim clusters whose sync is due with a conditional UPDATE, so two ticks never both enqueue."""
    now = now or timezone.now()
    due = Q(next_sync_at__isnull=True) | Q(next_sync_at__lte=now)
    claimed = []
    next_at = now + timedelta(seconds=settings.FLEETDECK_SYNC_INTERVAL_S)
    for cluster_id in Cluster.objects.filter(due).order_by("next_sync_at", "pk").values_list("pk", flat=True):
        if Cluster.objects.filter(due, pk=cluster_id).update(next_sync_at=next_at) == 1:
            claimed.append(cluster_id)
    return claimed
