from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Prefetch
from django.db.models.manager import BaseManager
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import VisibleSlugRelatedField, require_role
from apps.accounts.models import Role, Team
from apps.incidents import actions, webhooks
from apps.incidents.filters import IncidentFilter
from apps.incidents.models import Incident, IncidentEvent, OomKillRecord, PodKillRecord, Webhook, WebhookDelivery
from apps.incidents.timeline import related_work, related_work_for
from controlplane.api.lean import lean
from controlplane.api.pagination import StreamPagination
from controlplane.api.rows import FastRows, narrow
from controlplane.api.versioning import V1, lean_list

RECENT_DELIVERIES = 10


class OomKillSerializer(FastRows, serializers.ModelSerializer):
    class Meta:
        model = OomKillRecord
        fields = [
            "actor_id",
            "replica",
            "killed_deployment",
            "node_ip",
            "used_bytes",
            "threshold_bytes",
            "message",
            "seen_at",
        ]


class PodKillSerializer(FastRows, serializers.ModelSerializer):
    class Meta:
        model = PodKillRecord
        fields = [
            "namespace",
            "pod",
            "container",
            "node",
            "exit_code",
            "finished_at",
            "restart_count",
            "memory_limit_bytes",
            "ray_memory_bytes",
            "seen_at",
        ]


class EventSerializer(FastRows, serializers.ModelSerializer):
    author = serializers.CharField(source="author.username", default=None, read_only=True, allow_null=True)

    class Meta:
        model = IncidentEvent
        fields = ["kind", "message", "author", "at"]


class IncidentListSerializer(serializers.ListSerializer):
    def to_representation(self, data):
        incidents = list(data.all() if isinstance(data, BaseManager) else data)
        self.context["related_work"] = related_work_for(incidents)
        return super().to_representation(incidents)


class IncidentSerializer(FastRows, serializers.ModelSerializer):
    """An incident with everything about it, as the detail and the default list show it. A page of
    these costs several times a page of `IncidentSummarySerializer` (`?view=summary`)."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    related_work = serializers.SerializerMethodField(
        help_text="What happened around the incident: changes, maintenance runs, cluster and Serve controller "
        "restarts, and config revisions Fleetdeck did not make (kind change, maintenance, cluster_restart, "
        "controller_restart, config_revision)."
    )
    oom_kills = OomKillSerializer(many=True, read_only=True)
    pod_kills = PodKillSerializer(
        many=True, read_only=True, help_text="Kernel OOM kills of Ray containers, as Kubernetes reported them."
    )
    timeline = EventSerializer(many=True, read_only=True)

    class Meta:
        model = Incident
        fields = [
            "id",
            "kind",
            "status",
            "severity",
            "title",
            "cluster",
            "cluster_name",
            "application_name",
            "deployment_name",
            "deployment",
            "node_ip",
            "started_at",
            "last_signal_at",
            "resolved_at",
            "signal_count",
            "causes",
            "evidence",
            "oom_kills",
            "pod_kills",
            "timeline",
            "related_work",
        ]
        read_only_fields = fields
        list_serializer_class = IncidentListSerializer
        # Filled by IncidentViewSet's prefetches (plain lists); without them, read from the relations.
        prefetched_as = {"oom_kills": "oom_kill_rows", "pod_kills": "pod_kill_rows", "timeline": "timeline_rows"}

    def get_related_work(self, obj) -> list[dict]:
        by_incident = self.context.get("related_work") or {}
        items = by_incident[obj.pk] if obj.pk in by_incident else related_work(obj)
        return [{**item, "at": item["at"].isoformat()} for item in items]


# What the default list and the detail show and a summary row leaves out: reading them costs five
# queries a page and most of its Python time (the related work reads every change, run, event and
# revision of the page's clusters).
HEAVY_FIELDS = ("evidence", "oom_kills", "pod_kills", "timeline", "related_work")


class IncidentSummarySerializer(FastRows, serializers.ModelSerializer):
    """An incident as `incidents?view=summary` lists it: every field of the default list but the
    heavy ones (`evidence`, `oom_kills`, `pod_kills`, `timeline`, `related_work`), which the detail
    (`incidents/ID/`) always has. The items of v2's list; v1 lists them so with `?view=summary` and
    keeps its default list's shape."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)

    class Meta:
        model = Incident
        fields = [f for f in IncidentSerializer.Meta.fields if f not in HEAVY_FIELDS]
        read_only_fields = fields


class NoteSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=4000)


