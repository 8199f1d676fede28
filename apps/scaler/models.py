"""Scalers: one per deployment, deciding its replica count from its signals and its calibration,
and the decisions they made. In shadow mode a scaler only records what it would have done."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.core.fields import JSONField
from apps.fleet.models import Deployment


class Scaler(models.Model):
    class Mode(models.TextChoices):
        # Decides and records every tick, never calls Ray: its record is what active mode would do.
        SHADOW = "shadow", "Shadow"
        # Sets the count through Ray's scale API (needs the application's external_scaler_enabled).
        ACTIVE = "active", "Active"
        # Active until the change that gives the count back to Serve's autoscaler has succeeded.
        HANDING_BACK = "handing_back", "Handing back"
        OFF = "off", "Off"

    class Purpose(models.TextChoices):
        ACTIVATE = "activate", "Take control"
        DEACTIVATE = "deactivate", "Turn off"
        HAND_BACK = "hand_back", "Hand back (watchdog)"

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="scaler")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.SHADOW)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField()
    # Optional: with one, a p99 over it while requests queue asks for one more replica.
    latency_objective_ms = models.PositiveIntegerField(null=True, blank=True)
    # Overrides of what the latest calibration says; null: the calibration's.
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    service_s = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When the tick last decided for it: the tick takes the longest-waiting scalers first.
    evaluated_at = models.DateTimeField(null=True, blank=True)
    # The count last sent through the scale API (or handed over at activation): every config push
    # carries it as the deployment's num_replicas, which Serve would otherwise reset it to.
    target = models.PositiveIntegerField(null=True, blank=True)
    # The deployment's autoscaling_config before activation (Serve's defaults left out): what a
    # hand-back restores when no calibration sizes a new one.
    autoscaling_config = JSONField(null=True, blank=True)
    # The change that turns it on or off, while it runs and after (the last one), and why it was made.
    change = models.ForeignKey(
        "changes.Change", null=True, blank=True, on_delete=models.SET_NULL, related_name="scalers"
    )
    change_purpose = models.CharField(max_length=16, choices=Purpose.choices, blank=True)
    # Set when an active scaler cannot act (Ray answered 412: the flag is off); it stops acting until
    # a person turns it off or on again.
    attention = models.TextField(blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "deployment__application__cluster__team"

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(min_replicas__gte=1) & models.Q(max_replicas__gte=models.F("min_replicas")),
                name="scaler_replica_bounds",
            )
        ]
        indexes = [models.Index(fields=["mode", "evaluated_at"], name="scaler_due")]

    def __str__(self) -> str:
        return f"Scaler of {self.deployment} ({self.mode})"


class ScalerDecision(models.Model):
    class Kind(models.TextChoices):
        UP = "up", "Scale up"
        DOWN = "down", "Scale down"
        HOLD = "hold", "Hold"
        AT_CEILING = "at_ceiling", "At the memory ceiling"
        HAND_BACK = "hand_back", "Hand back"

    scaler = models.ForeignKey(Scaler, on_delete=models.CASCADE, related_name="decisions")
    at = models.DateTimeField(db_index=True)
    target = models.PositiveIntegerField()
    current = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    reason = models.TextField()
    # What the decision read: the windows' loads, the ceiling, the policy (apps.scaler.decision.Inputs).
    inputs = JSONField(default=dict, blank=True)
    # The newest metrics reading it read (Ray's metrics time): a tick with nothing newer records nothing.
    signals_at = models.FloatField(null=True, blank=True)
    # Whether it was carried out; shadow decisions never are.
    applied = models.BooleanField(default=False)
    # Why carrying it out failed (Ray's answer), or the hand-back's change could not be made.
    error = models.TextField(blank=True)

    team_path = "scaler__deployment__application__cluster__team"

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["scaler", "-at"], name="scaler_decisions_newest")]

    def __str__(self) -> str:
        return f"{self.scaler.deployment} @ {self.at:%H:%M:%S}: {self.kind} {self.current} -> {self.target}"
