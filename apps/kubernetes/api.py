from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import VisiblePrimaryKeyRelatedField, VisibleSlugRelatedField
from apps.accounts.models import Team
from apps.clusters.api import ClusterSerializer
from apps.clusters.models import Cluster
from apps.clusters.validation import normalize_dashboard_url, validate_labels, validate_token
from apps.fleet.selectors import cluster_listing
from apps.kubernetes import discovery, services
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.kubernetes.validation import validate_cluster_name, validate_namespaces


def _django_errors(check, value):
    try:
        return check(value)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.messages) from exc


class KubeConnectionSerializer(serializers.ModelSerializer):
    team = VisibleSlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    kubeconfig = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=256 * 1024,
        style={"base_template": "textarea.html"},
        help_text="A kubeconfig (YAML) with a token or client certificate, inline (token, *-data); credential "
        "plugins, file paths and proxy-url are refused. Stored encrypted, never returned. On update, empty keeps "
        "the stored one.",
    )
    has_kubeconfig = serializers.BooleanField(read_only=True)
    namespaces = serializers.ListField(
        child=serializers.CharField(max_length=63),
        allow_empty=False,
        help_text="The only namespaces Fleetdeck lists RayClusters and RayServices in.",
    )
    link_count = serializers.IntegerField(read_only=True, help_text="Clusters linked through this connection.")

    class Meta:
        model = KubeConnection
        fields = [
            "id",
            "name",
            "team",
            "in_cluster",
            "kubeconfig",
            "has_kubeconfig",
            "context",
            "namespaces",
            "read_only",
            "last_checked_at",
            "last_error",
            "last_warnings",
            "link_count",
            "created_at",
        ]
        read_only_fields = ["last_checked_at", "last_error", "last_warnings", "created_at"]
        extra_kwargs = {
            "in_cluster": {
                "help_text": "Use Fleetdeck's own service account. Superusers only (403 for others): it "
                "can read every team's namespaces."
            }
        }

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None and not isinstance(self.instance, list):
            for name in ("name", "team", "in_cluster"):
                fields[name].read_only = True
        return fields

    def validate_namespaces(self, value):
        return _django_errors(validate_namespaces, value)


class KubeLinkSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    connection_name = serializers.CharField(source="connection.name", read_only=True)
    snapshot = serializers.JSONField(
        read_only=True,
        help_text="From the last inspection: resource (state, active RayCluster), pods (memory request/limit, CPU, "
        "GPUs, restarts, last termination, Ray's memory), pod_count, last_oomkilled, events (recent Warning events).",
    )

    class Meta:
        model = KubeLink
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "connection",
            "connection_name",
            "kind",
            "namespace",
            "name",
            "inspected_at",
            "last_error",
            "partial",
            "warnings",
            "snapshot",
            "created_at",
        ]
        read_only_fields = fields


class FoundSerializer(serializers.Serializer):
    kind = serializers.CharField()
    namespace = serializers.CharField()
    name = serializers.CharField()
    dashboard_url = serializers.CharField(
        help_text="KubeRay's head service (a RayService's follows its active RayCluster)."
    )
    ray_version = serializers.CharField()
    state = serializers.CharField()
    ray_cluster = serializers.CharField(help_text="A RayService's active RayCluster.")
    applications = serializers.ListField(child=serializers.CharField())
    serve_config_error = serializers.CharField()
    linked_cluster_id = serializers.IntegerField(allow_null=True)
    linked_cluster_name = serializers.CharField()


class DiscoverySerializer(serializers.Serializer):
    resources = FoundSerializer(many=True)
    partial = serializers.BooleanField(
        help_text="Some namespaces could not be listed, or the cap was reached: see warnings."
    )
    warnings = serializers.ListField(child=serializers.CharField())
    error = serializers.CharField(
        help_text="Set when nothing could be listed (credentials, CRDs not installed, unreachable)."
    )


class ResourceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=KubeLink.Kind.choices)
    namespace = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=253)


class RegisterSerializer(ResourceSerializer):
    cluster_name = serializers.CharField(max_length=63)
    dashboard_url = serializers.CharField(
        max_length=300, required=False, allow_blank=True, help_text="Empty: the head service KubeRay created."
    )
    token = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=4096,
        help_text="Ray dashboard token, when the cluster has token authentication. Stored encrypted.",
    )
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)

    def validate_cluster_name(self, value):
        return _django_errors(validate_cluster_name, value)

    def validate_dashboard_url(self, value):
        return _django_errors(normalize_dashboard_url, value) if value else ""

    def validate_token(self, value):
        return _django_errors(validate_token, value)

    def validate_labels(self, value):
        return _django_errors(validate_labels, value)


