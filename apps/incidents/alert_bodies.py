"""What a webhook sends for an incident event, by the receiver's kind: Fleetdeck's own JSON,
Alertmanager's alerts API, or a Slack incoming webhook's message. Pure: the delivery decides when.

Alertmanager keeps an alert while it is re-sent and resolves it when `endsAt` passes: an open
incident's alert carries no `endsAt` and is sent again every FLEETDECK_ALERTMANAGER_RESEND_S (as
Prometheus does with its own alerts), a resolved one carries its resolution time. Its labels are the
ones teams route and silence on; none of them is unbounded beside the cluster, application and
deployment names, which identify the alert."""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse

from apps.incidents.models import Incident, Webhook, WebhookDelivery

ALERTS_PATH = "/api/v2/alerts"


@dataclass(frozen=True)
class Outgoing:
    url: str
    body: dict | list


def outgoing(kind: str, url: str, incident: Incident, event: str, base_url: str) -> Outgoing:
    link = f"{base_url}{reverse('incidents:detail', args=[incident.pk])}" if base_url else ""
    if kind == Webhook.Kind.ALERTMANAGER:
        target = url if url.rstrip("/").endswith(ALERTS_PATH) else url.rstrip("/") + ALERTS_PATH
        return Outgoing(target, [alert(incident, event, link)])
    if kind == Webhook.Kind.SLACK:
        return Outgoing(url, slack(incident, event, link))
    return Outgoing(url, fleetdeck(incident, event, link))


def fleetdeck(incident: Incident, event: str, link: str) -> dict:
    described: dict[str, object] = {
        "id": incident.pk,
        "kind": incident.kind,
        "severity": incident.severity,
        "title": incident.title,
        "cluster": incident.cluster.name,
        "application": incident.application_name,
        "deployment": incident.deployment_name,
        "started_at": incident.started_at.isoformat(),
        "resolved_at": incident.resolved_at.isoformat() if incident.resolved_at else None,
        "suspected_causes": [{"id": c["id"], "title": c["title"], "reason": c["reason"]} for c in incident.causes],
    }
    if link:
        described["url"] = link
    return {"event": f"incident.{event}", "incident": described}


def alert(incident: Incident, event: str, link: str) -> dict:
    cause = incident.causes[0] if incident.causes else None
    labels = {
        "alertname": "FleetdeckIncident",
        "team": incident.cluster.team.slug,
        "cluster": incident.cluster.name,
        "application": incident.application_name,
        "deployment": incident.deployment_name,
        "kind": incident.kind,
        "severity": incident.severity,
        "cause": cause["id"] if cause else "",
        "incident": str(incident.pk),
    }
    annotations = {
        "summary": incident.title,
        "description": f"{cause['title']}: {cause['reason']}" if cause else "No suspected cause yet.",
    }
    if link:
        annotations["incident_url"] = link
    body = {
        # Alertmanager drops empty labels; sending none keeps the alert's identity stable.
        "labels": {key: value for key, value in labels.items() if value},
        "annotations": annotations,
        "startsAt": incident.started_at.isoformat(),
    }
    if event == WebhookDelivery.Event.RESOLVED and incident.resolved_at:
        body["endsAt"] = incident.resolved_at.isoformat()
    if link:
        body["generatorURL"] = link
    return body


def slack(incident: Incident, event: str, link: str) -> dict:
    where = "/".join(part for part in (incident.application_name, incident.deployment_name) if part)
    place = f"{incident.cluster.name} {where}".strip()
    title = f"<{link}|{incident.title}>" if link else incident.title
    if event == WebhookDelivery.Event.RESOLVED:
        return {"text": f":white_check_mark: Resolved on {place}: {title}"}
    lines = [f":rotating_light: {incident.get_severity_display()} {incident.get_kind_display()} on {place}: {title}"]
    for cause in incident.causes[:3]:
        lines.append(f"• {cause['id']} {cause['title']}: {cause['reason']}")
    return {"text": "\n".join(lines)}
