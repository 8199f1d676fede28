from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import VisiblePrimaryKeyRelatedField
from apps.fleet.models import Deployment
from apps.scaler import comparison, control, services
from apps.scaler.filters import DecisionFilter, ScalerFilter
from apps.scaler.models import Scaler, ScalerDecision
from controlplane.api.pagination import StreamPagination


class ScalerSerializer(serializers.ModelSerializer):
    cluster = serializers.IntegerField(source="deployment.application.cluster_id", read_only=True)
    application_name = serializers.CharField(source="deployment.application.name", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    # Blank until the first change: a plain string, since the schema's enum would not hold "".
    change_purpose = serializers.CharField(
        read_only=True, help_text="What its last change did: activate, deactivate or hand_back; blank: none yet."
    )

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
            "target",
            "change",
            "change_purpose",
            "attention",
        ]
        read_only_fields = fields


class ScalerChangeSerializer(serializers.Serializer):
    change = serializers.IntegerField(help_text="The queued change: follow it at /api/v1/changes/{id}/.")
    scaler = ScalerSerializer()


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
        fields = [
            "id",
            "scaler",
            "at",
            "kind",
            "current",
            "target",
            "reason",
            "inputs",
            "signals_at",
            "applied",
            "error",
        ]
        read_only_fields = fields


class ClientsSerializer(serializers.Serializer):
    seconds = serializers.FloatField(help_text="Seconds spent in this state within the span.")
    requests = serializers.FloatField(help_text="Requests the Serve proxy answered meanwhile.")
    failed = serializers.FloatField(help_text="Of them, answered with an error status.")
    failed_share = serializers.FloatField(allow_null=True)


class ComparisonSerializer(serializers.Serializer):
    """The scaler beside Serve's autoscaler on the deployment's own traffic (apps/scaler/comparison.py)."""

    since = serializers.FloatField(help_text="Unix seconds.")
    until = serializers.FloatField(help_text="Unix seconds.")
    decisions = serializers.IntegerField()
    serve_replica_seconds = serializers.FloatField(help_text="What Serve ran, integrated over the span.")
    scaler_replica_seconds = serializers.FloatField(help_text="What the scaler wanted, integrated over the span.")
    replica_seconds_ratio = serializers.FloatField(allow_null=True, help_text="Scaler's ÷ Serve's.")
    serve_reversals = serializers.IntegerField(help_text="Times Serve's count turned from up to down or back.")
    scaler_reversals = serializers.IntegerField()
    serve_over_ceiling_s = serializers.FloatField(
        help_text="Seconds Serve ran more replicas than the scaler's memory ceiling allows."
    )
    at_ceiling = serializers.IntegerField(help_text="Decisions held at the memory ceiling.")
    hand_backs = serializers.IntegerField()
    ahead = ClientsSerializer(help_text="While the scaler wanted more replicas than Serve ran.")
    level = ClientsSerializer(help_text="While both wanted the same count.")
    behind = ClientsSerializer(help_text="While the scaler wanted fewer.")


class ComparisonQuerySerializer(serializers.Serializer):
    hours = serializers.FloatField(required=False, default=24, min_value=0.1, max_value=comparison.MAX_HOURS)


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

    @extend_schema(request=None, responses={202: ScalerChangeSerializer})
    @action(detail=True, methods=["post"])
    def activate(self, request, pk=None):
        """Hand the deployment's replica count to the scaler (operator role): queues a change that
        sets the application's external_scaler_enabled and a fixed num_replicas; the scaler turns
        active when it succeeds. 400 with the reason when refused (another deployment of the
        application autoscales, a Ray before 2.60), 409 while another change holds the cluster."""
        return self._control(request, control.activate)

    @extend_schema(request=None, responses={202: ScalerChangeSerializer})
    @action(detail=True, methods=["post"])
    def deactivate(self, request, pk=None):
        """Give the count back to Serve's autoscaler (operator role): queues a change that turns
        external_scaler_enabled off and puts back a sized autoscaling_config."""
        return self._control(request, control.deactivate)

    @extend_schema(parameters=[ComparisonQuerySerializer], responses={200: ComparisonSerializer})
    @action(detail=True, methods=["get"])
    def comparison(self, request, pk=None):
        """The scaler beside Serve's autoscaler over the last `hours` (24; at most 168), on the
        deployment's own traffic: replica-seconds and direction reversals of each, and what clients
        got at the proxy while the scaler wanted more replicas than Serve ran, the same, or fewer."""
        query = ComparisonQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        found = comparison.for_scaler(self.get_object(), hours=query.validated_data["hours"])
        return Response(ComparisonSerializer(found.as_dict()).data)

    def _control(self, request, turn):
        scaler = self.get_object()
        access.demand(request.user, scaler.deployment.application.cluster.team, control.CONTROL)
        change = turn(Actor.from_request(request), scaler)
        scaler.refresh_from_db()
        return Response({"change": change.pk, "scaler": ScalerSerializer(scaler).data}, status=status.HTTP_202_ACCEPTED)

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
