"""Incidents: what went wrong on which deployment, the evidence, and the suspected causes."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.clusters.models import Cluster
from apps.core import secrets
from apps.core.fields import JSONField
from apps.fleet.models import Deployment
from integrations.webhook_client import shown


class Incident(models.Model):
    class Kind(models.TextChoices):
        OOM_KILL = "oom_kill", "OOM kill"
        LATENCY_SPIKE = "latency_spike", "Latency spike"
        QUEUE_BUILDUP = "queue_buildup", "Queue build-up"
        MEMORY_PRESSURE = "memory_pressure", "Memory pressure"
        MEMORY_RATCHET = "memory_ratchet", "Memory ratchet"
        ENGINE_STUCK = "engine_stuck", "LLM engine stuck"

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        RESOLVED = "resolved", "Resolved"

    class Severity(models.TextChoices):
        WARNING = "warning", "Warning"
        MAJOR = "major", "Major"
        CRITICAL = "critical", "Critical"

    kind = models.CharField(max_length=24, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN, db_index=True)
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="incidents")
    application_name = models.CharField(max_length=200)
    deployment_name = models.CharField(max_length=200)
    # Kept as names too: the deployment row may be removed while the incident stays.
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="incidents"
    )
    # Node-level incidents (memory) name the node instead of a deployment.
    node_ip = models.CharField(max_length=64, blank=True)
    title = models.CharField(max_length=300)
    started_at = models.DateTimeField()
    last_signal_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    signal_count = models.PositiveIntegerField(default=1)
    # Copied in, so the history outlives signal retention.
    evidence = JSONField(default=dict)
    causes = JSONField(default=list, help_text="[{id, title, reason, rank}] from the playbook.")

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["-last_signal_at", "-id"]
        # The incident list and API pages walk this order: without the index, every page sorts
        # the whole table (a fleet keeps every incident it ever had).
        indexes = [models.Index(fields=["-last_signal_at", "-id"], name="incident_recent_first")]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "application_name", "deployment_name", "node_ip", "kind"],
                condition=models.Q(status__in=["open", "acknowledged"]),
                name="one_open_incident_per_deployment_and_kind",
            )
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def is_open(self) -> bool:
        return self.status != self.Status.RESOLVED


class OomKillRecord(models.Model):
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="oom_kills")
    actor_id = models.CharField(max_length=64)
    replica = models.CharField(max_length=64)
    # "app/deployment" of a replica killed beside the incident's deployment, whose replica held the
    # memory; blank when the killed replica is the incident's own.
    killed_deployment = models.CharField(max_length=300, blank=True)
    node_ip = models.CharField(max_length=64, blank=True)
    used_bytes = models.BigIntegerField(null=True, blank=True)
    threshold_bytes = models.BigIntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seen_at", "id"]
        constraints = [models.UniqueConstraint(fields=["incident", "actor_id"], name="one_record_per_killed_actor")]

    def __str__(self) -> str:
        return f"OOM kill of {self.replica} ({self.actor_id})"


class PodKillRecord(models.Model):
    """A Ray container Kubernetes reports OOMKilled (the kernel's kill, not Ray's memory monitor)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="pod_kills")
    # Pod uid, container and finish time: the same kill read again on the next pass has the same key.
    kill_key = models.CharField(max_length=400)
    namespace = models.CharField(max_length=63)
    pod = models.CharField(max_length=253)
    container = models.CharField(max_length=253)
    node = models.CharField(max_length=253, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    restart_count = models.PositiveIntegerField(default=0)
    memory_limit_bytes = models.BigIntegerField(null=True, blank=True)
    ray_memory_bytes = models.BigIntegerField(null=True, blank=True)
    seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seen_at", "id"]
        constraints = [models.UniqueConstraint(fields=["incident", "kill_key"], name="one_record_per_pod_kill")]

    def __str__(self) -> str:
        return f"OOMKilled {self.namespace}/{self.pod}/{self.container}"


class IncidentEvent(models.Model):
    class Kind(models.TextChoices):
        DETECTED = "detected", "Detected"
        EXTENDED = "extended", "More signals"
        NOTE = "note", "Note"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        RESOLVED = "resolved", "Resolved"
        REOPENED = "reopened", "Reopened"

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="timeline")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    message = models.TextField(blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} on incident #{self.incident_id}"


