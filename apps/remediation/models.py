from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.clusters.models import Cluster
from apps.fleet.models import Deployment


class Finding(models.Model):
    """A rule a deployment (or cluster) violates now. Recomputed on every sync; resolved when the
    rule no longer fires; muted by a person with a reason."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="findings")
    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="findings")
    application_name = models.CharField(max_length=200, blank=True)
    deployment_name = models.CharField(max_length=200, blank=True)
    rule = models.CharField(max_length=40, db_index=True)
    severity = models.CharField(max_length=16)
    evidence = models.JSONField(default=dict)
    patch = models.JSONField(null=True, blank=True)
    action = models.CharField(max_length=16, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    muted_at = models.DateTimeField(null=True, blank=True)
    muted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    mute_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["rule", "cluster__name", "application_name", "deployment_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "application_name", "deployment_name", "rule"],
                condition=models.Q(resolved_at__isnull=True),
                name="one_open_finding_per_subject_and_rule",
            )
        ]

    def __str__(self) -> str:
        where = f"{self.application_name}/{self.deployment_name}" if self.deployment_name else "cluster"
        return f"{self.rule} on {self.cluster.name} {where}"
