from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import F, Prefetch
from django.db.models.manager import BaseManager
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import CONFLICT, VisiblePrimaryKeyRelatedField, VisibleSlugRelatedField, require_role
from apps.accounts.models import Role, Team
from apps.changes import presets, protocol, rollouts
from apps.changes.filters import ChangeFilter
from apps.changes.models import Change, ChangeStep, Preset, Rollout
from apps.changes.validation import parse_options_text, preset_or_options, validate_options
from apps.clusters.models import Cluster
from apps.fleet import client_impact
from apps.fleet.models import ConfigRevision
from controlplane.lean import lean
from controlplane.pagination import StreamPagination
from controlplane.rows import FastRows, narrow
from controlplane.versioning import V1, lean_list


class PresetSerializer(serializers.ModelSerializer):
    team = VisibleSlugRelatedField(slug_field="slug", queryset=Team.objects.all(), required=False, allow_null=True)
    remedies = serializers.ListField(
        child=serializers.CharField(max_length=16), required=False, help_text="Playbook remedy ids, e.g. R1, R2."
    )

    class Meta:
        model = Preset
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "options",
            "remedies",
            "builtin",
            "team",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["slug", "builtin", "created_at", "updated_at"]

    def validate_options(self, value):
        return validate_options(value)


class CloneSerializer(serializers.Serializer):
    team = VisibleSlugRelatedField(
        slug_field="slug", queryset=Team.objects.all(), help_text="The team that gets the copy."
    )
    name = serializers.CharField(
        max_length=120, required=False, allow_blank=True, help_text="Default: the source's name with (copy)."
    )


class PresetViewSet(viewsets.ModelViewSet):
    """Tuning presets: built-ins from the playbook (read-only) and your teams' own."""

    serializer_class = PresetSerializer
    filterset_fields = ["builtin", "team__slug"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return access.visible(self.request.user, Preset).select_related("team").order_by("-builtin", "name")

    def perform_create(self, serializer):
        team = serializer.validated_data.get("team")
        if team is None:
            raise serializers.ValidationError({"team": ["A custom preset belongs to a team."]})
        require_role(self.request, team, Role.OPERATOR, "create presets")
        data = serializer.validated_data
        serializer.instance = presets.create_preset(
            Actor.from_request(self.request),
            team=team,
            name=data["name"],
            description=data.get("description", ""),
            options=data["options"],
            remedies=data.get("remedies", []),
        )

    def perform_update(self, serializer):
        preset = serializer.instance
        if preset.builtin:
            raise serializers.ValidationError({"detail": ["Built-in presets are read-only; clone one to adapt it."]})
        require_role(self.request, preset.team, Role.OPERATOR, "edit presets")
        fields = {
            k: v for k, v in serializer.validated_data.items() if k in ("name", "description", "options", "remedies")
        }
        presets.update_preset(Actor.from_request(self.request), preset, **fields)

    def perform_destroy(self, instance):
        if instance.builtin:
            raise serializers.ValidationError({"detail": ["Built-in presets cannot be deleted."]})
        require_role(self.request, instance.team, Role.OPERATOR, "delete presets")
        presets.delete_preset(Actor.from_request(self.request), instance)

    @extend_schema(request=CloneSerializer, responses={201: PresetSerializer})
    @action(detail=True, methods=["post"])
    def clone(self, request, pk=None):
        """Copy a preset (built-in or custom) into one of your teams, to adapt it."""
        source = self.get_object()
        body = CloneSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        team = body.validated_data["team"]
        require_role(request, team, Role.OPERATOR, "create presets")
        clone = presets.clone_preset(
            Actor.from_request(request), source, team=team, name=body.validated_data.get("name") or None
        )
        return Response(PresetSerializer(clone).data, status=status.HTTP_201_CREATED)


class ChangeStepSerializer(FastRows, serializers.ModelSerializer):
    class Meta:
        model = ChangeStep
        fields = ["at", "state", "message"]


class ChangeSerializer(FastRows, serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    preset = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None, allow_null=True)
    applied_by = serializers.CharField(source="applied_by.username", read_only=True, default=None, allow_null=True)
    steps = ChangeStepSerializer(many=True, read_only=True)
    client_impact = serializers.SerializerMethodField(
        help_text="What clients saw at the proxy while the change ran: requests, failed, share, and per "
        "application the failures by HTTP code; `measured` false with `why` when the proxy could not be read, "
        "`measuring` while the change runs."
    )

    class Meta:
        model = Change
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "kind",
            "targets",
            "patch",
            "preset",
            "restores",
            "reason",
            "state",
            "ray_version",
            "base_hash",
            "new_hash",
            "json_patch",
            "warnings",
            "drift",
            "error",
            "created_by",
            "applied_by",
            "created_at",
            "started_at",
            "pushed_at",
            "verified_at",
            "finished_at",
            "client_impact",
            "steps",
        ]
        read_only_fields = fields
        # Filled by ChangeViewSet's prefetch (a plain list); without it, read from the relation.
        prefetched_as = {"steps": "step_rows"}

    def get_client_impact(self, change: Change) -> dict:
        return client_impact.public(change.client_impact)


