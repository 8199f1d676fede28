from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts.audit import Actor
from apps.accounts.drf import require_role
from apps.accounts.models import Role
from apps.accounts.permissions import visible_teams
from apps.remediation import findings
from apps.remediation.models import Finding
from apps.remediation.rules import BY_ID


class FindingFilter(django_filters.FilterSet):
    cluster = django_filters.NumberFilter(field_name="cluster_id")
    open = django_filters.BooleanFilter(field_name="resolved_at", lookup_expr="isnull", label="Still firing")
    muted = django_filters.BooleanFilter(field_name="muted_at", lookup_expr="isnull", exclude=True, label="Muted")

    class Meta:
        model = Finding
        fields = ["cluster", "rule", "severity", "application_name", "deployment_name", "open", "muted"]


class FindingSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    title = serializers.SerializerMethodField()
    why = serializers.SerializerMethodField()
    remedy = serializers.SerializerMethodField()

    class Meta:
        model = Finding
        fields = ["id", "cluster", "cluster_name", "application_name", "deployment_name", "deployment", "rule", "title", "severity",
                  "why", "remedy", "evidence", "patch", "action", "first_seen_at", "resolved_at", "muted_at", "mute_reason"]
        read_only_fields = fields

    def get_title(self, obj) -> str:
        return BY_ID[obj.rule].title

    def get_why(self, obj) -> str:
        return BY_ID[obj.rule].why

    def get_remedy(self, obj) -> str:
        return BY_ID[obj.rule].remedy


class MuteSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000)


class FindingViewSet(viewsets.ReadOnlyModelViewSet):
    """Config lint recomputed on every sync: what each deployment violates, why, and the patch.
    Open findings by default (`open=false` for history)."""

    serializer_class = FindingSerializer
    filterset_class = FindingFilter

    def get_queryset(self):
        queryset = Finding.objects.filter(cluster__team__in=visible_teams(self.request.user)).select_related("cluster")
        if "open" not in self.request.query_params:
            queryset = queryset.filter(resolved_at__isnull=True)
        return queryset.order_by("rule", "cluster__name", "application_name", "deployment_name", "id")

    @extend_schema(request=MuteSerializer, responses=FindingSerializer)
    @action(detail=True, methods=["post"])
    def mute(self, request, pk=None):
        finding = self.get_object()
        require_role(request, finding.cluster.team, Role.OPERATOR, "mute findings")
        body = MuteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(FindingSerializer(findings.mute(Actor.from_request(request), finding, body.validated_data["reason"])).data)

    @extend_schema(request=None, responses=FindingSerializer)
    @action(detail=True, methods=["post"])
    def unmute(self, request, pk=None):
        finding = self.get_object()
        require_role(request, finding.cluster.team, Role.OPERATOR, "unmute findings")
        return Response(FindingSerializer(findings.unmute(Actor.from_request(request), finding)).data)
