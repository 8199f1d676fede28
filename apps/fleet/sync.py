"""Fleet inventory sync: read clusters through the adapter, upsert what changed, nothing more.

A worker reads a batch of dashboards at once (asyncio, in a thread of its own) and applies each
answer in its own short transaction as it arrives, so a hung dashboard holds one coroutine for its
timeout and delays no other cluster.

An unchanged cluster costs one conditional UPDATE of its sync stamps: when the digest of what its
dashboard answered (Serve status, dead actors) equals the one stored at the last applied sync,
nothing is parsed, compared or written, the version is not even asked, and the steps that act on a
sync skip what depends only on those answers (see workers/tasks.py). That is safe because every
row the sync derives (cluster, applications, deployments, revisions, cluster events) is a function
of those answers and of the cluster's previous rows, which only the sync writes; the exceptions
are handled where they arise: a cluster that was not reachable is applied in full (its recovery is
an event); a digest is stored only while Serve runs (its controller's actor and worker ids in the
Serve status change with every restart, so the same answers mean the same session) and no replica
waits to be placed (a finding depends on how long it has waited); inputs of the steps that no
answer shows (schedules, warmups, LLM inputs, the registration) clear it when they change; and it
is stored only after the steps that act on a sync have run, so a failure there repeats them.
Otherwise, deployments, applications and revisions are compared first and written only when they
differ, and new ones are inserted one statement per table.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, IntegerField, Q, Value, When
from django.utils import timezone

from apps.clusters.models import Cluster, ClusterEvent, Reachability
from apps.clusters.services import async_dashboard_for, dashboard_for, mark_unreachable
from apps.core import jobs
from apps.core.jobs import Job
from apps.core.secrets import SecretUnreadable
from apps.fleet.autoscaling import detail_json, is_waiting, sample_decision, waiting_since
from apps.fleet.configs import application_revision, config_hash, key_settings, submitted_deployment
from apps.fleet.models import Application, ConfigRevision, Deployment, ScalingSample
from apps.fleet.signals import batch_synced, cluster_synced
from integrations.ray.errors import RayError
from integrations.ray.observation import Observation
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
    # The dashboard answered exactly what the last applied sync read: nothing was parsed or written.
    unchanged: bool = False
    # A replica waits to be placed: what the steps after the sync conclude depends on the clock
    # (how long it has waited), so the next sync applies in full again.
    waiting: bool = False
    # Serve runs: its controller's identity in the Serve status changes with every restart, so the
    # same Serve status and dead actors mean the same session, and the version need not be read.
    serve_running: bool = False
    # The row as read before the sync: registration fields (metrics endpoints) for the steps after it.
    cluster: Cluster | None = None
    observation: Observation | None = None

    @property
    def settled(self) -> bool:
        """The same answers next time may skip everything: see `serve_running` and `waiting`."""
        return self.serve_running and not self.waiting


def sync_and_announce(cluster_ids: list[int]) -> list[SyncOutcome]:
    """The worker's sync of a batch: after each cluster answered, the apps that read with every sync do."""
    outcomes = sync_clusters(cluster_ids, then=_announce)
    batch_synced.send(sender=SyncOutcome, outcomes=outcomes)
    return outcomes


def _announce(outcome: SyncOutcome) -> None:
    cluster_synced.send(sender=SyncOutcome, cluster_id=outcome.cluster_id, outcome=outcome)


def sync_cluster(cluster_id: int) -> SyncOutcome | None:
    """Sync one cluster now, without the steps that act on a sync (the local runner, tests)."""
    outcomes = sync_clusters([cluster_id])
    return outcomes[0] if outcomes else None


