from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from apps.accounts.access import visible
from apps.accounts.models import Team
from apps.clusters.egress_rules import normalize_rule
from apps.core.fields import JSONField


class Reachability(models.TextChoices):
    UNKNOWN = "unknown", "Not synced yet"
    OK = "ok", "Reachable"
    UNREACHABLE = "unreachable", "Unreachable"
    ERROR = "error", "Answering with errors"


class ClusterQuerySet(models.QuerySet):
    def visible_to(self, user) -> ClusterQuerySet:
        return visible(user, self)


# What a team admin sets on a cluster, in the order the form shows it. The register and edit
# form, the API serializer, both views and the registry services take exactly these, so none can
# lose a field the others keep (the form had lost the Prometheus pair). `name` is set once, at
# registration; `token` is stored encrypted, as token_ciphertext.
EDITABLE_FIELDS = (
    "name",
    "team",
    "dashboard_url",
    "token",
    "serve_config_owner",
    "metrics_url",
    "prometheus_url",
    "prometheus_selector",
    "serve_url",
    "labels",
)
UPDATABLE_FIELDS = tuple(field for field in EDITABLE_FIELDS if field != "name")


class Cluster(models.Model):
    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[
            RegexValidator(
                r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
                "Use lowercase letters, digits and dashes, starting and ending with a letter or digit.",
            )
        ],
        help_text="Lowercase letters, digits and dashes.",
    )
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="clusters")
    dashboard_url = models.URLField(max_length=300)
    # Fernet ciphertext of the Ray dashboard bearer token; never leaves the server.
    token_ciphertext = models.TextField(blank=True, default="")
    labels = JSONField(default=dict, blank=True)

    class ConfigOwner(models.TextChoices):
        DASHBOARD = "dashboard", "Ray dashboard (Fleetdeck pushes through the REST API)"
        RAYSERVICE = "rayservice", "KubeRay RayService (serveConfigV2 owns the config)"

    serve_config_owner = models.CharField(max_length=16, choices=ConfigOwner.choices, default=ConfigOwner.DASHBOARD)
    metrics_url = models.URLField(
        max_length=300,
        blank=True,
        help_text="Ray's Prometheus metrics endpoint (--metrics-export-port), e.g. http://head:8080/metrics.",
    )
    prometheus_url = models.URLField(
        max_length=300,
        blank=True,
        help_text="A Prometheus that scrapes this cluster; preferred over the metrics URL when set.",
    )
    prometheus_selector = models.CharField(
        max_length=300,
        blank=True,
        validators=[
            RegexValidator(
                r'^(\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*"\s*)(,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*"\s*)*$',
                'Label matchers such as cluster="vision-prod", without braces.',
            )
        ],
        help_text='Label matchers that pick this cluster\'s series in Prometheus, e.g. cluster="vision-prod".',
    )
    serve_url = models.URLField(
        max_length=300,
        blank=True,
        help_text="Serve's HTTP endpoint for warmups; empty: the dashboard host on Serve's HTTP port.",
    )

    ray_version = models.CharField(max_length=32, blank=True)
    ray_commit = models.CharField(max_length=64, blank=True)
    session_name = models.CharField(max_length=128, blank=True)
    auth_mode = models.CharField(max_length=32, blank=True)
    serve_running = models.BooleanField(default=False)
    serve_controller_start_time = models.FloatField(null=True, blank=True)
    serve_http_port = models.PositiveIntegerField(null=True, blank=True)
    # Each node's logical resources, {node IP: {resource: [used, total]}}, from /api/cluster_status:
    # read by the sync only when a replica waits or the last reading is old (apps.fleet.sync).
    node_resources = JSONField(default=dict, blank=True)
    node_resources_at = models.DateTimeField(null=True, blank=True)

    reachability = models.CharField(max_length=16, choices=Reachability.choices, default=Reachability.UNKNOWN)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_sync_duration_ms = models.PositiveIntegerField(null=True, blank=True)
    last_change_seen_at = models.DateTimeField(null=True, blank=True)
    next_sync_at = models.DateTimeField(null=True, blank=True, db_index=True)
    sync_requested_at = models.DateTimeField(null=True, blank=True)
    # Digest of the dashboard's answers at the last sync that was applied and acted on; the same
    # answers again cost one UPDATE of the sync stamps (see apps/fleet/sync.py). Empty: apply in full.
    observed_digest = models.CharField(max_length=64, blank=True, default="")
    # A replica waited to be placed at the last applied sync: the next one reads the nodes' resources.
    replica_waiting = models.BooleanField(default=False)
    # Live Serve applications and deployments, written with them by the sync that applies them
    # (apps.fleet.sync): the cluster lists show them, and counting them per row cost the clusters
    # API more than the rest of its page.
    application_count = models.PositiveIntegerField(
        default=0, help_text="Live Serve applications, as the last applied sync saw them."
    )
    deployment_count = models.PositiveIntegerField(
        default=0, help_text="Live Serve deployments, as the last applied sync saw them."
    )

    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    objects = ClusterQuerySet.as_manager()

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "team"

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_metrics_source(self) -> bool:
        return bool(self.metrics_url or self.prometheus_url)

    @property
    def has_token(self) -> bool:
        return bool(self.token_ciphertext)

    @property
    def sync_pending(self) -> bool:
        return self.sync_requested_at is not None and (
            self.last_sync_at is None or self.last_sync_at < self.sync_requested_at
        )

    @property
    def serve_endpoint(self) -> str:
        if self.serve_url:
            return self.serve_url.rstrip("/")
        from urllib.parse import urlsplit

        parts = urlsplit(self.dashboard_url)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        return f"{parts.scheme}://{host}:{self.serve_http_port or 8000}"

    @property
    def dashboard_auth_enabled(self) -> bool | None:
        if self.auth_mode in ("", "unknown"):
            return None
        return self.auth_mode not in ("disabled", "unsupported")


