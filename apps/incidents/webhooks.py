"""Webhook registration, and delivery of incidents as they open and resolve to teams' endpoints
(Fleetdeck's JSON, an Alertmanager, Slack: the bodies are `alert_bodies`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.clusters.validation import checked_url
from apps.core import jobs, secrets
from apps.core.jobs import Job
from apps.incidents import alert_bodies
from apps.incidents.models import Incident, Webhook, WebhookDelivery
from integrations import webhook_client

MAX_ATTEMPTS = 6
# Alerts re-sent per tick, across teams: a backlog after downtime drains over a few ticks.
RESEND_BATCH = 500
OPEN = [Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED]
# The longest wait between two attempts (the task's retry backoff cap).
RETRY_BACKOFF_MAX_S = 300


def save_webhook(
    actor: Actor,
    *,
    team,
    url: str | None,
    secret: str = "",
    enabled: bool = True,
    kind: str | None = None,
    webhook: Webhook | None = None,
) -> Webhook:
    """Register a webhook, or change one; `url=None` keeps the stored URL, which is never read back."""
    webhook = webhook or Webhook(team=team)
    if url is not None:
        webhook.url = checked_url(url, webhook.team)
    if secret:
        webhook.secret_ciphertext = secrets.encrypt(secret)
    webhook.enabled = enabled
    if kind is not None:
        webhook.kind = kind
    with transaction.atomic():
        webhook.save()
        record(
            actor,
            "webhook.save",
            webhook,
            team=team,
            changes={
                "url": webhook.url_shown if url is not None else "unchanged",
                "enabled": enabled,
                "kind": webhook.kind,
                "secret": "set" if secret else "unchanged",
            },
        )
    return webhook


def queue_for(incident: Incident, event: str = WebhookDelivery.Event.OPENED) -> list[int]:
    """One delivery per enabled webhook of the cluster's team, sent after the incident commits."""
    deliveries = [
        WebhookDelivery.objects.create(webhook=hook, incident=incident, event=event)
        for hook in Webhook.objects.filter(team_id=incident.cluster.team_id, enabled=True)
    ]
    for delivery in deliveries:
        transaction.on_commit(lambda delivery_id=delivery.pk: _enqueue(delivery_id))
    return [d.pk for d in deliveries]


def alerts_still_open() -> Iterator[Job]:
    """A tick handler: an open incident's alert sent again to each Alertmanager of its team once
    FLEETDECK_ALERTMANAGER_RESEND_S has passed since the last one, or Alertmanager resolves it."""
    due = timezone.now() - timedelta(seconds=settings.FLEETDECK_ALERTMANAGER_RESEND_S)
    hooks = Webhook.objects.filter(kind=Webhook.Kind.ALERTMANAGER, enabled=True)
    sent = 0
    for hook in hooks:
        recent = WebhookDelivery.objects.filter(webhook=hook, created_at__gte=due).values("incident_id")
        open_incidents = Incident.objects.filter(cluster__team_id=hook.team_id, status__in=OPEN).exclude(pk__in=recent)
        for incident in open_incidents.order_by("pk")[: RESEND_BATCH - sent]:
            delivery = WebhookDelivery.objects.create(
                webhook=hook, incident=incident, event=WebhookDelivery.Event.STILL_OPEN
            )
            sent += 1
            yield Job(jobs.DELIVER_WEBHOOK, (delivery.pk,))
        if sent >= RESEND_BATCH:
            return


def _enqueue(delivery_id: int) -> None:
    jobs.enqueue(jobs.DELIVER_WEBHOOK, delivery_id)


def lost_deliveries() -> Iterator[Job]:
    for delivery_id in requeue_lost():
        yield Job(jobs.DELIVER_WEBHOOK, (delivery_id,))


def requeue_lost(now=None) -> list[int]:
    """Pending deliveries with no attempt for longer than any retry waits: the broker refused or
    lost their message (a retry waiting out its backoff is a message too). Claimed before they are
    sent again, so two ticks send each once; MAX_ATTEMPTS still bounds the attempts."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=RETRY_BACKOFF_MAX_S + settings.FLEETDECK_CHANGE_STALE_S)
    pending = WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING, sent_at__lt=cutoff)
    return [
        delivery_id
        for delivery_id in pending.order_by("pk").values_list("pk", flat=True)
        if WebhookDelivery.objects.filter(
            pk=delivery_id, state=WebhookDelivery.State.PENDING, sent_at__lt=cutoff
        ).update(sent_at=now)
    ]


def deliver(delivery_id: int) -> None:
    """One attempt. Raises DeliveryError when a retry may help; the task retries with backoff."""
    delivery = (
        WebhookDelivery.objects.select_related("webhook", "incident__cluster__team")
        .filter(pk=delivery_id, state=WebhookDelivery.State.PENDING)
        .first()
    )
    if delivery is None:
        return
    delivery.attempts += 1
    delivery.sent_at = timezone.now()
    if delivery.event == WebhookDelivery.Event.STILL_OPEN and delivery.incident.status not in OPEN:
        # Resolved since it was queued: its resolution is on its way, and this would reopen the alert.
        delivery.state, delivery.last_error = WebhookDelivery.State.DELIVERED, "not sent: resolved meanwhile"
        delivery.save()
        return
    try:
        message = alert_bodies.outgoing(
            delivery.webhook.kind,
            secrets.decrypt(delivery.webhook.url_ciphertext),
            delivery.incident,
            delivery.event,
            settings.FLEETDECK_BASE_URL,
        )
        status = webhook_client.post(
            message.url, message.body, secret=secrets.decrypt(delivery.webhook.secret_ciphertext)
        )
    except secrets.SecretUnreadable as exc:
        # No retry brings a lost key back: the webhook has to be entered again.
        delivery.state, delivery.last_error = WebhookDelivery.State.FAILED, str(exc)
        delivery.save()
        return
    except webhook_client.DeliveryError as exc:
        final = not exc.transient or delivery.attempts >= MAX_ATTEMPTS
        delivery.state = WebhookDelivery.State.FAILED if final else WebhookDelivery.State.PENDING
        delivery.last_status, delivery.last_error = exc.status, exc.message
        delivery.save()
        if not final:
            raise
        return
    delivery.state, delivery.last_status, delivery.last_error, delivery.delivered_at = (
        WebhookDelivery.State.DELIVERED,
        status,
        "",
        timezone.now(),
    )
    delivery.save()
