from rest_framework import serializers, viewsets

from apps.accounts import access
from apps.accounts.models import AuditEvent
from apps.core.redaction import redact_anywhere
from apps.core.serializer_fields import RedactedJSONField
from controlplane.api.pagination import StreamPagination
from controlplane.api.rows import FastRows, narrow


class AuditEventSerializer(FastRows, serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    # Entries written before `record` redacted them may hold a config or a request.
    changes = RedactedJSONField(redact=redact_anywhere)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor_name",
            "action",
            "team",
            "object_type",
            "object_id",
            "object_repr",
            "changes",
            "source_ip",
            "via",
        ]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log. Admins see their teams' events and their own; superusers see everything."""

    serializer_class = AuditEventSerializer
    pagination_class = StreamPagination
    filterset_fields = ["action", "object_type", "object_id", "via"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return AuditEvent.objects.none()
        events = access.visible(self.request.user, AuditEvent).select_related("team").order_by("-created_at", "-id")
        return narrow(events, "team__slug") if self.action == "list" else events
