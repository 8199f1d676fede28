from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.clusters.models import Cluster
from apps.core.fields import JSONField
from apps.fleet.models import Deployment


class Finding(models.Model):
    """A rule a deployment (or cluster) violates now. Recomputed on every sync; resolved when the
    rule no longer fires; muted by a person with a reason."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="findings")
    # The cluster's name, kept here for the lists' order (rule, cluster, application, deployment):
    # sorting by the joined name read and sorted every open finding of the first rule on each
    # page. `save` fills it and reconcile writes it; a cluster keeps its name for life.
    cluster_name = models.CharField(max_length=63, blank=True, default="")
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="findings"
    )
    application_name = models.CharField(max_length=200, blank=True)
    deployment_name = models.CharField(max_length=200, blank=True)
    # What a Kubernetes check (K1-K4) points at ("namespace/pod/container"); empty for config lint.
    subject = models.CharField(max_length=300, blank=True)
    rule = models.CharField(max_length=40, db_index=True)
    severity = models.CharField(max_length=16)
    # The check's own explanation of this occurrence; config lint explains itself through its rule.
    message = models.TextField(blank=True)
    evidence = JSONField(default=dict)
    patch = JSONField(null=True, blank=True)
    action = models.CharField(max_length=16, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    muted_at = models.DateTimeField(null=True, blank=True)
    muted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    mute_reason = models.TextField(blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["rule", "cluster_name", "application_name", "deployment_name"]
        indexes = [
            models.Index(
                fields=["rule", "cluster_name", "application_name", "deployment_name", "id"],
                condition=models.Q(resolved_at__isnull=True),
                name="open_findings_in_list_order",
            )
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "application_name", "deployment_name", "subject", "rule"],
                condition=models.Q(resolved_at__isnull=True),
                name="one_open_finding_per_subject_and_rule",
            )
        ]

    def __str__(self) -> str:
        where = (
            f"{self.application_name}/{self.deployment_name}" if self.deployment_name else (self.subject or "cluster")
        )
        return f"{self.rule} on {self.cluster.name} {where}"

    def save(self, *args, **kwargs):
        if not self.cluster_name and self.cluster_id:
            self.cluster_name = self.cluster.name
        super().save(*args, **kwargs)


class Wizard(models.Model):
    """A guided fix for one deployment, from an incident or a finding: diagnosis, one step per
    remedy, verification under live traffic, outcome. Rows, not session state, so any operator
    can resume it; `revision` makes two operators' clicks on a stale page fail loudly."""

    class State(models.TextChoices):
        OPEN = "open", "In progress"
        VERIFYING = "verifying", "Verifying"
        RESOLVED = "resolved", "Resolved"
        NOT_RESOLVED = "not_resolved", "Not resolved"
        ABANDONED = "abandoned", "Abandoned"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="wizards")
    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="wizards")
    application_name = models.CharField(max_length=200)
    deployment_name = models.CharField(max_length=200)
    incident = models.ForeignKey(
        "incidents.Incident", null=True, blank=True, on_delete=models.SET_NULL, related_name="wizards"
    )
    finding = models.ForeignKey(Finding, null=True, blank=True, on_delete=models.SET_NULL, related_name="wizards")
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN, db_index=True)
    revision = models.PositiveIntegerField(default=1)
    diagnosis = JSONField(default=dict, help_text="Evidence, ranked causes and the measurements the values come from.")
    # The deployment's settings the computed values were based on; a live config that differs
    # (other than by this wizard's own changes) makes the wizard stale.
    basis = JSONField(default=dict)
    latency_objective_ms = models.PositiveIntegerField(
        default=10_000, help_text="p99 the clients may see, end to end (ms)."
    )
    # Share of client requests (at the proxy) that may fail (5xx, 408) before verification fails.
    failure_objective = models.FloatField(default=0.05)
    verification_window_s = models.PositiveIntegerField(default=600)
    verify_started_at = models.DateTimeField(null=True, blank=True)
    verify_ends_at = models.DateTimeField(null=True, blank=True, db_index=True)
    before = JSONField(default=dict, blank=True)
    after = JSONField(default=dict, blank=True)
    outcome = models.TextField(blank=True)
    next_steps = JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Wizard #{self.pk} for {self.application_name}/{self.deployment_name}"

    @property
    def is_active(self) -> bool:
        return self.state in (self.State.OPEN, self.State.VERIFYING)


class WizardStep(models.Model):
    class Kind(models.TextChoices):
        DIAGNOSIS = "diagnosis", "Diagnosis"
        CALIBRATION = "calibration", "Memory calibration"
        CONFIG = "config", "Config remedy"
        CHECKLIST = "checklist", "Code-level remedy"
        # R11: creates the deployment's shadow scaler; nothing is pushed to the cluster.
        SCALER = "scaler", "Fleetdeck scaler"
        VERIFICATION = "verification", "Verification"
        OUTCOME = "outcome", "Outcome"

    class Status(models.TextChoices):
        PENDING = "pending", "To do"
        APPLYING = "applying", "Applying"
        APPLIED = "applied", "Applied"
        FAILED = "failed", "Change failed"
        DONE = "done", "Done"
        PASSED = "passed", "Checked: passed"
        CHECK_FAILED = "check_failed", "Checked: failed"
        SKIPPED = "skipped", "Skipped"
        NOT_APPLICABLE = "not_applicable", "Not applicable"

    wizard = models.ForeignKey(Wizard, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    remedy = models.CharField(max_length=8, blank=True)
    title = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    values = JSONField(default=dict, blank=True, help_text="Computed values with the reason for each.")
    patch = JSONField(null=True, blank=True)
    change = models.ForeignKey(
        "changes.Change", null=True, blank=True, on_delete=models.SET_NULL, related_name="wizard_steps"
    )
    calibration = models.ForeignKey(
        "calibration.MemoryCalibration", null=True, blank=True, on_delete=models.SET_NULL, related_name="wizard_steps"
    )
    check_result = JSONField(default=dict, blank=True)
    note = models.TextField(blank=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["wizard", "position"]
        constraints = [models.UniqueConstraint(fields=["wizard", "position"], name="one_step_per_position")]

    def __str__(self) -> str:
        return f"{self.wizard} step {self.position}: {self.title}"

    @property
    def is_settled(self) -> bool:
        return self.status not in (self.Status.PENDING, self.Status.APPLYING)
