from __future__ import annotations

from django.db.models.manager import BaseManager
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.core.serializer_fields import RedactedJSONField
from apps.fleet import llm, request_sizes
from apps.fleet.filters import ApplicationFilter, ConfigRevisionFilter, DeploymentFilter
from apps.fleet.history import previous_revision, revision_diff
from apps.fleet.models import Application, ConfigRevision, Deployment
from apps.fleet.scaling_history import scaling_series
from apps.incidents.request_sizes import observed as observed_sizes
from apps.remediation.models import Finding
from apps.remediation.rules import WHY_NOT_AT_TARGET
from controlplane.api.pagination import StreamPagination
from controlplane.api.rows import FastRows, narrow
from controlplane.api.versioning import lean_list


class ApplicationSerializer(FastRows, serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    deployed_app_config = RedactedJSONField(allow_null=True)

    class Meta:
        model = Application
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "status",
            "message",
            "route_prefix",
            "import_path",
            "deployed_app_config",
            "last_deployed_time_s",
            "config_hash",
            "first_seen_at",
            "updated_at",
            "removed_at",
        ]


class DeploymentListSerializer(serializers.ListSerializer):
    def to_representation(self, data):
        deployments = list(data.all() if isinstance(data, BaseManager) else data)
        llm.read_for_descriptions(deployments)
        return super().to_representation(deployments)


class DeploymentSerializer(FastRows, serializers.ModelSerializer):
    cluster = serializers.IntegerField(source="application.cluster_id", read_only=True)
    application_name = serializers.CharField(source="application.name", read_only=True)
    llm = serializers.SerializerMethodField(
        help_text="For a serve.llm deployment: the model, TP/PP, accelerator, engine and Serve settings with their "
        "sources, and the GPU memory / KV-cache plan (or what it needs: the model's config.json, the GPU memory); "
        "null for any other deployment."
    )
    effective_config = RedactedJSONField()
    submitted_config = RedactedJSONField()

    class Meta:
        model = Deployment
        list_serializer_class = DeploymentListSerializer
        fields = [
            "id",
            "cluster",
            "application",
            "application_name",
            "name",
            "status",
            "status_trigger",
            "message",
            "replica_states",
            "running_replicas",
            "target_replicas",
            "max_ongoing_requests",
            "max_queued_requests",
            "autoscaling_min_replicas",
            "autoscaling_max_replicas",
            "autoscaling_target_ongoing_requests",
            "num_cpus",
            "num_gpus",
            "required_resources",
            "autoscaling_detail",
            "waiting_replicas",
            "waiting_since_s",
            "effective_config",
            "submitted_config",
            "llm",
            "llm_gpu_memory_gib",
            "size_metric",
            "size_unit",
            "first_seen_at",
            "updated_at",
            "removed_at",
        ]

    def get_llm(self, obj: Deployment) -> dict | None:
        return llm.describe(obj)


# What the detail shows and v2's list leaves out: two configs of each row, and the LLM description
# read from them.
DEPLOYMENT_DETAIL_ONLY = ("effective_config", "submitted_config", "llm")


class DeploymentSummarySerializer(FastRows, serializers.ModelSerializer):
    """A deployment as v2 lists it: every field of the detail but its two configs and the LLM
    description (`llm_gpu_memory_gib` stays)."""

    cluster = serializers.IntegerField(source="application.cluster_id", read_only=True)
    application_name = serializers.CharField(source="application.name", read_only=True)

    class Meta:
        model = Deployment
        fields = [f for f in DeploymentSerializer.Meta.fields if f not in DEPLOYMENT_DETAIL_ONLY]
        read_only_fields = fields


class LLMPlanInputsSerializer(serializers.Serializer):
    gpu_memory_gib = serializers.FloatField(required=False, allow_null=True, min_value=0.001)
    model_config = serializers.DictField(required=False, allow_null=True, help_text="The model's config.json")


