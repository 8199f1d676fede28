"""What people do to an incident: notes, acknowledgements and resolutions."""

from __future__ import annotations

from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.incidents import services, webhooks
from apps.incidents.models import (
    Incident,
    IncidentEvent,
    WebhookDelivery,
)

HANDLE = Permission(Role.OPERATOR, "handle incidents")


def add_note(actor: Actor, incident: Incident, text: str) -> IncidentEvent:
    event = IncidentEvent.objects.create(
        incident=incident, kind=IncidentEvent.Kind.NOTE, message=text.strip()[:4000], author=actor.user
    )
    record(actor, "incident.note", incident, team=incident.cluster.team)
    return event


def set_status(actor: Actor, incident: Incident, status: str) -> Incident:
    transitions: dict[str, tuple[list[Incident.Status], IncidentEvent.Kind]] = {
        Incident.Status.ACKNOWLEDGED: ([Incident.Status.OPEN], IncidentEvent.Kind.ACKNOWLEDGED),
        Incident.Status.RESOLVED: (services.OPEN, IncidentEvent.Kind.RESOLVED),
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
