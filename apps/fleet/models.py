"""Observed state of a cluster's Serve applications, as the last sync saw it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.clusters.models import Cluster
from apps.core.fields import JSONField
from apps.core.sealed import SealedJSONField


class Application(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="applications")
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=32)
    message = models.TextField(blank=True)
    # None is Ray's "no HTTP route", apart from "": the null is Ray's, not a second empty value.
    route_prefix = models.CharField(max_length=300, blank=True, null=True)  # noqa: DJ001
    import_path = models.CharField(max_length=300, blank=True)
    # What was submitted (Ray echoes only the fields that were set).
    deployed_app_config = SealedJSONField(null=True, blank=True)
    last_deployed_time_s = models.FloatField(null=True, blank=True)
    config_hash = models.CharField(max_length=64, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Set when the application disappears from the cluster; history stays.
    removed_at = models.DateTimeField(null=True, blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="one_application_name_per_cluster")]
        # Lists count the applications still there: read off this index alone, not one row each.
        indexes = [models.Index(fields=["cluster"], condition=Q(removed_at__isnull=True), name="application_present")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class Deployment(models.Model):
    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="deployments")
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=32)
    status_trigger = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    # Effective config: every option with Serve's defaults filled in. This is what runs.
    effective_config = SealedJSONField(default=dict, blank=True)
    # What the operator submitted for this deployment (may hold fields Serve ignored).
    submitted_config = SealedJSONField(default=dict, blank=True)
    replica_states = JSONField(default=dict, blank=True)
    running_replicas = models.PositiveIntegerField(default=0)
    target_replicas = models.PositiveIntegerField(null=True, blank=True)

    # Key settings copied out of effective_config so lists and filters need no JSON queries.
    max_ongoing_requests = models.PositiveIntegerField(null=True, blank=True)
    max_queued_requests = models.IntegerField(null=True, blank=True)
    autoscaling_min_replicas = models.PositiveIntegerField(null=True, blank=True)
    autoscaling_max_replicas = models.PositiveIntegerField(null=True, blank=True)
    autoscaling_target_ongoing_requests = models.FloatField(null=True, blank=True)
    num_cpus = models.FloatField(null=True, blank=True)
    num_gpus = models.FloatField(null=True, blank=True)
    # What Ray reserves per replica (CPU, GPU, memory, custom resources).
    required_resources = JSONField(default=dict, blank=True)
    # Serve's autoscaling_detail as last reported (scaling status, recent decisions, metrics
    # health, errors); null when Serve reports none, as the 2.60.0 controller does.
    autoscaling_detail = JSONField(null=True, blank=True)
    # Replicas Ray has not started yet (STARTING, PENDING_*), and since when the oldest of them
    # waits, in Ray's clock (its start_time_s).
    waiting_replicas = models.PositiveIntegerField(default=0)
    waiting_since_s = models.FloatField(null=True, blank=True)
    # What an operator gave for planning an LLM deployment's GPU memory, where Fleetdeck cannot know it:
    # the GPU's memory (an accelerator type it does not know) and the model's config.json.
    llm_gpu_memory_gib = models.FloatField(null=True, blank=True)
    llm_model_config = JSONField(null=True, blank=True)
    # The histogram of request sizes the application exports, as Ray exports it (without "_bucket"),
    # and what it counts: how the deployment page and a calibration's observed mix know the traffic's
    # sizes. A serve.llm deployment needs neither: vLLM counts its prompt and generation tokens.
    size_metric = models.CharField(max_length=200, blank=True)
    size_unit = models.CharField(max_length=16, blank=True)

    first_seen_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    removed_at = models.DateTimeField(null=True, blank=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "application__cluster__team"

    class Meta:
        ordering = ["application__cluster__name", "application__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["application", "name"], name="one_deployment_name_per_application")
        ]
        # Lists count the deployments still there: read off this index alone, not one row each.
        indexes = [
            models.Index(fields=["application"], condition=Q(removed_at__isnull=True), name="deployment_present")
        ]

    def __str__(self) -> str:
        return f"{self.application}/{self.name}"

    @property
    def autoscaling(self) -> bool:
        return self.autoscaling_max_replicas is not None


class ScalingSample(models.Model):
    """Target and running replicas of a deployment, one row each time either changed, so the
    deployment page can chart them over time; an unchanged sync writes none. `decision` holds the
    autoscaler's reason when Serve gave one for the new target."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="scaling_samples")
    observed_at = models.DateTimeField(db_index=True)
    target = models.PositiveIntegerField(null=True, blank=True)
    running = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    decision = JSONField(null=True, blank=True)

    team_path = "deployment__application__cluster__team"

    class Meta:
        ordering = ["deployment", "observed_at", "id"]

    def __str__(self) -> str:
        return f"{self.deployment} @ {self.observed_at:%H:%M:%S}: {self.running}/{self.target}"


class ConfigRevision(models.Model):
    """One row each time an application's deployed config (submitted + effective) changed."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="revisions")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="config_revisions")
    config_hash = models.CharField(max_length=64)
    config = SealedJSONField()
    ray_session = models.CharField(max_length=128, blank=True)
    observed_at = models.DateTimeField(auto_now_add=True, db_index=True)

    # How a row reaches the team that owns it (apps.accounts.access).
    team_path = "cluster__team"

    class Meta:
        ordering = ["-observed_at", "-id"]
        # "Did this revision replace an earlier one of its application?" (an incident's related
        # work asks it of every revision around a page of incidents): one probe of this index.
        indexes = [models.Index(fields=["application", "id"], name="revision_order_per_application")]

    def __str__(self) -> str:
        return f"{self.application} @ {self.observed_at:%Y-%m-%d %H:%M:%S} ({self.config_hash[:8]})"