class IncidentViewSet(viewsets.ReadOnlyModelViewSet):
    """Incidents with their evidence and ranked suspected causes (playbook ids). The v2 list (and
    v1's `?view=summary`) shows them without the evidence, kills, timeline and related work."""

    serializer_class = IncidentSerializer
    filterset_class = IncidentFilter
    pagination_class = StreamPagination

    def _summary(self) -> bool:
        return lean_list(self) or (self.action == "list" and self.request.query_params.get("view") == "summary")

    def get_queryset(self):
        incidents = access.visible(self.request.user, Incident).order_by("-last_signal_at", "-id")
        incidents = incidents.select_related("cluster")
        if self._summary():
            return narrow(incidents, "cluster__name").defer("evidence")
        incidents = incidents.prefetch_related(
            Prefetch("oom_kills", lean(OomKillRecord.objects.all()), to_attr="oom_kill_rows"),
            Prefetch("pod_kills", lean(PodKillRecord.objects.all()), to_attr="pod_kill_rows"),
            Prefetch("timeline", lean(IncidentEvent.objects.select_related("author")), to_attr="timeline_rows"),
        )
        return narrow(incidents, "cluster__name") if self.action == "list" else incidents

    def get_serializer_class(self):
        return IncidentSummarySerializer if self._summary() else IncidentSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "view",
                str,
                enum=["summary"],
                description="`summary`: each incident without `evidence`, `oom_kills`, `pod_kills`, `timeline` and "
                "`related_work`, several times cheaper a page; the detail always has them. Version 2 lists "
                "incidents so by default.",
            )
        ],
        responses=PolymorphicProxySerializer(
            "IncidentListItem",
            serializers=[IncidentSerializer, IncidentSummarySerializer],
            resource_type_field_name=None,
        ),
        versions=[V1],
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def _transition(self, request, status):
        incident = self.get_object()
        access.demand(request.user, incident.cluster.team, actions.HANDLE)
        try:
            actions.set_status(Actor.from_request(request), incident, status)
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

    @extend_schema(request=NoteSerializer, responses={201: IncidentSerializer})
    @action(detail=True, methods=["post"])
    def notes(self, request, pk=None):
        incident = self.get_object()
        require_role(request, incident.cluster.team, Role.VIEWER, "comment on incidents")
        body = NoteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        actions.add_note(Actor.from_request(request), incident, body.validated_data["text"])
        return Response(IncidentSerializer(self.get_queryset().get(pk=incident.pk)).data, status=201)


class ShownURLField(serializers.CharField):
    """A webhook's full URL on the way in (`webhooks.save_webhook` checks it); on the way out only
    its scheme and host, `Webhook.url_shown`, which is no URL to call: hence no `uri` format."""

    def get_attribute(self, instance):
        return instance.url_shown


class WebhookSerializer(serializers.ModelSerializer):
    team = VisibleSlugRelatedField(slug_field="slug", queryset=Team.objects.all())
    url = ShownURLField(
        max_length=500,
        help_text="The endpoint. Stored encrypted, as Slack-style URLs carry their secret in the path; answers show "
        "only its scheme and host (`https://hooks.slack.com/…`).",
    )
    secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="Signs each body: header X-Fleetdeck-Signature: sha256=<HMAC>. Stored encrypted, never returned.",
    )
    has_secret = serializers.SerializerMethodField()
    recent_deliveries = serializers.SerializerMethodField()

    class Meta:
        model = Webhook
        fields = ["id", "team", "kind", "url", "secret", "has_secret", "enabled", "created_at", "recent_deliveries"]
        read_only_fields = ["created_at"]

    def get_has_secret(self, obj) -> bool:
        return bool(obj.secret_ciphertext)

    def get_recent_deliveries(self, obj) -> list[dict]:
        return [
            {
                "incident": d.incident_id,
                "event": d.event,
                "state": d.state,
                "attempts": d.attempts,
                "last_status": d.last_status,
                "last_error": d.last_error,
            }
            for d in self._recent(obj)
        ]

    def _recent(self, obj) -> list:
        # Prefetched for lists; a webhook just saved has no prefetch.
        if hasattr(obj, "recent_deliveries"):
            return obj.recent_deliveries
        return list(obj.deliveries.order_by("-created_at", "-id")[:RECENT_DELIVERIES])


class WebhookViewSet(viewsets.ModelViewSet):
    """Per-team webhooks for incidents as they open and resolve: Fleetdeck's JSON (`kind: json`), an
    Alertmanager's alerts API (`alertmanager`: the URL is Alertmanager's base; open incidents are
    re-sent, resolved ones end) or a Slack incoming webhook (`slack`). Retried with backoff on 5xx,
    429 and timeouts."""

    serializer_class = WebhookSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Webhook.objects.none()
        # Sliced prefetch (a window function): one query for the page, not one per webhook.
        recent = Prefetch(
            "deliveries",
            queryset=WebhookDelivery.objects.order_by("-created_at", "-id")[:RECENT_DELIVERIES],
            to_attr="recent_deliveries",
        )
        return (
            access.visible(self.request.user, Webhook, role=Role.ADMIN)
            .select_related("team")
            .prefetch_related(recent)
            .order_by("id")
        )

    def _save(self, serializer, team, webhook=None):
        require_role(self.request, team, Role.ADMIN, "manage webhooks")
        data = serializer.validated_data
        try:
            serializer.instance = webhooks.save_webhook(
                Actor.from_request(self.request),
                team=team,
                url=data.get("url"),
                secret=data.get("secret", ""),
                enabled=data.get("enabled", webhook.enabled if webhook else True),
                kind=data.get("kind"),
                webhook=webhook,
            )
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"url": exc.messages}) from exc

    def perform_create(self, serializer):
        self._save(serializer, serializer.validated_data["team"])

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance.team, serializer.instance)
