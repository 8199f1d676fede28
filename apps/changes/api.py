from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import F, Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import CONFLICT, VisiblePrimaryKeyRelatedField, VisibleSlugRelatedField, require_role
from apps.accounts.models import Role, Team
from apps.changes import presets, protocol
from apps.changes.filters import ChangeFilter
from apps.changes.models import Change, ChangeStep, Preset
from apps.changes.validation import parse_options_text, preset_or_options, validate_options
from apps.clusters.models import Cluster
from apps.core.redaction import redact_patch
from apps.core.serializer_fields import RedactedJSONField
from apps.fleet import client_impact
from apps.fleet.models import ConfigRevision
from controlplane.api.lean import lean
from controlplane.api.pagination import StreamPagination
from controlplane.api.rows import FastRows, narrow
from controlplane.api.versioning import lean_list


class PresetSerializer(serializers.ModelSerializer):
    team = VisibleSlugRelatedField(slug_field="slug", queryset=Team.objects.all(), required=False, allow_null=True)
    remedies = serializers.ListField(
        child=serializers.CharField(max_length=16), required=False, help_text="Playbook remedy ids, e.g. R1, R2."
    )
    options = RedactedJSONField(
        read_only=False, help_text="Deployment options, as in a Serve config's deployment entry."
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
    patch = RedactedJSONField()
    json_patch = RedactedJSONField(redact=redact_patch)
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


def with_preset_or_options(data: dict) -> dict:
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
        return with_preset_or_options(data)


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
