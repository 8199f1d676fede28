"""The rollouts API: one preset applied across clusters in waves. A list reads each rollout's
changes as rows (or, in v2 and with `?changes=counts`, as counts per state); the detail and the
actions embed them."""

from __future__ import annotations

from django.db.models.manager import BaseManager
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import CONFLICT, VisibleSlugRelatedField
from apps.changes import rollouts
from apps.changes.api import with_preset_or_options
from apps.changes.models import Change, Preset, Rollout
from apps.core.serializer_fields import RedactedJSONField
from apps.fleet import client_impact
from controlplane.api.pagination import StreamPagination
from controlplane.api.rows import FastRows
from controlplane.api.versioning import V1, lean_list


class RolloutChangeSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)

    class Meta:
        model = Change
        fields = ["id", "cluster", "cluster_name", "wave", "targets", "state", "error", "client_impact"]

    def to_representation(self, change):
        # The fields above, written out: a page of fleet-wide rollouts embeds thousands of changes,
        # and walking DRF's fields for each cost more than the rest of the page.
        return {
            "id": change.pk,
            "cluster": change.cluster_id,
            "cluster_name": change.cluster.name,
            "wave": change.wave,
            "targets": change.targets,
            "state": change.state,
            "error": change.error,
            "client_impact": client_impact.public(change.client_impact),
        }


class RolloutListSerializer(serializers.ListSerializer):
    """A page of rollouts reads their changes as plain rows in one query (`rollouts.change_rows_seen_by`)
    instead of prefetching them as objects; each rollout writes what the prefetch would have."""

    def to_representation(self, data):
        page = list(data.all() if isinstance(data, BaseManager) else data)
        self.context["change_rows"] = rollouts.change_rows_seen_by(self.context["request"].user, page)
        return super().to_representation(page)


def _change_row(row: dict) -> dict:
    """What `RolloutChangeSerializer` writes, from a row of `rollouts.change_rows_seen_by`."""
    return {
        "id": row["id"],
        "cluster": row["cluster"],
        "cluster_name": row["cluster__name"],
        "wave": row["wave"],
        "targets": row["targets"],
        "state": row["state"],
        "error": row["error"],
        "client_impact": client_impact.public(row["client_impact"]),
    }


class RolloutSerializer(FastRows, serializers.ModelSerializer):
    preset = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    options = RedactedJSONField()
    changes = RolloutChangeSerializer(many=True, read_only=True, help_text="The changes on clusters of your teams.")
    error = serializers.SerializerMethodField(
        help_text="Why the rollout stopped, as far as it concerns clusters of your teams."
    )

    class Meta:
        model = Rollout
        fields = [
            "id",
            "reason",
            "preset",
            "options",
            "selection",
            "state",
            "current_wave",
            "client_error_budget",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "changes",
        ]
        read_only_fields = fields
        list_serializer_class = RolloutListSerializer

    def to_representation(self, rollout):
        rows = self.context.get("change_rows")
        if rows is None or rollout.pk not in rows:
            return super().to_representation(rollout)
        mine = rows[rollout.pk]
        given = {
            "error": rollouts.error_cut_to(rollout, {change["cluster__name"] for change in mine}, len(mine)),
            "changes": [_change_row(change) for change in mine],
        }
        return self.write_row(rollout, given)

    def get_error(self, rollout: Rollout) -> str:
        return rollouts.error_seen_by(rollout)


class RolloutSummaryListSerializer(serializers.ListSerializer):
    def to_representation(self, data):
        page = list(data)
        self.context["summaries"] = rollouts.summaries(self.context["request"].user, page)
        return super().to_representation(page)


