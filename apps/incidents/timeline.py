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
    changes = list(
        Change.objects.filter(cluster_id__in=clusters, created_at__gte=since - BEFORE).order_by("created_at", "id")
    )
    work = activity.since(clusters, since)
    events = list(
        ClusterEvent.objects.filter(cluster_id__in=clusters, kind__in=list(KINDS), created_at__gte=since).order_by(
            "created_at", "id"
        )
    )
    revisions = cluster_history.revisions_since(clusters, since - BEFORE)
    now = timezone.now()
    return {incident.pk: _related(incident, changes, work, events, revisions, now) for incident in incidents}


def _related(
    incident: Incident, changes: list[Change], work: list[Activity], events: list[ClusterEvent], revisions: list, now
) -> list[dict]:
    since = incident.started_at - BEFORE
    mine = incident.cluster_id
    # Who made a revision is judged from the incident's own look back, so a page of incidents
    # says the same as each incident alone.
    pushed = [
        c
        for c in changes
        if c.cluster_id == mine and c.created_at >= since - BEFORE and cluster_history.reached_cluster(c)
    ]
    made = cluster_history.makers(
        [r for r in revisions if r.cluster_id == mine and r.observed_at >= since - BEFORE], pushed, now
    )
    foreign = [revision for revision in revisions if revision.pk in made and not made[revision.pk]]
    items = []
    for change in changes:
        if change.cluster_id != mine or change.created_at < since:
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
        if item.cluster_id != mine or item.created_at < since:
            continue
        if incident.deployment_id and item.deployment_id != incident.deployment_id:
            continue
        items.append({"at": item.at, "kind": item.kind, "id": item.id, "text": item.text})
    for event in events:
        if event.cluster_id == mine:
            text = event.get_kind_display() + (f": {event.message}" if event.message else "")
            items.append({"at": event.created_at, "kind": KINDS[event.kind], "id": event.pk, "text": text})
    for revision in foreign:
        if revision.cluster_id != mine or revision.observed_at < since:
            continue
        name = revision.application.name
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
