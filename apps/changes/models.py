"""Presets and changes. A change records every step of the push protocol, persisted before the
step runs, so a crash at any point leaves a row that says how far it got."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.accounts.models import Team
from apps.clusters.models import Cluster
from apps.core.fields import JSONField
from apps.core.sealed import PATCH, SealedJSONField
from apps.fleet import client_impact


class Preset(models.Model):
    """A partial set of deployment options. Built-in presets ship as data (`builtin_presets.py`)
    and are loaded by a migration-free upsert; custom ones belong to a team."""

    slug = models.SlugField(max_length=80, unique=True)
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True, default="", help_text="Why these values: the causes they prevent.")
    options = SealedJSONField(help_text="Deployment options, as in a Serve config's deployment entry.")
    remedies = JSONField(default=list, blank=True, help_text="Playbook remedy ids, e.g. R1, R2.")
    builtin = models.BooleanField(default=False)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="presets")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "team"

    class Meta:
        ordering = ["-builtin", "name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def visible_rows(cls, user, teams) -> Q:
        """Built-ins are everyone's; a team's own presets are its members'."""
        return Q(builtin=True) | Q(team__in=teams)


class ChangeState(models.TextChoices):
    PLANNED = "planned", "Planned"
    QUEUED = "queued", "Queued"
    CHECKING = "checking", "Checking for drift"
    PUSHING = "pushing", "Pushing"
    VERIFYING = "verifying", "Verifying"
    ROLLING_BACK = "rolling_back", "Rolling back"
    SUCCEEDED = "succeeded", "Succeeded"
    ROLLED_BACK = "rolled_back", "Rolled back"
    DRIFTED = "drifted", "Stopped: cluster drifted"
    FAILED = "failed", "Failed"
    ROLLBACK_FAILED = "rollback_failed", "Rollback failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_STATES = [
    ChangeState.QUEUED,
    ChangeState.CHECKING,
    ChangeState.PUSHING,
    ChangeState.VERIFYING,
    ChangeState.ROLLING_BACK,
]
FINAL_STATES = [
    ChangeState.SUCCEEDED,
    ChangeState.ROLLED_BACK,
    ChangeState.DRIFTED,
    ChangeState.FAILED,
    ChangeState.ROLLBACK_FAILED,
    ChangeState.CANCELLED,
]


class Rollout(models.Model):
    """One preset or option set applied to many deployments across clusters, in waves: a canary
    cluster first, then the rest, stopping at the first change that does not succeed."""

    class State(models.TextChoices):
        PLANNED = "planned", "Planned"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Stopped at a failure"
        CANCELLED = "cancelled", "Cancelled"

    reason = models.TextField()
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="rollouts")
    options = SealedJSONField(default=dict)
    selection = JSONField(default=dict, help_text="The filters that chose the deployments.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLANNED, db_index=True)
    current_wave = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # A wave whose clients saw more failed requests than this share at the proxy stops the rollout
    # and is rolled back.
    client_error_budget = models.FloatField(
        default=0.001,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of client requests a wave may fail at the proxy (0.001 = 0.1 %).",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Rollout #{self.pk}"

    @property
    def client_error_budget_pct(self) -> str:
        return f"{100 * self.client_error_budget:g}"

    @classmethod
    def visible_rows(cls, user, teams) -> Q:
        """A rollout spans teams, so it has no team path: the user's own, and any with a change on
        a cluster of one of the teams."""
        return Q(created_by=user) | Q(pk__in=Change.objects.filter(cluster__team__in=teams).values("rollout"))

    @property
    def waves(self) -> list[list[Change]]:
        grouped: dict[int, list[Change]] = {}
        for change in self.changes.all():
            grouped.setdefault(change.wave or 0, []).append(change)
        return [grouped[key] for key in sorted(grouped)]


class Change(models.Model):
    class Kind(models.TextChoices):
        PATCH = "patch", "Patch deployment options"
        RESTORE = "restore", "Restore application configs"
        CREATE_APP = "create_app", "Deploy a new application"
        DELETE_APP = "delete_app", "Delete an application"
        # external_scaler_enabled and a fixed num_replicas, or Serve's autoscaling_config back.
        SCALER = "scaler", "Hand a replica count to or from a scaler"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="changes")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PATCH)
    # [{"application": "demo", "deployment": "Model"}, ...] for patches; application names for restores,
    # and the one application a create or delete adds or removes.
    targets = JSONField(default=list)
    patch = SealedJSONField(default=dict, blank=True)
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    restores = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="restored_by")
    rollout = models.ForeignKey(Rollout, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    wave = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField()

    state = models.CharField(max_length=20, choices=ChangeState.choices, default=ChangeState.PLANNED, db_index=True)
    ray_version = models.CharField(max_length=32, blank=True)
    base_hash = models.CharField(max_length=64)
    base_config = SealedJSONField()
    new_config = SealedJSONField()
    new_hash = models.CharField(max_length=64)
    json_patch = SealedJSONField(default=list, kind=PATCH)
    warnings = JSONField(default=list, blank=True)
    # Per touched application: its last_deployed_time_s at the re-check, to tell its new deploy apart.
    base_deploy_times = JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    drift = JSONField(default=list, blank=True)
    # What clients saw at the proxy while the change ran (apps.fleet.client_impact): the opening
    # counters while it runs, then requests and failures by code per application.
    client_impact = JSONField(default=dict, blank=True)

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    pushed_at = models.DateTimeField(null=True, blank=True)
    # When verification (or the rollback's) reached its verdict: the change ends later, once the
    # clients' closing reading is in.
    verified_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Touched by the worker at every step and poll; a stale heartbeat on an active change means
    # its worker died and the reconciler takes over.
    heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    # The full configs before and after: large, and read only to push, diff or restore one change.
    CONFIGS = ("base_config", "new_config")

    class Meta:
        ordering = ["-created_at", "-id"]
        # The change list's order: a page is read off the index instead of sorting every change.
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="change_recent_first"),
            # A rollout list counts each rollout's changes by state: from this index alone, not
            # from the change rows with their configs.
            models.Index(
                fields=["rollout", "state", "cluster"], condition=Q(rollout__isnull=False), name="change_rollout_states"
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster"],
                condition=models.Q(state__in=ACTIVE_STATES),
                name="one_active_change_per_cluster",
            )
        ]

    def __str__(self) -> str:
        return f"Change #{self.pk} on {self.cluster}"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def clients_seen(self) -> str:
        return client_impact.sentence(client_impact.public(self.client_impact))

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def touched_applications(self) -> list[str]:
        return sorted({t["application"] if isinstance(t, dict) else t for t in self.targets})


class ChangeStep(models.Model):
    change = models.ForeignKey(Change, on_delete=models.CASCADE, related_name="steps")
    at = models.DateTimeField(auto_now_add=True)
    state = models.CharField(max_length=20, choices=ChangeState.choices)
    message = models.TextField()
    data = JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.state}: {self.message}"
