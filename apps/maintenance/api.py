from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import VisiblePrimaryKeyRelatedField
from apps.core.redaction import redact_headers
from apps.core.serializer_fields import RedactedJSONField
from apps.fleet.models import Application, Deployment
from apps.maintenance import dispatch, schedules
from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile
from controlplane.api.pagination import StreamPagination

WINDOW = ["window_days", "window_start_hour", "window_end_hour", "timezone"]


class ScheduleSerializer(serializers.ModelSerializer):
    deployment = VisiblePrimaryKeyRelatedField(queryset=Deployment.objects.all())
    warmup = VisiblePrimaryKeyRelatedField(queryset=WarmupProfile.objects.all(), required=False, allow_null=True)

    class Meta:
        model = RecycleSchedule
        fields = [
            "id",
            "deployment",
            "enabled",
            "every_hours",
            "cron",
            *WINDOW,
            "warmup",
            "next_run_at",
            "last_run_at",
            "created_at",
        ]
        read_only_fields = ["next_run_at", "last_run_at", "created_at"]


class ProfileSerializer(serializers.ModelSerializer):
    application = VisiblePrimaryKeyRelatedField(queryset=Application.objects.all())
    headers = RedactedJSONField(
        redact=redact_headers,
        read_only=False,
        required=False,
        help_text="Sent with every request. Read back with their values redacted, but for the headers that say "
        "how a body is encoded (Content-Type, Accept, …); a redacted value sent back keeps what it stands for.",
    )

    class Meta:
        model = WarmupProfile
        fields = [
            "id",
            "application",
            "name",
            "method",
            "path",
            "headers",
            "body",
            "requests",
            "concurrency",
            "timeout_s",
            "p95_threshold_ms",
            "every_hours",
            *WINDOW,
            "enabled",
            "next_run_at",
            "created_at",
        ]
        read_only_fields = ["next_run_at", "created_at"]


class RunSerializer(serializers.ModelSerializer):
    class Meta:
        model = MaintenanceRun
        fields = [
            "id",
            "kind",
            "trigger",
            "state",
            "cluster",
            "deployment",
            "schedule",
            "profile",
            "slot",
            "change",
            "after",
            "override_guards",
            "override_reason",
            "skip_reason",
            "error",
            "replicas_before",
            "replicas_after",
            "cold_start_s",
            "results",
            "log",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class RecycleRequestSerializer(serializers.Serializer):
    deployment = VisiblePrimaryKeyRelatedField(queryset=Deployment.objects.select_related("application__cluster__team"))
    override_reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=1000,
        help_text="Run despite the guards; recorded in the audit log.",
    )


class ScheduleViewSet(viewsets.ModelViewSet):
    """Recycle schedules, one per deployment: every N hours or a cron, inside a maintenance window."""

    serializer_class = ScheduleSerializer
    filterset_fields = ["deployment", "enabled"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return access.visible(self.request.user, RecycleSchedule).order_by("id")

    def _save(self, serializer, deployment):
        access.demand(self.request.user, deployment.application.cluster.team, schedules.MANAGE)
        data = {k: v for k, v in serializer.validated_data.items() if k != "deployment"}
        serializer.instance = schedules.save_schedule(Actor.from_request(self.request), deployment, data)

    def perform_create(self, serializer):
        self._save(serializer, serializer.validated_data["deployment"])

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance.deployment)

    def perform_destroy(self, instance):
        access.demand(self.request.user, instance.deployment.application.cluster.team, schedules.MANAGE)
        schedules.delete_schedule(Actor.from_request(self.request), instance)


class ProfileViewSet(viewsets.ModelViewSet):
    """Warmup profiles: requests sent to an application's route after recycles, on demand and on a schedule."""

    serializer_class = ProfileSerializer
    filterset_fields = ["application", "enabled"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return access.visible(self.request.user, WarmupProfile).order_by("id")

    def _save(self, serializer, application, profile=None):
        access.demand(self.request.user, application.cluster.team, schedules.MANAGE)
        data = {k: v for k, v in serializer.validated_data.items() if k != "application"}
        serializer.instance = schedules.save_profile(Actor.from_request(self.request), application, data, profile)

    def perform_create(self, serializer):
        self._save(serializer, serializer.validated_data["application"])

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance.application, serializer.instance)

    def perform_destroy(self, instance):
        access.demand(self.request.user, instance.application.cluster.team, schedules.MANAGE)
        schedules.delete_profile(Actor.from_request(self.request), instance)

    @extend_schema(request=None, responses={202: RunSerializer})
    @action(detail=True, methods=["post"])
    def run(self, request, pk=None):
        """Run this warmup now."""
        profile = self.get_object()
        access.demand(request.user, profile.application.cluster.team, dispatch.WARM_UP)
        run = dispatch.request_warmup(Actor.from_request(request), profile)
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Every recycle and warmup: state, replicas before and after, cold start, per-request results, log."""

    serializer_class = RunSerializer
    pagination_class = StreamPagination
    filterset_fields = ["cluster", "deployment", "kind", "state", "trigger"]

    def get_queryset(self):
        return access.visible(self.request.user, MaintenanceRun).order_by("-created_at", "-id")

    @extend_schema(request=RecycleRequestSerializer, responses={202: RunSerializer})
    @action(detail=False, methods=["post"])
    def recycle(self, request):
        """Recycle a deployment now, with the same guards as a schedule (override with a reason)."""
        body = RecycleRequestSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        deployment = body.validated_data["deployment"]
        access.demand(request.user, deployment.application.cluster.team, dispatch.RECYCLE)
        run = dispatch.request_recycle(
            Actor.from_request(request), deployment, override_reason=body.validated_data.get("override_reason", "")
        )
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)
