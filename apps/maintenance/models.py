"""Recycle schedules, warmup profiles and the runs they produce."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.changes.models import Change
from apps.clusters.models import Cluster
from apps.core.fields import JSONField
from apps.core.sealed import HEADERS, SealedJSONField
from apps.fleet.models import Application, Deployment


class Window(models.Model):
    """When maintenance may run: weekdays (0 = Monday) and an hour range in a time zone.
    An end before the start wraps past midnight (22–04)."""

    window_days = JSONField(default=list, blank=True, help_text="Weekdays 0–6 (Monday = 0); empty: every day.")
    window_start_hour = models.PositiveSmallIntegerField(default=0)
    window_end_hour = models.PositiveSmallIntegerField(default=24)
    timezone = models.CharField(max_length=64, default="UTC")

    class Meta:
        abstract = True


class WarmupProfile(Window):
    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="warmup_profiles")
    name = models.CharField(max_length=100)
    method = models.CharField(max_length=8, default="GET")
    path = models.CharField(max_length=500, help_text="Under the application's route prefix.")
    headers = SealedJSONField(default=dict, blank=True, kind=HEADERS)
    body = JSONField(null=True, blank=True)
    requests = models.PositiveIntegerField(default=20)
    concurrency = models.PositiveIntegerField(default=2)
    timeout_s = models.FloatField(default=10.0)
    p95_threshold_ms = models.FloatField(
        null=True, blank=True, help_text="Fail when p95 is above this; empty: no latency criterion."
    )
    every_hours = models.PositiveIntegerField(
        null=True, blank=True, help_text="Also run on this schedule; empty: only after recycles and on demand."
    )
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "application__cluster__team"

    class Meta:
        ordering = ["application__cluster__name", "application__name", "name"]

    def __str__(self) -> str:
        return f"{self.application} · {self.name}"


class RecycleSchedule(Window):
    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="recycle_schedule")
    enabled = models.BooleanField(default=True)
    every_hours = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=100, blank=True, help_text="Standard 5-field cron, in the schedule's time zone.")
    warmup = models.ForeignKey(
        WarmupProfile, null=True, blank=True, on_delete=models.SET_NULL, related_name="recycle_schedules"
    )
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "deployment__application__cluster__team"

    class Meta:
        ordering = ["deployment__application__cluster__name", "deployment__application__name", "deployment__name"]

    def __str__(self) -> str:
        return f"Recycle {self.deployment}"


class MaintenanceRun(models.Model):
    class Kind(models.TextChoices):
        RECYCLE = "recycle", "Recycle"
        WARMUP = "warmup", "Warmup"

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        SKIPPED = "skipped", "Skipped"

    class Trigger(models.TextChoices):
        SCHEDULE = "schedule", "Schedule"
        MANUAL = "manual", "On demand"
        AFTER_RECYCLE = "after_recycle", "After a recycle"
        AFTER_CHANGE = "after_change", "After a change that replaced replicas"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="maintenance_runs")
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="maintenance_runs"
    )
    schedule = models.ForeignKey(RecycleSchedule, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    profile = models.ForeignKey(WarmupProfile, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    # The slot a scheduled run stands for; unique per schedule so a slot runs exactly once.
    slot = models.DateTimeField(null=True, blank=True)
    change = models.ForeignKey(
        Change, null=True, blank=True, on_delete=models.SET_NULL, related_name="maintenance_runs"
    )
    after = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="followups")
    override_guards = models.BooleanField(default=False)
    override_reason = models.TextField(blank=True)
    skip_reason = models.TextField(blank=True)
    error = models.TextField(blank=True)
    replicas_before = JSONField(default=list, blank=True)
    replicas_after = JSONField(default=list, blank=True)
    cold_start_s = models.FloatField(null=True, blank=True)
    results = JSONField(default=dict, blank=True)
    log = JSONField(default=list, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # When the run was last handed to the broker: a queued run long past it was lost on the way.
    enqueued_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Touched by the worker while the run is running; a stale one means the worker died with the
    # run (and, for a recycle, the cluster's one running-recycle slot) still held.
    heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "slot"], name="one_run_per_schedule_slot"),
            models.UniqueConstraint(fields=["profile", "slot"], name="one_run_per_warmup_slot"),
            models.UniqueConstraint(
                fields=["cluster"],
                condition=models.Q(kind="recycle", state="running"),
                name="one_running_recycle_per_cluster",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} run #{self.pk}"

    @property
    def is_final(self) -> bool:
        return self.state in (self.State.SUCCEEDED, self.State.FAILED, self.State.SKIPPED)
