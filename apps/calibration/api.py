from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from apps.accounts.audit import Actor
from apps.accounts.drf import as_api_error, require_role
from apps.accounts.models import Role
from apps.accounts.permissions import visible_teams
from apps.calibration import services
from apps.calibration.filters import CalibrationFilter
from apps.calibration.models import MemoryCalibration
from apps.fleet.models import Deployment


class CalibrationSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    per_unit_bytes = serializers.SerializerMethodField(
        help_text="Steepest step of the curve: the most one more request (or token) adds. Null until it succeeded."
    )

    class Meta:
        model = MemoryCalibration
        fields = ["id", "cluster", "cluster_name", "deployment", "application_name", "deployment_name", "submission_id",
                  "state", "axis", "device", "baseline_bytes", "points", "per_unit_bytes", "monotone", "warnings", "levels",
                  "request", "error", "log_tail", "created_by", "created_at", "started_at", "finished_at"]
        read_only_fields = fields

    def get_per_unit_bytes(self, obj) -> int | None:
        if obj.state != MemoryCalibration.State.SUCCEEDED:
            return None
        return services.curve_of(obj).per_unit_bytes


class CalibrateSerializer(serializers.Serializer):
    deployment = serializers.PrimaryKeyRelatedField(queryset=Deployment.objects.select_related("application__cluster__team"))
    levels = serializers.ListField(child=serializers.IntegerField(), required=False,
                                   help_text=f"Concurrency levels to measure, increasing; default {list(services.DEFAULT_LEVELS)}.")
    call = serializers.JSONField(required=False, allow_null=True,
                                 help_text="The one argument each __call__ gets; absent or null: no argument.")


class CalibrationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Memory calibrations: a Ray job that measures a deployment's peak memory at rising
    concurrency. The remediation wizard sizes `max_ongoing_requests` from the latest curve."""

    serializer_class = CalibrationSerializer
    filterset_class = CalibrationFilter
    ordering_fields = ["created_at", "finished_at"]

    def get_queryset(self):
        return (MemoryCalibration.objects.filter(cluster__team__in=visible_teams(self.request.user))
                .select_related("cluster").order_by("-created_at", "-id"))

    @extend_schema(request=CalibrateSerializer, responses={202: CalibrationSerializer})
    def create(self, request, *args, **kwargs):
        """Calibrate a deployment (operator role). Answers 202 with the calibration; poll it until
        its state is final."""
        body = CalibrateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        deployment = body.validated_data["deployment"]
        team = deployment.application.cluster.team
        if team not in visible_teams(request.user):
            raise serializers.ValidationError({"deployment": ["No such deployment."]})
        require_role(request, team, Role.OPERATOR, "calibrate deployments")
        try:
            calibration = services.request_calibration(
                Actor.from_request(request), deployment,
                levels=body.validated_data.get("levels") or services.DEFAULT_LEVELS, call=body.validated_data.get("call"),
            )
        except DjangoValidationError as exc:
            raise as_api_error(exc) from exc
        return Response(CalibrationSerializer(calibration).data, status=status.HTTP_202_ACCEPTED)
