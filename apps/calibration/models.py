"""Memory calibrations: one Ray job per request, measuring a deployment's peak memory."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.clusters.models import Cluster
from apps.core.fields import JSONField
from apps.fleet.models import Deployment


class MemoryCalibration(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        STOPPED = "stopped", "Stopped"

    ACTIVE_STATES = (State.PENDING, State.RUNNING)

    # The row outlives its deployment (history, and the wizard matching by name after a re-sync).
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="calibrations"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="calibrations")
    application_name = models.CharField(max_length=200)
    deployment_name = models.CharField(max_length=200)
    submission_id = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    axis = models.CharField(max_length=16, blank=True)
    device = models.CharField(max_length=32, blank=True)
    # How the class was driven: starlette, asgi, handle or hook ("" before this was recorded).
    shape = models.CharField(max_length=16, blank=True)
    # At rest once warm (after one request); the cold one is before any request.
    baseline_bytes = models.BigIntegerField(null=True, blank=True)
    cold_baseline_bytes = models.BigIntegerField(null=True, blank=True)
    # Why the run stopped before its last level (the memory budget); empty when it did not.
    limit_reason = models.TextField(blank=True)
    # [{"x": 1, "peak_bytes": N, "uss_peak_bytes": N, "service_s": s}, ...], sorted by x.
    points = JSONField(default=list, blank=True)
    monotone = models.BooleanField(null=True, blank=True)
    warnings = JSONField(default=list, blank=True)
    levels = JSONField(default=list, blank=True)
    # What was measured: import path, user_config, the representative request, runtime_env,
    # resources and the memory stop.
    request = JSONField(default=dict, blank=True)
    # A weighted mix measured instead of one request: [{"request" (headers redacted), "share", "tokens"?}, ...],
    # with each request's "label", "points", "increment_bytes" and "limit_reason" once measured; [] for one request.
    mix = JSONField(default=list, blank=True)
    # The representative request's headers (JSON), encrypted: they may carry credentials, so
    # `request` holds them with their values redacted. For a mix, a list of them in its order.
    headers_ciphertext = models.TextField(blank=True, default="")
    error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    polled_at = models.DateTimeField(null=True, blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "application_name", "deployment_name"],
                condition=models.Q(state__in=["pending", "running"]),
                name="one_active_calibration_per_deployment",
            )
        ]

    def __str__(self) -> str:
        return f"Calibration #{self.pk} of {self.application_name}/{self.deployment_name}"

    @property
    def is_final(self) -> bool:
        return self.state not in self.ACTIVE_STATES