class SizeMetricSerializer(serializers.Serializer):
    metric = serializers.CharField(
        allow_blank=True,
        max_length=200,
        help_text="The histogram of request sizes the application exports, as Ray exports it (e.g. ray_request_bytes; "
        'a "_bucket" suffix is dropped). Empty: forget it.',
    )
    unit = serializers.ChoiceField(choices=request_sizes.UNITS, required=False, allow_blank=True)


class ConfigRevisionSerializer(FastRows, serializers.ModelSerializer):
    application_name = serializers.CharField(source="application.name", read_only=True)
    config = RedactedJSONField()

    class Meta:
        model = ConfigRevision
        fields = [
            "id",
            "cluster",
            "application",
            "application_name",
            "config_hash",
            "ray_session",
            "observed_at",
            "config",
        ]


class ApplicationViewSet(viewsets.ReadOnlyModelViewSet):
    """Serve applications as the last sync saw them. Removed applications are hidden unless asked for."""

    serializer_class = ApplicationSerializer
    filterset_class = ApplicationFilter
    ordering_fields = ["name", "status", "updated_at"]

    def get_queryset(self):
        applications = (
            access.visible(self.request.user, Application).select_related("cluster").order_by("cluster__name", "name")
        )
        return narrow(applications, "cluster__name") if self.action == "list" else applications


