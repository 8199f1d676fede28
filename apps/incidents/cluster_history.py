"""A cluster's history around an incident, from what sync recorded: restarts of the cluster (a
new Ray session) and of the Serve controller, and which config revisions Fleetdeck made."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, Subquery
from django.utils import timezone

from apps.changes.models import Change, ChangeState
from apps.changes.serve_options import replaces_replicas
from apps.clusters.models import Cluster, ClusterEvent
from apps.fleet.models import Application, ConfigRevision
from apps.incidents.causes import ClusterHistory, RecentChange

RESTARTS = [ClusterEvent.Kind.SESSION_CHANGED, ClusterEvent.Kind.CONTROLLER_RESTARTED]
# Changes whose config may be on the cluster: pushed, or in or past the push where an older row
# has no push time. Planned, queued, drifted and cancelled ones never left Fleetdeck.
PUSHED_STATES = [
    ChangeState.PUSHING,
    ChangeState.VERIFYING,
    ChangeState.ROLLING_BACK,
    ChangeState.SUCCEEDED,
    ChangeState.ROLLED_BACK,
    ChangeState.ROLLBACK_FAILED,
]
REACHED_CLUSTER = Q(pushed_at__isnull=False) | Q(state__in=PUSHED_STATES)
# A change that rolled back deployed two configs, its own and then its base again.
ROLLED_BACK = [ChangeState.ROLLING_BACK, ChangeState.ROLLED_BACK, ChangeState.ROLLBACK_FAILED]


def reached_cluster(change: Change) -> bool:
    return change.pushed_at is not None or change.state in PUSHED_STATES


def pushed_at(change: Change) -> datetime:
    return change.pushed_at or change.started_at or change.created_at


def rolling_update_ended(change: Change) -> datetime | None:
    """When the change's replicas of two versions stopped running side by side: at its verification,
    or when its rollback (a second rolling update) finished; None while either may still run."""
    if change.state == ChangeState.SUCCEEDED:
        return change.verified_at or change.finished_at
    if change.state == ChangeState.ROLLED_BACK:
        return change.finished_at
    # Still pushing, verifying or rolling back, or ended where replicas of both may still run.
    return None


def revisions_since(cluster_ids, since: datetime, application: str | None = None) -> list[ConfigRevision]:
    """Revisions that replaced a config, in observation order, without their configs (when and
    in which session is what counts here), each with its `application_name`. An application's
    first revision replaced nothing: it is what Fleetdeck first saw running."""
    earlier = ConfigRevision.objects.filter(application=OuterRef("application"), pk__lt=OuterRef("pk"))
    rows = ConfigRevision.objects.filter(cluster_id__in=cluster_ids, observed_at__gte=since).filter(Exists(earlier))
    if application is not None:
        rows = rows.filter(application__name=application)
    # The name is looked up for the rows kept only: joining the applications made PostgreSQL hash
    # all of them (10,000 at 1,000 clusters) for an incident page whose revisions were a handful.
    name = Application.objects.filter(pk=OuterRef("application_id")).order_by().values("name")
    return list(
        rows.annotate(application_name=Subquery(name))
        .only("cluster", "application", "config_hash", "ray_session", "observed_at")
        .order_by("observed_at", "pk")
    )


def makers(
    revisions: list[ConfigRevision], changes: list[Change], now: datetime | None = None
) -> dict[int, list[Change]]:
    """The changes that made each revision. A sync records a revision the first time it sees an
    application run a new config, so a change made the first revision of each application it
    touched observed after its push; one that rolled back also made those up to the first
    observed after it finished. Timing, not the config, tells: Ray's echo of a config drops the
    fields it does not know, so a pushed config and its revision can differ."""
    now = now or timezone.now()
    by_application: dict[tuple[int, str], list[ConfigRevision]] = {}
    for revision in sorted(revisions, key=lambda r: (r.observed_at, r.pk)):
        by_application.setdefault((revision.cluster_id, revision.application_name), []).append(revision)
    made: dict[int, list[Change]] = {revision.pk: [] for revision in revisions}
    for change in changes:
        for application in change.touched_applications:
            after = [
                r
                for r in by_application.get((change.cluster_id, application), [])
                if r.observed_at >= pushed_at(change)
            ]
            if change.state in ROLLED_BACK:
                ended = change.finished_at or now
                last = next((i for i, r in enumerate(after) if r.observed_at >= ended), len(after) - 1)
                chosen = after[: last + 1]
            else:
                chosen = after[:1]
            for revision in chosen:
                made[revision.pk].append(change)
    return made


def session_start(cluster: Cluster, at: datetime) -> datetime | None:
    """When the session running at `at` began, as far as Fleetdeck saw: the restart that started
    it; None when the cluster has not restarted since it was registered."""
    event = (
        ClusterEvent.objects.filter(cluster=cluster, kind=ClusterEvent.Kind.SESSION_CHANGED, created_at__lte=at)
        .order_by("-created_at", "-pk")
        .first()
    )
    return event.created_at if event else None


def before_kill(
    cluster: Cluster, application: str, now: datetime, window: timedelta
) -> tuple[list[RecentChange], ClusterHistory]:
    """The changes touching `application` that ran within `window` before `now`, each with the
    session its config was first seen running in, and what happened on the cluster since."""
    lookback = now - 2 * window
    changes = [
        change
        for change in Change.objects.filter(cluster=cluster)
        .filter(REACHED_CLUSTER)
        .filter(Q(created_at__gte=lookback) | Q(finished_at__gte=lookback))
        if application in change.touched_applications
    ]
    revisions = revisions_since([cluster.pk], lookback, application)
    made = makers(revisions, changes, now)
    first_seen: dict[int, str] = {}
    for revision in revisions:
        for change in made[revision.pk]:
            first_seen.setdefault(change.pk, revision.ray_session)
    recent = [
        RecentChange(
            label=f"change #{change.pk} ({change.reason[:80]})",
            at=pushed_at(change),
            session=first_seen.get(change.pk, ""),
            ended_at=rolling_update_ended(change),
            replaced_replicas=replaces_replicas(change.base_config, change.new_config, application),
        )
        for change in changes
        if pushed_at(change) >= now - window or (change.finished_at and change.finished_at >= now - window)
    ]
    restarts = ClusterEvent.objects.filter(
        cluster=cluster, kind=ClusterEvent.Kind.SESSION_CHANGED, created_at__gte=lookback
    )
    history = ClusterHistory(
        killed_at=now,
        session=cluster.session_name,
        restarts=tuple(restarts.values_list("created_at", flat=True)),
        foreign_revisions=tuple(r.observed_at for r in revisions if not made[r.pk]),
    )
    return recent, history