def sync_clusters(
    cluster_ids: Iterable[int], *, then: Callable[[SyncOutcome], None] | None = None
) -> list[SyncOutcome]:
    """Sync clusters whose dashboards are read at once; each is applied as its answer arrives,
    and unchanged ones are stamped together whenever no other answer is waiting.

    `then` runs after each successful sync (detection, findings). Only once it has returned is the
    answers' digest stored: a stored digest stands for answers whose consequences were all drawn."""
    outcomes: list[SyncOutcome] = []
    unchanged: list[tuple[Cluster, Observation, int, bool]] = []

    def settle(cluster: Cluster, observed, outcome: SyncOutcome | None) -> None:
        if outcome is None:
            return
        if then is not None and outcome.ok:
            then(outcome)
            if not outcome.unchanged:
                # Conditional, so a registration or schedule edit made meanwhile still counts.
                Cluster.objects.filter(pk=cluster.pk, observed_digest=cluster.observed_digest).update(
                    observed_digest=observed.digest if outcome.settled else ""
                )
        outcomes.append(outcome)

    def guarded(cluster: Cluster, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:
            # One cluster's failure stays its own, as when every cluster had a task of its own.
            log.exception("sync of cluster %s failed", cluster.pk)

    def flush() -> None:
        try:
            stamped = _stamp_unchanged(unchanged)
        except Exception:
            # As a failed sync of each: logged, and the next cycle reads them again.
            log.exception("stamping %d unchanged clusters failed", len(unchanged))
            unchanged.clear()
            return
        for cluster, observed, duration_ms, _ in unchanged:
            if cluster.pk in stamped:
                outcome = SyncOutcome(cluster.pk, ok=True, unchanged=True, cluster=cluster, observation=observed)
                guarded(cluster, lambda: settle(cluster, observed, outcome))  # noqa: B023 (called before the loop moves on)
            else:  # its row changed while it was read: applied in full
                guarded(cluster, lambda: settle(cluster, observed, _sync_one(cluster, observed, duration_ms)))  # noqa: B023 (called before the loop moves on)
        unchanged.clear()

    for cluster, observed, duration_ms, more in _observations(Cluster.objects.filter(pk__in=list(cluster_ids))):
        refreshed = _unchanged(cluster, observed)
        if refreshed is not None:
            unchanged.append((cluster, observed, duration_ms, refreshed))
        else:
            guarded(cluster, lambda: settle(cluster, observed, _sync_one(cluster, observed, duration_ms)))  # noqa: B023 (called before the loop moves on)
        if unchanged and (not more or len(unchanged) >= STAMP_BATCH):
            flush()
    return outcomes


# Unchanged clusters stamped in one UPDATE: enough to make the statement's cost per cluster small,
# few enough that no cluster's steps wait long behind others.
STAMP_BATCH = 100


def _unchanged(cluster: Cluster, observed) -> bool | None:
    """None when the answers must be applied; else whether a reading of the nodes taken with them
    says what the stored one says (its time then moves). A reading that differs is applied in full,
    since findings read it."""
    if isinstance(observed, Exception) or cluster.reachability != Reachability.OK:
        return None
    if not cluster.observed_digest or cluster.observed_digest != observed.digest:
        return None
    resources = _node_resources(cluster, observed)
    if resources is None:
        return False
    if resources == {} or resources == cluster.node_resources:
        return True
    return None


def _stamp_unchanged(unchanged: list) -> set[int]:
    """One UPDATE of the sync stamps of clusters whose answers were unchanged, each still on the
    condition that its row is as it was read (same digest, reachable): the ids it stamped."""
    if not unchanged:
        return set()
    now = timezone.now()
    condition = Q()
    for cluster, observed, _, _ in unchanged:
        condition |= Q(pk=cluster.pk, observed_digest=observed.digest)
    refreshed = [cluster.pk for cluster, _, _, fresh in unchanged if fresh]
    rows = Cluster.objects.filter(condition, reachability=Reachability.OK)
    stamped = rows.update(
        last_sync_at=now,
        last_sync_duration_ms=Case(
            *(When(pk=cluster.pk, then=Value(ms)) for cluster, _, ms, _ in unchanged),
            output_field=IntegerField(),
        ),
        node_resources_at=Case(When(pk__in=refreshed, then=Value(now)), default=F("node_resources_at")),
    )
    if stamped == len(unchanged):
        return {cluster.pk for cluster, *_ in unchanged}
    # Rare: a row changed while its dashboard was read. Which ones were stamped is read back.
    ids = [cluster.pk for cluster, *_ in unchanged]
    return set(Cluster.objects.filter(pk__in=ids, last_sync_at=now).values_list("pk", flat=True))


def apply_in_full_next(clusters) -> None:
    """The next sync of these clusters applies in full and runs every step after it: something
    those steps read, and no dashboard answer reflects, changed."""
    clusters.update(observed_digest="")


def _sync_one(cluster: Cluster, observed: Observation | Exception, duration_ms: int) -> SyncOutcome | None:
    if isinstance(observed, SecretUnreadable):
        observed = RayError(str(observed))
    if isinstance(observed, Exception) and not isinstance(observed, RayError):
        raise observed  # a fault of the reader, not of the dashboard
    if isinstance(observed, Exception):
        mark_unreachable(cluster, observed, at=timezone.now())
        return SyncOutcome(cluster.pk, ok=False, error=observed.message)
    resources = _node_resources(cluster, observed)
    try:
        version, serve = _version(cluster, observed), observed.serve()
    except RayError as exc:
        mark_unreachable(cluster, exc, at=timezone.now())
        return SyncOutcome(cluster.pk, ok=False, error=exc.message)
    try:
        outcome = apply_observation(cluster.pk, version, serve, duration_ms=duration_ms, resources=resources)
    except Cluster.DoesNotExist:
        return None  # deleted while its dashboard was read
    outcome.cluster, outcome.observation = cluster, observed
    return outcome


def _version(cluster: Cluster, observed: Observation) -> VersionInfo:
    if observed.version_body is not None:
        return observed.version()
    # The answers matched the last applied sync when read, but the row changed since (an edit
    # cleared its digest): applying in full needs the version too.
    with dashboard_for(cluster) as ray:
        return ray.version()


def _expected_digest(cluster: Cluster) -> str:
    """The digest an unchanged answer would have; empty when the sync applies in full anyway."""
    return cluster.observed_digest if cluster.reachability == Reachability.OK else ""


def _wants_node_resources(cluster: Cluster) -> bool:
    """Read the nodes' resources when the last reading is old, or when a replica waited to be
    placed at the last sync: its finding names the resource it lacks."""
    max_age = timedelta(seconds=settings.FLEETDECK_NODE_RESOURCES_MAX_AGE_S)
    fresh = cluster.node_resources_at is not None and timezone.now() - cluster.node_resources_at < max_age
    return not fresh or cluster.replica_waiting


def _node_resources(cluster: Cluster, observed: Observation) -> dict | None:
    """The nodes' resources read with this sync; None when not asked, {} when the read failed
    (the stored reading stays, and the attempt counts, so such a dashboard is not asked at every sync)."""
    try:
        usage = observed.resources()
    except RayError as exc:
        log.warning("cluster %s: node resources not read: %s", cluster.pk, exc.message)
        return {}
    if usage is None:
        return None
    return {ip: {name: list(figures) for name, figures in sorted(res.items())} for ip, res in sorted(usage.items())}


def _observations(clusters: Iterable[Cluster]) -> Iterator[tuple[Cluster, Observation | Exception, int, bool]]:
    """(cluster, what its dashboard answered or the error, milliseconds it took, whether another
    answer is already waiting), in the order the answers arrive. The reads run on an event loop in
    a thread of their own; the ORM stays in this one."""
    readers = []
    # Dashboards that failed last time first: a hung one's timeout then overlaps the others' reads.
    for cluster in sorted(clusters, key=lambda c: c.reachability == Reachability.OK):
        try:
            readers.append((cluster, async_dashboard_for(cluster)))
        except SecretUnreadable as exc:
            yield cluster, exc, 0, True
    answers: queue.SimpleQueue = queue.SimpleQueue()

    async def read(cluster, ray, limit: asyncio.Semaphore) -> None:
        async with limit:
            started, result = time.monotonic(), None
            try:
                async with ray:
                    result = await ray.observe(
                        resources=_wants_node_resources(cluster), expected_digest=_expected_digest(cluster)
                    )
            except Exception as exc:  # handed to the consuming thread, which records it for this cluster
                result = exc
            finally:
                answers.put((cluster, result, int((time.monotonic() - started) * 1000)))

    async def read_all() -> None:
        limit = asyncio.Semaphore(settings.FLEETDECK_SYNC_CONCURRENCY)
        await asyncio.gather(*(read(cluster, ray, limit) for cluster, ray in readers))

    thread = threading.Thread(target=asyncio.run, args=(read_all(),), name="sync-reads", daemon=True)
    thread.start()
    try:
        for left in range(len(readers) - 1, -1, -1):
            cluster, result, duration_ms = answers.get()
            yield cluster, result, duration_ms, left > 0 and not answers.empty()
    finally:
        thread.join()


def apply_observation(
    cluster_id: int, version: VersionInfo, serve: ServeStatus, *, duration_ms: int, resources: dict | None = None
) -> SyncOutcome:
    outcome = SyncOutcome(cluster_id, ok=True, serve_running=serve.running)
    outcome.waiting = any(
        is_waiting(replica.state)
        for app in serve.applications.values()
        for dep in app.deployments.values()
        for replica in dep.replicas
    )
    now = timezone.now()
    with transaction.atomic():
        # Serialises concurrent syncs of one cluster (a manual one racing the periodic one).
        cluster = Cluster.objects.select_for_update().get(pk=cluster_id)
        cluster_changes = _cluster_changes(cluster, version, serve, outcome)
        changed = _upsert_applications(cluster, serve, version.session_name, now, outcome)
        # What is live now is what was observed: every other row was just marked removed.
        counts = {
            "application_count": len(serve.applications),
            "deployment_count": sum(len(app.deployments) for app in serve.applications.values()),
        }
        cluster_changes.update({name: n for name, n in counts.items() if getattr(cluster, name) != n})
        if changed or cluster_changes:
            cluster_changes["last_change_seen_at"] = now
        cluster_changes.update(last_sync_at=now, last_sync_duration_ms=duration_ms, replica_waiting=outcome.waiting)
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
    """Update changed rows one by one; insert new ones in one statement per table, since a new
    cluster brings tens of applications and deployments at once."""
    existing = {app.name: app for app in Application.objects.filter(cluster=cluster)}
    deployments_by_app: dict[int, dict[str, Deployment]] = {}
    for deployment in Deployment.objects.filter(application__cluster=cluster):
        deployments_by_app.setdefault(deployment.application_id, {})[deployment.name] = deployment
    changed = False
    new_apps = []
    for name, observed in serve.applications.items():
        app = existing.get(name)
        if app is None:
            new_apps.append(Application(cluster=cluster, name=name, **_application_fields(observed)))
        else:
            changed |= _save_if_changed(app, _application_fields(observed), outcome)
    Application.objects.bulk_create(new_apps)
    outcome.writes += len(new_apps)
    changed |= bool(new_apps)
    rows = NewRows()
    for app in [*existing.values(), *new_apps]:
        observed = serve.applications.get(app.name)
        if observed is None:
            continue
        changed |= _upsert_deployments(app, observed, deployments_by_app.get(app.pk, {}), now, outcome, rows)
        changed |= _record_revision(app, observed, session, outcome, rows)
    rows.save(outcome)
    for name, app in existing.items():
        if name not in serve.applications and app.removed_at is None:
            Application.objects.filter(pk=app.pk).update(removed_at=now, status="REMOVED")
            Deployment.objects.filter(application=app, removed_at__isnull=True).update(removed_at=now)
            outcome.writes += 1
            changed = True
    return changed


@dataclass
class NewRows:
    """Rows a sync inserts, written one statement per table once every application is seen."""

    deployments: list[Deployment] = field(default_factory=list)
    samples: list[ScalingSample] = field(default_factory=list)
    revisions: list[ConfigRevision] = field(default_factory=list)

    def save(self, outcome: SyncOutcome) -> None:
        # Deployments first: their samples need their ids.
        for model, objs in (
            (Deployment, self.deployments),
            (ScalingSample, self.samples),
            (ConfigRevision, self.revisions),
        ):
            if objs:
                model.objects.bulk_create(objs)
                outcome.writes += 1


def _application_fields(observed: ApplicationStatus) -> dict:
    return {
        "status": observed.status,
        "message": observed.message,
        "route_prefix": observed.route_prefix,
        "import_path": str((observed.deployed_app_config or {}).get("import_path") or ""),
        "deployed_app_config": observed.deployed_app_config,
        "last_deployed_time_s": observed.last_deployed_time_s,
    }


def _upsert_deployments(
    app: Application, observed: ApplicationStatus, existing: dict, now, outcome, rows: NewRows
) -> bool:
    changed = False
    for name, dep in observed.deployments.items():
        fields = _deployment_fields(dep, submitted_deployment(observed.deployed_app_config, name))
        row = existing.get(name)
        if row is None:
            row = Deployment(application=app, name=name, **fields)
            rows.deployments.append(row)
            before = None
        else:
            before = (row.target_replicas, row.running_replicas, row.waiting_replicas)
            if not _save_if_changed(row, fields, outcome):
                continue
        changed = True
        after = (row.target_replicas, row.running_replicas, row.waiting_replicas)
        if after != before:
            decision = sample_decision(dep.autoscaling_detail, before[0] if before else None, row.target_replicas)
            rows.samples.append(
                ScalingSample(
                    deployment=row,
                    observed_at=now,
                    target=after[0],
                    running=after[1],
                    waiting=after[2],
                    decision=decision,
                )
            )
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


def _record_revision(
    app: Application, observed: ApplicationStatus, session: str, outcome: SyncOutcome, rows: NewRows
) -> bool:
    if observed.status in TRANSIENT_APP_STATUSES or not observed.deployments:
        return False
    config = application_revision(
        observed.deployed_app_config, {name: dep.deployment_config for name, dep in observed.deployments.items()}
    )
    digest = config_hash(config)
    if digest == app.config_hash:
        return False
    rows.revisions.append(
        ConfigRevision(
            application=app, cluster_id=app.cluster_id, config_hash=digest, config=config, ray_session=session
        )
    )
    Application.objects.filter(pk=app.pk).update(config_hash=digest)
    app.config_hash = digest
    outcome.writes += 1
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


def due_syncs(now=None) -> Iterator[Job]:
    """The tick's syncs, in batches of FLEETDECK_SYNC_BATCH clusters, one worker task each; each
    expires when the next claim would send it again."""
    claimed, size = claim_due_clusters(now), settings.FLEETDECK_SYNC_BATCH
    for start in range(0, len(claimed), size):
        batch = claimed[start : start + size]
        yield Job(jobs.SYNC_BATCH, (batch,), options={"expires": settings.FLEETDECK_SYNC_INTERVAL_S})


def claim_due_clusters(now=None) -> list[int]:
    """Claim clusters whose sync is due, so two ticks never both enqueue one: the due rows are
    locked (rows another tick holds are skipped), then moved a full interval on, in one transaction."""
    now = now or timezone.now()
    due = Q(next_sync_at__isnull=True) | Q(next_sync_at__lte=now)
    next_at = now + timedelta(seconds=settings.FLEETDECK_SYNC_INTERVAL_S)
    with transaction.atomic():
        claimed = list(
            Cluster.objects.select_for_update(skip_locked=True)
            .filter(due)
            .order_by("next_sync_at", "pk")
            .values_list("pk", flat=True)
        )
        Cluster.objects.filter(pk__in=claimed).update(next_sync_at=next_at)
    return claimed