class RolloutSummarySerializer(RolloutSerializer):
    """A rollout with its changes as counts per state: the items of v2's list, and of v1's with `?changes=counts`."""

    change_counts = serializers.SerializerMethodField(
        help_text="How many of the changes on clusters of your teams are in each state."
    )

    class Meta(RolloutSerializer.Meta):
        fields = [*(f for f in RolloutSerializer.Meta.fields if f != "changes"), "change_counts"]
        read_only_fields = fields
        list_serializer_class = RolloutSummaryListSerializer

    def get_change_counts(self, rollout: Rollout) -> dict[str, int]:
        return self.context["summaries"][rollout.pk][0]

    def get_error(self, rollout: Rollout) -> str:
        return self.context["summaries"][rollout.pk][1]


class RolloutPlanSerializer(serializers.Serializer):
    selection = serializers.DictField(
        help_text="Filters: team, label (key=value), cluster, application, deployment, uses_gpu."
    )
    preset = VisibleSlugRelatedField(slug_field="slug", queryset=Preset.objects.all(), required=False, allow_null=True)
    options = serializers.JSONField(required=False)
    canary = serializers.CharField(required=False, allow_blank=True, help_text="Cluster name for the first wave.")
    reason = serializers.CharField(max_length=2000)
    client_error_budget = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        help_text="Share of client requests a wave may fail at the proxies before the rollout stops and rolls "
        "that wave back (default 0.001, 0.1 %).",
    )

    def validate(self, data):
        return with_preset_or_options(data)


class RolloutViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Apply one preset to many deployments across clusters: one change per cluster, a canary
    cluster first, the rest after it verified, stopping at the first failure."""

    serializer_class = RolloutSerializer
    filterset_fields = ["state"]
    pagination_class = StreamPagination

    def _counts_only(self) -> bool:
        return lean_list(self) or (self.action == "list" and self.request.query_params.get("changes") == "counts")

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Rollout.objects.none()
        visible = access.visible(self.request.user, Rollout).select_related("preset").order_by("-created_at", "-id")
        # A list reads its changes as rows (RolloutListSerializer); the detail and actions prefetch them.
        return visible if self.action == "list" else rollouts.seen_by(self.request.user, visible)

    def get_serializer_class(self):
        return RolloutSummarySerializer if self._counts_only() else RolloutSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "changes",
                str,
                enum=["counts"],
                description="`counts`: each rollout's changes as counts per state (`change_counts`) instead of "
                "the list of them, whose size grows with the fleet; the detail always lists them. Version 2 lists "
                "rollouts so by default.",
            )
        ],
        responses=PolymorphicProxySerializer(
            "RolloutListItem", serializers=[RolloutSerializer, RolloutSummarySerializer], resource_type_field_name=None
        ),
        versions=[V1],
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=RolloutPlanSerializer, responses={201: RolloutSerializer})
    def create(self, request, *args, **kwargs):
        rollouts.require_may_plan(request.user)
        body = RolloutPlanSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        rollout = rollouts.plan_rollout(
            Actor.from_request(request),
            selection=data["selection"],
            reason=data["reason"],
            preset=data.get("preset"),
            options=data.get("options"),
            canary=data.get("canary") or None,
            client_error_budget=data.get("client_error_budget"),
        )
        return Response(RolloutSerializer(self.get_queryset().get(pk=rollout.pk)).data, status=status.HTTP_201_CREATED)

    def _require_may_run(self, request, rollout: Rollout) -> Rollout:
        """The rollout, unfiltered, once the caller may run it: the one `get_object` returns
        holds only the caller's teams' changes."""
        rollouts.require_may_run(request.user, rollout)
        return Rollout.objects.get(pk=rollout.pk)

    @extend_schema(request=None, responses={202: RolloutSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        rollout = self._require_may_run(request, self.get_object())
        rollouts.start(Actor.from_request(request), rollout)
        return Response(RolloutSerializer(self.get_queryset().get(pk=rollout.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: RolloutSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        rollout = self._require_may_run(request, self.get_object())
        rollouts.cancel(Actor.from_request(request), rollout)
        return Response(RolloutSerializer(self.get_queryset().get(pk=rollout.pk)).data)
