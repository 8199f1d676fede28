from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import CONFLICT, VisibleSlugRelatedField, require_role
from apps.accounts.models import Role, Team
from apps.clusters import services
from apps.clusters.filters import ClusterFilter
from apps.clusters.models import EDITABLE_FIELDS, UPDATABLE_FIELDS, Cluster, ClusterEvent
from apps.clusters.validation import normalize_dashboard_url, normalize_optional_url, validate_labels, validate_token
from apps.fleet.selectors import cluster_listing
from controlplane.api.rows import FastRows, narrow

# What the sync keeps on a cluster for itself; no cluster row shows it.
SYNC_STATE = (
    "serve_controller_start_time",
    "node_resources",
    "node_resources_at",
    "last_change_seen_at",
    "next_sync_at",
    "observed_digest",
    "replica_waiting",
    "created_by",
)


class ClusterSerializer(FastRows, serializers.ModelSerializer):
    team = VisibleSlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    # A plain string so the URL check below explains what is wrong instead of "Enter a valid URL".
    dashboard_url = serializers.CharField(max_length=300)
    token = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=True,
        max_length=4096,
        style={"input_type": "password"},
        help_text="Ray dashboard bearer token (Ray ≥ 2.52 token auth). Stored encrypted; never returned.",
    )
    has_token = serializers.BooleanField(read_only=True)
    dashboard_auth_enabled = serializers.BooleanField(read_only=True, allow_null=True)
    sync_pending = serializers.BooleanField(read_only=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            *EDITABLE_FIELDS,
            "has_token",
            "ray_version",
            "ray_commit",
            "session_name",
            "auth_mode",
            "dashboard_auth_enabled",
            "serve_running",
            "serve_http_port",
            "reachability",
            "last_error",
            "last_error_at",
            "last_sync_at",
            "last_sync_duration_ms",
            "sync_requested_at",
            "sync_pending",
            "application_count",
            "deployment_count",
            "created_at",
        ]
        read_only_fields = [
            "ray_version",
            "ray_commit",
            "session_name",
            "auth_mode",
            "serve_running",
            "serve_http_port",
            "reachability",
            "last_error",
            "last_error_at",
            "last_sync_at",
            "last_sync_duration_ms",
            "sync_requested_at",
            "application_count",
            "deployment_count",
            "created_at",
        ]

    # DRF answers a Django ValidationError from these as the field's errors.
    def validate_dashboard_url(self, value: str) -> str:
        return normalize_dashboard_url(value)

    def _optional_url(self, value: str) -> str:
        return normalize_optional_url(value)

    validate_metrics_url = validate_serve_url = validate_prometheus_url = _optional_url

    def validate_token(self, value: str) -> str:
        return validate_token(value)

    def validate_labels(self, value):
        return validate_labels(value)

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None and not isinstance(self.instance, list):
            fields["name"].read_only = True
        return fields


class ClusterEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ClusterEvent
        fields = ["id", "kind", "message", "created_at"]


def _as_field_errors(exc: DjangoValidationError) -> Exception:
    if isinstance(exc, services.DashboardTaken):
        # A 409 with the message (apps.accounts.drf), not a field error: the URL is fine, its dashboard is taken.
        return exc
    field = "token" if exc.code in ("RayAuthRefused", "TokenNeeded") else "dashboard_url"
    return serializers.ValidationError({field: exc.messages})


class ClusterViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Ray clusters registered with Fleetdeck. Admins of a team register, change and delete its clusters."""

    serializer_class = ClusterSerializer
    filterset_class = ClusterFilter
    ordering_fields = ["name", "last_sync_at", "created_at"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        clusters = cluster_listing(self.request.user)
        if self.action != "list":
            return clusters
        # A row shows its team's slug, and none of what the sync keeps for itself (the nodes'
        # resources, the digest, the schedule).
        return narrow(clusters, "team__slug").defer(*SYNC_STATE)

    def perform_create(self, serializer):
        data = serializer.validated_data
        require_role(self.request, data["team"], Role.ADMIN, "register clusters")
        try:
            serializer.instance = services.register_cluster(
                Actor.from_request(self.request), **{field: data[field] for field in EDITABLE_FIELDS if field in data}
            )
        except DjangoValidationError as exc:
            raise _as_field_errors(exc) from exc
        serializer.instance = self.get_queryset().get(pk=serializer.instance.pk)

    def perform_update(self, serializer):
        cluster = serializer.instance
        require_role(self.request, cluster.team, Role.ADMIN, "change clusters")
        data = serializer.validated_data
        if "team" in data:
            require_role(self.request, data["team"], Role.ADMIN, "move clusters into it")
        changes = {field: data[field] for field in UPDATABLE_FIELDS if field in data}
        try:
            services.update_cluster(Actor.from_request(self.request), cluster, **changes)
        except DjangoValidationError as exc:
            raise _as_field_errors(exc) from exc
        serializer.instance = self.get_queryset().get(pk=cluster.pk)

    def perform_destroy(self, instance):
        require_role(self.request, instance.team, Role.ADMIN, "delete clusters")
        services.delete_cluster(Actor.from_request(self.request), instance)

    @extend_schema(responses={201: ClusterSerializer, 409: CONFLICT})
    def create(self, request, *args, **kwargs):
        """Register a cluster: its URLs must be inside the team's network allow-list, and its
        dashboard must not be registered already (409, naming no other team's cluster)."""
        return super().create(request, *args, **kwargs)

    @extend_schema(responses={200: ClusterSerializer, 409: CONFLICT})
    def partial_update(self, request, *args, **kwargs):
        """Change a cluster. A dashboard URL of another host or port needs its token again."""
        return super().partial_update(request, *args, **kwargs)

    @extend_schema(request=None, responses={202: ClusterSerializer})
    @action(detail=True, methods=["post"])
    def sync(self, request, pk=None):
        """Queue a sync now. Answers 202; `sync_pending` turns false when the worker is done."""
        cluster = self.get_object()
        access.demand(request.user, cluster.team, services.SYNC)
        services.request_sync(Actor.from_request(request), cluster)
        return Response(
            self.get_serializer(self.get_queryset().get(pk=cluster.pk)).data, status=status.HTTP_202_ACCEPTED
        )

    @extend_schema(responses={200: OpenApiResponse(ClusterEventSerializer(many=True))})
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        """Restarts, reachability changes and registration, newest first."""
        page = self.paginate_queryset(self.get_object().events.all())
        return self.get_paginated_response(ClusterEventSerializer(page, many=True).data)
