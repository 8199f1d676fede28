from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts.audit import Actor
from apps.accounts.drf import require_role
from apps.accounts.models import Role
from apps.accounts.permissions import visible_teams
from apps.incidents import services
from apps.incidents.filters import IncidentFilter
from apps.incidents.models import Incident, IncidentEvent, OomKillRecord


class OomKillSerializer(serializers.ModelSerializer):
    class Meta:
        model = OomKillRecord
        fields = ["actor_id", "replica", "node_ip", "used_bytes", "threshold_bytes", "message", "seen_at"]


class EventSerializer(serializers.ModelSerializer):
    author = serializers.CharField(source="author.username", default=None, read_only=True)

    class Meta:
        model = IncidentEvent
        fields = ["kind", "message", "author", "at"]


class IncidentSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    oom_kills = OomKillSerializer(many=True, read_only=True)
    timeline = EventSerializer(many=True, read_only=True)

    class Meta:
        model = Incident
        fields = ["id", "kind", "status", "severity", "title", "cluster", "cluster_name", "application_name", "deployment_name",
                  "deployment", "started_at", "last_signal_at", "resolved_at", "signal_count", "causes", "evidence", "oom_kills", "timeline"]
        read_only_fields = fields


class NoteSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=4000)


class IncidentViewSet(viewsets.ReadOnlyModelViewSet):
    """Incidents with their evidence and ranked suspected causes (playbook ids)."""

    serializer_class = IncidentSerializer
    filterset_class = IncidentFilter

    def get_queryset(self):
        return (Incident.objects.filter(cluster__team__in=visible_teams(self.request.user))
                .select_related("cluster").prefetch_related("oom_kills", "timeline__author").order_by("-last_signal_at", "-id"))

    def _transition(self, request, status):
        incident = self.get_object()
        require_role(request, incident.cluster.team, Role.OPERATOR, "handle incidents")
        try:
            services.set_status(Actor.from_request(request), incident, status)
        except ValueError as exc:
            raise serializers.ValidationError({"detail": [str(exc)]}) from exc
        return Response(IncidentSerializer(self.get_queryset().get(pk=incident.pk)).data)

    @extend_schema(request=None, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        return self._transition(request, Incident.Status.ACKNOWLEDGED)

    @extend_schema(request=None, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None):
        return self._transition(request, Incident.Status.RESOLVED)

    @extend_schema(request=NoteSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def notes(self, request, pk=None):
        incident = self.get_object()
        require_role(request, incident.cluster.team, Role.VIEWER, "comment on incidents")
        body = NoteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.add_note(Actor.from_request(request), incident, body.validated_data["text"])
        return Response(IncidentSerializer(self.get_queryset().get(pk=incident.pk)).data, status=201)