class LinkSerializer(ResourceSerializer):
    cluster = VisiblePrimaryKeyRelatedField(queryset=Cluster.objects.all())


class KubeConnectionViewSet(viewsets.ModelViewSet):
    """Connections to Kubernetes API servers, per team: a kubeconfig context or the in-cluster
    service account, the namespaces to look in, and whether RayService writes are allowed.
    Team admins add, change and delete them; only superusers use the in-cluster service account."""

    serializer_class = KubeConnectionSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    ordering_fields = ["name", "last_checked_at", "created_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return KubeConnection.objects.none()
        return (
            KubeConnection.objects.visible_to(self.request.user)
            .select_related("team")
            .annotate(link_count=Count("links"))
            .order_by("team__name", "name")
        )

    def perform_create(self, serializer):
        data = serializer.validated_data
        access.demand(self.request.user, data["team"], services.ADD_CONNECTION)
        connection = services.create_connection(
            Actor.from_request(self.request),
            team=data["team"],
            name=data["name"],
            namespaces=data["namespaces"],
            in_cluster=data.get("in_cluster", False),
            kubeconfig=data.get("kubeconfig", ""),
            context=data.get("context", ""),
            read_only=data.get("read_only", True),
        )
        serializer.instance = self.get_queryset().get(pk=connection.pk)

    def perform_update(self, serializer):
        connection = serializer.instance
        access.demand(self.request.user, connection.team, services.CHANGE_CONNECTION)
        data = serializer.validated_data
        changes = {key: data[key] for key in ("kubeconfig", "context", "namespaces", "read_only") if key in data}
        services.update_connection(Actor.from_request(self.request), connection, **changes)
        serializer.instance = self.get_queryset().get(pk=connection.pk)

    def perform_destroy(self, instance):
        access.demand(self.request.user, instance.team, services.DELETE_CONNECTION)
        services.delete_connection(Actor.from_request(self.request), instance)

    @extend_schema(responses=DiscoverySerializer)
    @action(detail=True, methods=["get"])
    def discovery(self, request, pk=None):
        """The RayClusters and RayServices the connection sees in its namespaces now (a RayCluster a
        RayService owns is listed under its RayService). `partial` with `warnings` when a namespace
        is forbidden or the cap was reached; `error` when nothing could be listed."""
        found = discovery.discover(self.get_object())
        return Response(DiscoverySerializer(found).data)

    @extend_schema(request=RegisterSerializer, responses={201: ClusterSerializer})
    @action(detail=True, methods=["post"])
    def register(self, request, pk=None):
        """Register a discovered resource as a Fleetdeck cluster of the connection's team, linked to
        it (a RayService makes the cluster RayService-owned). The usual connection test applies."""
        connection = self.get_object()
        access.demand(request.user, connection.team, services.REGISTER)
        body = RegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = services.register_discovered(Actor.from_request(request), connection, **body.validated_data)
        data = ClusterSerializer(cluster_listing(request.user).get(pk=cluster.pk)).data
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=LinkSerializer, responses={201: KubeLinkSerializer})
    @action(detail=True, methods=["post"])
    def link(self, request, pk=None):
        """Link a registered cluster of the connection's team to a RayCluster or RayService."""
        connection = self.get_object()
        access.demand(request.user, connection.team, services.LINK)
        body = LinkSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        link = services.link_cluster(
            Actor.from_request(request),
            connection,
            data["cluster"],
            kind=data["kind"],
            namespace=data["namespace"],
            name=data["name"],
        )
        return Response(KubeLinkSerializer(link).data, status=status.HTTP_201_CREATED)


class KubeLinkViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Clusters linked to a KubeRay resource, with what the last inspection (after each sync) saw:
    pods with their limits and restarts, the last OOMKilled, Warning events, partial results."""

    serializer_class = KubeLinkSerializer
    filterset_fields = ["cluster", "connection", "kind"]
    ordering_fields = ["inspected_at", "created_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return KubeLink.objects.none()
        return (
            access.visible(self.request.user, KubeLink)
            .select_related("cluster__team", "connection")
            .order_by("cluster__name")
        )

    def perform_destroy(self, instance):
        access.demand(self.request.user, instance.cluster.team, services.UNLINK)
        services.unlink(Actor.from_request(self.request), instance)

    @extend_schema(request=None, responses={202: KubeLinkSerializer})
    @action(detail=True, methods=["post"])
    def inspect(self, request, pk=None):
        """Queue a Kubernetes inspection now (it also runs after every sync). Answers 202."""
        link = self.get_object()
        access.demand(request.user, link.cluster.team, services.INSPECT)
        services.request_inspection(Actor.from_request(request), link)
        return Response(self.get_serializer(link).data, status=status.HTTP_202_ACCEPTED)
