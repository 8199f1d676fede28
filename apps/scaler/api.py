from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import VisiblePrimaryKeyRelatedField
from apps.fleet.models import Deployment
from apps.scaler import services
from apps.scaler.filters import DecisionFilter, ScalerFilter
from apps.scaler.models import Scaler, ScalerDecision
from controlplane.api.pagination import StreamPagination


class ScalerSerializer(serializers.ModelSerializer):
    cluster = serializers.IntegerField(source="deployment.application.cluster_id", read_only=True)
    application_name = serializers.CharField(source="deployment.application.name", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)

    class Meta:
        model = Scaler
        fields = [
            "id",
            "deployment",
            "cluster",
            "application_name",
            "deployment_name",
            "mode",
            "min_replicas",
            "max_replicas",
            "latency_objective_ms",
            "concurrency",
            "service_s",
            "created_by",
            "created_at",
            "updated_at",
            "evaluated_at",
        ]
        read_only_fields = fields


class CreateScalerSerializer(serializers.Serializer):
    deployment = VisiblePrimaryKeyRelatedField(queryset=Deployment.objects.select_related("application__cluster__team"))
    mode = serializers.ChoiceField(
        choices=[Scaler.Mode.SHADOW],
        default=Scaler.Mode.SHADOW,
        help_text="Only shadow: the scaler decides and records, and never calls Ray. Turning a scaler active "
        "goes through a change.",
    )
    min_replicas = serializers.IntegerField(min_value=1, default=1)
    max_replicas = serializers.IntegerField(min_value=1, max_value=services.MAX_REPLICAS)
    latency_objective_ms = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="With one, a p99 over it while requests queue asks for one more replica.",
    )
    concurrency = serializers.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="Requests one replica holds; default: the highest level the latest calibration measured, "
        "at most max_ongoing_requests.",
    )
    service_s = serializers.FloatField(
        min_value=0.001,
        required=False,
        allow_null=True,
        help_text="Seconds one request takes at that concurrency; default: the calibration's.",
    )


class DecisionSerializer(serializers.ModelSerializer):
    inputs = serializers.JSONField(
        read_only=True,
        help_text="What the decision read: the stable and panic windows' requests in flight and the replicas "
        "they need, the memory ceiling and why, the signals' age, the policy.",
    )

    class Meta:
        model = ScalerDecision
        fields = ["id", "scaler", "at", "kind", "current", "target", "reason", "inputs", "signals_at", "applied"]
        read_only_fields = fields


class ScalerViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Replica scalers, one per deployment. A shadow scaler decides every sync interval from the
    deployment's signals and calibration what its replica count should be, and records it
    (`/scaler-decisions/`) without scaling anything."""

    serializer_class = ScalerSerializer
    filterset_class = ScalerFilter

    def get_queryset(self):
        return (
            access.visible(self.request.user, Scaler)
            .select_related("deployment__application")
            .order_by("-created_at", "-id")
        )

    @extend_schema(request=CreateScalerSerializer, responses={201: ScalerSerializer})
    def create(self, request, *args, **kwargs):
        """Start a shadow scaler on a deployment (operator role)."""
        body = CreateScalerSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        deployment = data.pop("deployment")
        data.pop("mode")
        access.demand(request.user, deployment.application.cluster.team, services.MANAGE)
        scaler = services.create_shadow_scaler(Actor.from_request(request), deployment, **data)
        return Response(ScalerSerializer(scaler).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        access.demand(self.request.user, instance.deployment.application.cluster.team, services.MANAGE)
        services.delete_scaler(Actor.from_request(self.request), instance)


class DecisionViewSet(viewsets.ReadOnlyModelViewSet):
    """What scalers decided, newest first: in shadow mode what they would have done. Kept for
    FLEETDECK_SCALER_DECISION_DAYS."""

    serializer_class = DecisionSerializer
    pagination_class = StreamPagination
    filterset_class = DecisionFilter

    def get_queryset(self):
        return access.visible(self.request.user, ScalerDecision).order_by("-at", "-id")