# What the detail shows and v2's list leaves out: the steps cost a query and most of a row's writing,
# and the patch, warnings and drift grow with the config.
CHANGE_DETAIL_ONLY = ("steps", "json_patch", "warnings", "drift")


class ChangeSummarySerializer(ChangeSerializer):
    """A change as v2 lists it: every field of the detail but the steps, the JSON patch, the
    warnings and the drift. The names of its related rows are read from the values the list
    annotates (`ChangeViewSet.get_queryset`), so a page builds no cluster, preset or user."""

    cluster_name = serializers.CharField(read_only=True)
    preset = serializers.CharField(source="preset_slug", read_only=True, allow_null=True)
    created_by = serializers.CharField(source="created_by_name", read_only=True, allow_null=True)
    applied_by = serializers.CharField(source="applied_by_name", read_only=True, allow_null=True)

    class Meta(ChangeSerializer.Meta):
        fields = [f for f in ChangeSerializer.Meta.fields if f not in CHANGE_DETAIL_ONLY]
        read_only_fields = fields


def _with_preset_or_options(data: dict) -> dict:
    try:
        preset_or_options(data.get("preset"), data.get("options"))
    except DjangoValidationError as exc:
        raise serializers.ValidationError({"options": exc.messages}) from exc
    return data


class TargetSerializer(serializers.Serializer):
    application = serializers.CharField(max_length=200)
    deployment = serializers.CharField(max_length=200)


class PlanSerializer(serializers.Serializer):
    cluster = VisiblePrimaryKeyRelatedField(queryset=Cluster.objects.all())
    targets = TargetSerializer(many=True, allow_empty=False)
    preset = VisibleSlugRelatedField(slug_field="slug", queryset=Preset.objects.all(), required=False, allow_null=True)
    options = serializers.JSONField(required=False, help_text="Deployment options as an object.")
    options_text = serializers.CharField(
        required=False, allow_blank=True, help_text="Deployment options as YAML or JSON text."
    )
    reason = serializers.CharField(max_length=2000)

    def validate(self, data):
        if data.get("options_text"):
            try:
                data["options"] = parse_options_text(data.pop("options_text"))
            except DjangoValidationError as exc:
                raise serializers.ValidationError({"options_text": exc.messages}) from exc
        return _with_preset_or_options(data)


class RestoreSerializer(serializers.Serializer):
    revision = VisiblePrimaryKeyRelatedField(
        queryset=ConfigRevision.objects.select_related("application", "cluster__team")
    )
    reason = serializers.CharField(max_length=2000)


class NewApplicationSerializer(serializers.Serializer):
    """A Serve application config, as in Serve's own config file. A field Serve does not know is
    refused, since Serve would drop it without a word."""

    name = serializers.CharField(max_length=100)
    route_prefix = serializers.CharField(
        required=False, allow_null=True, help_text="Starts with '/'; default '/'. null: no HTTP route."
    )
    import_path = serializers.CharField(max_length=500, help_text="module:attribute of the application, e.g. app:app.")
    runtime_env = serializers.JSONField(
        required=False,
        help_text="working_dir (a URI: s3://, gs://, https://….zip or local://), pip (a list), env_vars (strings).",
    )
    args = serializers.JSONField(required=False, help_text="Arguments passed to the application's builder.")
    deployments = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        help_text="Per-deployment options: [{name, num_replicas, max_ongoing_requests, …}].",
    )
    logging_config = serializers.JSONField(required=False)
    external_scaler_enabled = serializers.BooleanField(required=False)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {key: ["Serve does not know this application field and would drop it silently."] for key in unknown}
                )
        return super().to_internal_value(data)


class CreateApplicationSerializer(serializers.Serializer):
    cluster = VisiblePrimaryKeyRelatedField(queryset=Cluster.objects.all())
    application = NewApplicationSerializer()
    reason = serializers.CharField(max_length=2000)


class DeleteApplicationSerializer(serializers.Serializer):
    cluster = VisiblePrimaryKeyRelatedField(queryset=Cluster.objects.all())
    application = serializers.CharField(max_length=200, help_text="The application's name.")
    reason = serializers.CharField(max_length=2000)


class ChangeApplySerializer(serializers.Serializer):
    confirm = serializers.CharField(
        required=False, allow_blank=True, help_text="For a deletion: the application's name, typed as confirmation."
    )


class ChangeViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Configuration changes. Creating one plans it (nothing is pushed); `apply` pushes it through
    the protocol: drift check, push of the full config, verification, automatic rollback. The v2
    list leaves each change's steps, JSON patch, warnings and drift to the detail."""

    serializer_class = ChangeSerializer
    filterset_class = ChangeFilter
    pagination_class = StreamPagination

    def get_queryset(self):
        changes = access.visible(self.request.user, Change).order_by("-created_at", "-id")
        if lean_list(self):
            return changes.defer(*Change.CONFIGS, *CHANGE_DETAIL_ONLY[1:]).annotate(
                cluster_name=F("cluster__name"),
                preset_slug=F("preset__slug"),
                created_by_name=F("created_by__username"),
                applied_by_name=F("applied_by__username"),
            )
        changes = changes.select_related("cluster", "preset", "created_by", "applied_by")
        if self.action != "list":
            return changes.prefetch_related(Prefetch("steps", to_attr="step_rows"))
        # The serializer shows no config (the actions push and restore them), one name of each related
        # row, and of each step what ChangeStepSerializer shows (not its data).
        related = ("cluster__name", "preset__slug", "created_by__username", "applied_by__username")
        steps = lean(ChangeStep.objects.only("change", "at", "state", "message"))
        return (
            narrow(changes, *related)
            .defer(*Change.CONFIGS)
            .prefetch_related(Prefetch("steps", queryset=steps, to_attr="step_rows"))
        )

    def get_serializer_class(self):
        return ChangeSummarySerializer if lean_list(self) else ChangeSerializer

    @extend_schema(request=PlanSerializer, responses={201: ChangeSerializer})
    def create(self, request, *args, **kwargs):
        plan = PlanSerializer(data=request.data, context=self.get_serializer_context())
        plan.is_valid(raise_exception=True)
        data = plan.validated_data
        cluster = data["cluster"]
        require_role(request, cluster.team, Role.OPERATOR, "change clusters")
        change = protocol.plan_change(
            Actor.from_request(request),
            cluster,
            targets=data["targets"],
            reason=data["reason"],
            options=data.get("options"),
            preset=data.get("preset"),
        )
        return Response(ChangeSerializer(self.get_queryset().get(pk=change.pk)).data, status=status.HTTP_201_CREATED)

    def _act(self, request, what: str) -> Change:
        change = self.get_object()
        require_role(request, change.cluster.team, Role.OPERATOR, what)
        return change

    @extend_schema(request=CreateApplicationSerializer, responses={201: ChangeSerializer})
    @action(detail=False, methods=["post"], url_path="create-application")
    def create_application(self, request):
        """Plan deploying a new application next to the others (nothing is pushed): its config is
        checked with Fleetdeck's checks and Serve's schema, and its name and route prefix must be free."""
        body = CreateApplicationSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        cluster = body.validated_data["cluster"]
        require_role(request, cluster.team, Role.OPERATOR, "change clusters")
        change = protocol.plan_create_app(
            Actor.from_request(request),
            cluster,
            app=dict(body.validated_data["application"]),
            reason=body.validated_data["reason"],
        )
        return Response(ChangeSerializer(self.get_queryset().get(pk=change.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=DeleteApplicationSerializer, responses={201: ChangeSerializer})
    @action(detail=False, methods=["post"], url_path="delete-application")
    def delete_application(self, request):
        """Plan deleting one application (nothing is pushed); the warnings list its deployments and
        replica counts, and `apply` then takes its name as `confirm`."""
        body = DeleteApplicationSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        cluster = body.validated_data["cluster"]
        require_role(request, cluster.team, Role.OPERATOR, "change clusters")
        change = protocol.plan_delete_app(
            Actor.from_request(request),
            cluster,
            application=body.validated_data["application"],
            reason=body.validated_data["reason"],
        )
        return Response(ChangeSerializer(self.get_queryset().get(pk=change.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ChangeApplySerializer, responses={202: ChangeSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Queue the change. 409 while another change is active on the cluster; 400 when a
        deletion's `confirm` is not the application's name."""
        change = self._act(request, "apply changes")
        body = ChangeApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            protocol.request_apply(Actor.from_request(request), change, confirm=body.validated_data.get("confirm"))
        except protocol.ConfirmationMismatch as exc:
            raise serializers.ValidationError({"confirm": exc.messages}) from exc
        return Response(ChangeSerializer(self.get_queryset().get(pk=change.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: ChangeSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        """Restore the applications this change touched to their config before it, as a new change.
        400 when the cluster already runs that config; 409 while another change holds the cluster."""
        change = self._act(request, "roll back changes")
        restore = protocol.roll_back_change(Actor.from_request(request), change)
        return Response(ChangeSerializer(self.get_queryset().get(pk=restore.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: ChangeSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        change = self._act(request, "cancel changes")
        protocol.cancel(Actor.from_request(request), change)
        return Response(ChangeSerializer(self.get_queryset().get(pk=change.pk)).data)

    @extend_schema(request=RestoreSerializer, responses={201: ChangeSerializer})
    @action(detail=False, methods=["post"])
    def restore(self, request):
        """Plan putting one application back to a recorded config revision."""
        body = RestoreSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        revision = body.validated_data["revision"]
        cluster = revision.cluster
        require_role(request, cluster.team, Role.OPERATOR, "change clusters")
        change = protocol.plan_restore(
            Actor.from_request(request),
            cluster,
            app_configs={revision.application.name: revision.config["submitted"]},
            reason=body.validated_data["reason"],
        )
        return Response(ChangeSerializer(self.get_queryset().get(pk=change.pk)).data, status=status.HTTP_201_CREATED)


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
        return _with_preset_or_options(data)


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