class Window(models.Model):
    """Signal points in time order, in two columns: `recent`, the raw readings of the last hour,
    rewritten by every reading, and `summaries`, one point per 5 minutes before that, which
    change only when a 5-minute bucket leaves the hour or the retention. PostgreSQL keeps a large
    value out of line and an UPDATE that does not set it keeps it as it is, so a reading writes
    the hour, not the day."""

    recent = JSONField(default=list)
    summaries = JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

    @property
    def points(self) -> list[dict]:
        return [*self.summaries, *self.recent]

    @points.setter
    def points(self, points: list[dict]) -> None:
        self.summaries = [p for p in points if "summary" in p]
        self.recent = [p for p in points if "summary" not in p]

    def save_points(self, points: list[dict]) -> None:
        """Store `points` (a compacted window), writing only the columns that changed."""
        summaries = self.summaries
        self.points = points
        self.save(update_fields=["recent", "updated_at", *(["summaries"] if self.summaries != summaries else [])])


class SignalWindow(Window):
    """A deployment's recent signal points, one row per deployment: raw readings for the last
    hour, 5-minute summaries before that, nothing past the retention."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="signal_windows")
    application_name = models.CharField(max_length=200)
    deployment_name = models.CharField(max_length=200)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "application_name", "deployment_name"], name="one_window_per_deployment"
            )
        ]

    def __str__(self) -> str:
        return f"signals of {self.application_name}/{self.deployment_name} on cluster #{self.cluster_id}"


class NodeWindow(Window):
    """A node's recent memory readings (fraction of total, GPU memory when Ray reports it)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="node_windows")
    node_ip = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "node_ip"], name="one_window_per_node")]

    def __str__(self) -> str:
        return f"memory of {self.node_ip} on cluster #{self.cluster_id}"


class ScrapeState(models.Model):
    """The counters of a cluster's last metrics scrape, to difference against the next one."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="scrape_state")
    at = models.FloatField()
    samples = JSONField(default=list)
    warnings = JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    # When the reading now queued or running was asked for: one at a time per cluster.
    claimed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"metrics scrape of cluster #{self.cluster_id}"


class Webhook(models.Model):
    """A team's endpoint for incidents as they open and resolve: Fleetdeck's JSON body (signed with
    HMAC-SHA256 when a secret is set), an Alertmanager's alerts API or a Slack incoming webhook.

    The URL is a credential too (a Slack-style URL carries its secret in the path): it is stored
    encrypted, and what is shown of it, anywhere, is `url_shown`, its scheme and host."""

    class Kind(models.TextChoices):
        JSON = "json", "JSON (Fleetdeck's own body)"
        ALERTMANAGER = "alertmanager", "Alertmanager (POST /api/v2/alerts)"
        SLACK = "slack", "Slack incoming webhook"

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="webhooks")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.JSON)
    url_ciphertext = models.TextField()
    url_shown = models.CharField(max_length=500)
    secret_ciphertext = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "team"

    class Meta:
        ordering = ["team__name", "id"]

    def __str__(self) -> str:
        return f"{self.team} → {self.url_shown}"

    def _set_url(self, url: str) -> None:
        self.url_ciphertext = secrets.encrypt(url)
        self.url_shown = shown(url)

    # Write-only, `Webhook(url=…)` included: only delivery reads the URL back, decrypting it there.
    url = property(fset=_set_url)


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    class Event(models.TextChoices):
        OPENED = "opened", "Opened"
        RESOLVED = "resolved", "Resolved"
        # Alertmanager forgets an alert nobody re-sends: an open incident's alert is sent again.
        STILL_OPEN = "still_open", "Still open"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="webhook_deliveries")
    event = models.CharField(max_length=16, choices=Event.choices, default=Event.OPENED)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When it was last handed to the broker or attempted: pending long past it, its message was lost.
    sent_at = models.DateTimeField(default=timezone.now, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"delivery #{self.pk} to webhook #{self.webhook_id}: {self.state}"
