"""The read model of what happened around an incident, for its timeline on the incident page and
in the API: what an operator asks first is "what changed?". Fleetdeck's changes, the work other
apps registered with `apps.fleet.activity` (maintenance runs), and what changed without
Fleetdeck: cluster restarts, Serve controller restarts (how Ray's memory monitor killing the
controller shows up) and config revisions Fleetdeck did not make."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.changes.models import Change
from apps.clusters.models import ClusterEvent
from apps.fleet import activity
from apps.fleet.activity import Activity
from apps.incidents import cluster_history
from apps.incidents.models import Incident

# How far before an incident began its timeline starts.
BEFORE = timedelta(minutes=15)
KINDS = {
    ClusterEvent.Kind.SESSION_CHANGED: "cluster_restart",
    ClusterEvent.Kind.CONTROLLER_RESTARTED: "controller_restart",
}
# What the timeline and `cluster_history.makers` read of a change.
CHANGE_FIELDS = ("cluster", "targets", "reason", "state", "created_at", "started_at", "pushed_at", "finished_at")


def related_work(incident: Incident) -> list[dict]:
    return related_work_for([incident])[incident.pk]


def related_work_for(incidents: list[Incident]) -> dict[int, list[dict]]:
    """What happened around each of a page of incidents, in a fixed number of queries. Changes
    and revisions are read from further back than shown: who made a revision depends on the
    changes before it."""
    if not incidents:
        return {}
    clusters = {incident.cluster_id for incident in incidents}
    since = min(incident.started_at for incident in incidents) - BEFORE
    # Without their configs: a page of incidents spans many clusters and a month of changes.
    changes = list(
        Change.objects.filter(cluster_id__in=clusters, created_at__gte=since - BEFORE)
        .only(*CHANGE_FIELDS)
        .order_by("created_at", "id")
    )
    work = activity.since(clusters, since)
    events = list(
        ClusterEvent.objects.filter(cluster_id__in=clusters, kind__in=list(KINDS), created_at__gte=since).order_by(
            "created_at", "id"
        )
    )
    revisions = cluster_history.revisions_since(clusters, since - BEFORE)
    now = timezone.now()
    # Each incident reads only its own cluster's rows: a page spans up to one cluster per incident.
    by_cluster = [_by_cluster(rows) for rows in (changes, work, events, revisions)]
    return {
        incident.pk: _related(incident, *(rows.get(incident.cluster_id, []) for rows in by_cluster), now)
        for incident in incidents
    }


def _by_cluster(rows: list) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for row in rows:
        grouped.setdefault(row.cluster_id, []).append(row)
    return grouped


def _related(
    incident: Incident, changes: list[Change], work: list[Activity], events: list[ClusterEvent], revisions: list, now
) -> list[dict]:
    """The timeline of one incident from its own cluster's rows."""
    since = incident.started_at - BEFORE
    # Who made a revision is judged from the incident's own look back, so a page of incidents
    # says the same as each incident alone.
    pushed = [c for c in changes if c.created_at >= since - BEFORE and cluster_history.reached_cluster(c)]
    made = cluster_history.makers([r for r in revisions if r.observed_at >= since - BEFORE], pushed, now)
    foreign = [revision for revision in revisions if revision.pk in made and not made[revision.pk]]
    items = []
    for change in changes:
        if change.created_at < since:
            continue
        if not incident.application_name or incident.application_name in change.touched_applications:
            items.append(
                {
                    "at": change.started_at or change.created_at,
                    "kind": "change",
                    "id": change.pk,
                    "text": f"Change #{change.pk} ({change.get_state_display().lower()}): {change.reason}",
                }
            )
    for item in work:
        if item.created_at < since:
            continue
        if incident.deployment_id and item.deployment_id != incident.deployment_id:
            continue
        items.append({"at": item.at, "kind": item.kind, "id": item.id, "text": item.text})
    for event in events:
        if event.created_at < since:
            continue
        text = event.get_kind_display() + (f": {event.message}" if event.message else "")
        items.append({"at": event.created_at, "kind": KINDS[event.kind], "id": event.pk, "text": text})
    for revision in foreign:
        if revision.observed_at < since:
            continue
        name = revision.application_name
        if not incident.application_name or incident.application_name == name:
            items.append(
                {
                    "at": revision.observed_at,
                    "kind": "config_revision",
                    "id": revision.pk,
                    "text": f"The config of {name} changed outside Fleetdeck (revision {revision.config_hash[:12]})",
                }
            )
    return sorted(items, key=lambda item: item["at"])