class ClusterEvent(models.Model):
    """Things a sync noticed about a cluster as a whole: restarts, reachability flips."""

    class Kind(models.TextChoices):
        REGISTERED = "registered", "Registered"
        SESSION_CHANGED = "session_changed", "Ray cluster restarted (new session)"
        CONTROLLER_RESTARTED = "controller_restarted", "Serve controller restarted"
        SERVE_STARTED = "serve_started", "Serve started"
        SERVE_STOPPED = "serve_stopped", "Serve stopped"
        UNREACHABLE = "unreachable", "Became unreachable"
        RECOVERED = "recovered", "Reachable again"
        VERSION_CHANGED = "version_changed", "Ray version changed"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.cluster}: {self.get_kind_display()}"


class EgressRule(models.Model):
    """A network or host name Fleetdeck may call: dashboards, metrics, Prometheus, Serve, webhooks.

    Administrators keep the list (Django admin). An entry without a team is for every team; a
    team's own entries are the only destinations of that team once it has any, so one team's
    private ranges never open for another. With no entry here and none in
    FLEETDECK_CLUSTER_NETWORKS nothing may be called. apps/clusters/network_policy.py decides;
    the value is normalized by `clean`."""

    class Kind(models.TextChoices):
        NETWORK = "network", "Network (CIDR)"
        HOST = "host", "Host name"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    value = models.CharField(
        max_length=253,
        help_text="A network such as 10.20.0.0/16, or a host name such as ray.prod.example or *.prod.example.",
    )
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="egress_rules",
        help_text="Empty: every team may call it. A team with entries of its own may call only those.",
    )
    note = models.CharField(max_length=200, blank=True, help_text="Why this destination is allowed.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "value"]
        constraints = [
            models.UniqueConstraint(fields=["team", "value"], name="one_egress_rule_per_team_and_value"),
            models.UniqueConstraint(
                fields=["value"], condition=models.Q(team__isnull=True), name="one_global_egress_rule_per_value"
            ),
        ]
        verbose_name = "network allow-list entry"
        verbose_name_plural = "network allow-list"

    def __str__(self) -> str:
        return self.value

    def clean(self) -> None:
        self.value = normalize_rule(self.kind, self.value)


class DashboardEndpoint(models.Model):
    """An address a cluster's dashboard answers on, as `host:port` (the URL's own host, and each
    address it resolved to when registered). Unique: a Ray dashboard has no authentication by
    default, so whoever registers it can run code on it; two clusters, let alone two teams, may
    not hold one dashboard (apps/clusters/ownership.py)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="endpoints")
    address = models.CharField(max_length=300, unique=True)

    team_path = "cluster__team"

    def __str__(self) -> str:
        return self.address
