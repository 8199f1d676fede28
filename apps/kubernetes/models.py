from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from apps.accounts.access import visible
from apps.accounts.models import Team
from apps.clusters.models import Cluster
from apps.core.fields import JSONField


class KubeConnectionQuerySet(models.QuerySet):
    def visible_to(self, user) -> KubeConnectionQuerySet:
        return visible(user, self)


class KubeConnection(models.Model):
    """How Fleetdeck reaches one Kubernetes API server (an environment) for a team: a kubeconfig
    context or the pod's own service account, and the namespaces it may look into."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="kube_connections")
    name = models.CharField(
        max_length=63,
        validators=[
            RegexValidator(
                r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
                "Use lowercase letters, digits and dashes, starting and ending with a letter or digit.",
            )
        ],
    )
    in_cluster = models.BooleanField(default=False, help_text="Use the service account of the pod Fleetdeck runs in.")
    # Fernet ciphertext of the kubeconfig (YAML); never leaves the server.
    kubeconfig_ciphertext = models.TextField(blank=True, default="")
    context = models.CharField(max_length=253, blank=True, help_text="Empty: the kubeconfig's current-context.")
    # Listed explicitly: Fleetdeck never lists the namespaces of a cluster it was not told about.
    namespaces = JSONField(default=list)
    # Writes (patching a RayService's serveConfigV2) are refused unless someone turns this off.
    read_only = models.BooleanField(default=True)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_warnings = JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = KubeConnectionQuerySet.as_manager()

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "team"

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_kube_connection_name_per_team")]

    def __str__(self) -> str:
        return self.name

    @property
    def has_kubeconfig(self) -> bool:
        return bool(self.kubeconfig_ciphertext)


class KubeLink(models.Model):
    """A registered Ray cluster's KubeRay resource, and what the last inspection saw of it."""

    class Kind(models.TextChoices):
        RAYCLUSTER = "RayCluster", "RayCluster"
        RAYSERVICE = "RayService", "RayService (owns the Serve config)"

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="kube_link")
    connection = models.ForeignKey(KubeConnection, on_delete=models.CASCADE, related_name="links")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    inspected_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    partial = models.BooleanField(default=False)
    warnings = JSONField(default=list, blank=True)
    # What the cluster page shows (pods with their limits and restarts, the last OOMKilled, recent
    # Warning events), kept from the last inspection so the page never calls Kubernetes.
    snapshot = JSONField(default=dict, blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["cluster__name"]
        constraints = [
            models.UniqueConstraint(
                fields=["connection", "kind", "namespace", "name"], name="one_link_per_kube_resource"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name} → {self.resource}"

    @property
    def resource(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"