class DeploymentViewSet(viewsets.ReadOnlyModelViewSet):
    """Serve deployments with their effective and submitted configs and replicas by state. The v2
    list leaves the configs and the LLM description to the detail."""

    serializer_class = DeploymentSerializer
    filterset_class = DeploymentFilter
    ordering_fields = ["name", "status", "updated_at", "max_ongoing_requests"]

    def get_queryset(self):
        deployments = (
            access.visible(self.request.user, Deployment)
            .select_related("application")
            .order_by("application__cluster__name", "application__name", "name")
        )
        if self.action != "list":
            return deployments
        if lean_list(self):
            return narrow(deployments, "application__name", "application__cluster").defer(*DEPLOYMENT_DETAIL_ONLY[:2])
        # The row shows the application's name and cluster; `llm.describe` reads its import path, and
        # the page reads configs only for the rows that could be LLM deployments (DeploymentListSerializer).
        return narrow(deployments, *(f"application__{field}" for field in ("name", "cluster", "import_path")))

    def get_serializer_class(self):
        return DeploymentSummarySerializer if lean_list(self) else DeploymentSerializer

    @extend_schema(
        responses=inline_serializer(
            "DeploymentScaling",
            {
                "series": serializers.DictField(allow_null=True),
                "why_not_at_target": serializers.ListField(child=serializers.DictField()),
            },
        )
    )
    @action(detail=True, methods=["get"])
    def scaling(self, request, pk=None):
        """Target and running replicas over time with the autoscaler's decisions (`series`: times in
        ms; null before the first sample), and the open findings that say why the deployment is
        not at its target, each naming the missing resource and by how much."""
        deployment = self.get_object()
        findings = Finding.objects.filter(
            deployment=deployment, rule__in=WHY_NOT_AT_TARGET, resolved_at__isnull=True
        ).order_by("rule")
        return Response(
            {
                "series": scaling_series(deployment),
                "why_not_at_target": [
                    {
                        "rule": f.rule,
                        "severity": f.severity,
                        "message": f.message,
                        "evidence": f.evidence,
                        "patch": f.patch,
                    }
                    for f in findings
                ],
            }
        )

    @extend_schema(request=LLMPlanInputsSerializer, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"], url_path="llm-inputs", url_name="llminputs")
    def llm_inputs(self, request, pk=None):
        """Give what the LLM memory plan needs and Fleetdeck cannot know: the GPU memory of an accelerator type
        it does not know, and the model's config.json (never downloaded). Both replace what was given; audited."""
        deployment = self.get_object()
        access.demand(request.user, deployment.application.cluster.team, llm.SET_PLAN_INPUTS)
        body = LLMPlanInputsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            llm.set_plan_inputs(
                Actor.from_request(request),
                deployment,
                gpu_memory_gib=body.validated_data.get("gpu_memory_gib"),
                model_config=body.validated_data.get("model_config"),
            )
        except ValueError as exc:
            raise serializers.ValidationError({"detail": str(exc)}) from exc
        return Response(DeploymentSerializer(deployment, context=self.get_serializer_context()).data)

    @extend_schema(request=SizeMetricSerializer, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"], url_path="size-metric", url_name="sizemetric")
    def size_metric(self, request, pk=None):
        """Name the histogram of the deployment's request sizes that its application exports, and its unit;
        the metrics readings then count it per bucket. A serve.llm deployment needs none. Audited."""
        deployment = self.get_object()
        access.demand(request.user, deployment.application.cluster.team, request_sizes.SET_SIZE_METRIC)
        body = SizeMetricSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            request_sizes.set_size_metric(
                Actor.from_request(request),
                deployment,
                metric=body.validated_data["metric"],
                unit=body.validated_data.get("unit", ""),
            )
        except ValueError as exc:
            raise serializers.ValidationError({"metric": str(exc)}) from exc
        return Response(DeploymentSerializer(deployment, context=self.get_serializer_context()).data)

    @extend_schema(
        parameters=[OpenApiParameter("hours", int, description="The span, 1 to 24 hours (default 24).")],
        responses=inline_serializer(
            "RequestSizes",
            {
                "source": serializers.DictField(allow_null=True),
                "hours": serializers.FloatField(),
                "input": serializers.DictField(allow_null=True),
                "output": serializers.DictField(allow_null=True),
            },
        ),
    )
    @action(detail=True, methods=["get"], url_path="request-sizes", url_name="requestsizes")
    def request_sizes(self, request, pk=None):
        """The sizes of the requests the deployment served: where they are counted (`source`), and per side
        (`input`: prompt tokens or the named histogram; `output`: generated tokens) the requests per bucket,
        p50/p90/p99, and the same per reading over time (`t` in seconds). A side with nothing counted is null."""
        deployment = self.get_object()
        try:
            hours = float(request.query_params.get("hours", 24))
        except ValueError:
            hours = -1
        if not 1 <= hours <= 24:
            raise serializers.ValidationError({"hours": "hours: a span of 1 to 24 hours; the window keeps a day."})
        return Response(observed_sizes(deployment, hours=hours))


class ConfigRevisionViewSet(viewsets.ReadOnlyModelViewSet):
    """Every deployed config an application has had, newest first. Read-only: Ray is the source."""

    serializer_class = ConfigRevisionSerializer
    filterset_class = ConfigRevisionFilter
    pagination_class = StreamPagination
    ordering_fields = ["observed_at"]

    def get_queryset(self):
        revisions = (
            access.visible(self.request.user, ConfigRevision)
            .select_related("application")
            .order_by("-observed_at", "-id")
        )
        return narrow(revisions, "application__name") if self.action == "list" else revisions

    @extend_schema(
        parameters=[
            OpenApiParameter("against", int, description="Revision id to compare with; default: the previous one")
        ],
        responses=inline_serializer(
            "RevisionDiff",
            {
                "from_revision": serializers.IntegerField(allow_null=True),
                "to_revision": serializers.IntegerField(),
                "diff": serializers.ListField(child=serializers.CharField()),
            },
        ),
    )
    @action(detail=True, methods=["get"])
    def diff(self, request, pk=None):
        """Unified diff (pretty JSON, sorted keys) between this revision and an earlier one."""
        revision = self.get_object()
        against = request.query_params.get("against")
        if against:
            try:
                old = self.get_queryset().get(pk=int(against), application_id=revision.application_id)
            except (ValueError, ConfigRevision.DoesNotExist) as exc:
                raise NotFound("No revision with that id for the same application.") from exc
        else:
            old = previous_revision(revision)
        return Response(
            {"from_revision": old.pk if old else None, "to_revision": revision.pk, "diff": revision_diff(old, revision)}
        )
