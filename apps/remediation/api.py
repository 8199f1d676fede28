from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import CONFLICT
from apps.calibration import inputs as calibration_inputs
from apps.calibration.api import MixField, checked_mix
from apps.incidents.models import Incident
from apps.remediation import findings, remedy_checks, verification, wizards
from apps.remediation.filters import FindingFilter
from apps.remediation.models import Finding, Wizard, WizardStep
from apps.remediation.rules import BY_ID
from apps.scaler import wizard_step
from controlplane.api.lean import lean
from controlplane.api.pagination import StreamPagination
from controlplane.api.rows import FastRows, narrow


class FindingSerializer(FastRows, serializers.ModelSerializer):
    title = serializers.SerializerMethodField()
    why = serializers.SerializerMethodField()
    remedy = serializers.SerializerMethodField()

    class Meta:
        model = Finding
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "application_name",
            "deployment_name",
            "deployment",
            "subject",
            "rule",
            "title",
            "severity",
            "why",
            "remedy",
            "message",
            "evidence",
            "patch",
            "action",
            "first_seen_at",
            "resolved_at",
            "muted_at",
            "mute_reason",
        ]
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
    """Config lint recomputed on every sync: what each deployment violates, why, and the patch; and
    for clusters linked to Kubernetes, the K1-K4 checks (`subject` names the pod or node group,
    `message` says what is wrong there). Open findings by default (`open=false` for history)."""

    serializer_class = FindingSerializer
    filterset_class = FindingFilter

    def get_queryset(self):
        queryset = access.visible(self.request.user, Finding)
        if "open" not in self.request.query_params:
            queryset = queryset.filter(resolved_at__isnull=True)
        queryset = queryset.order_by("rule", "cluster_name", "application_name", "deployment_name", "id")
        # A list row names its cluster from its own column; the detail's actions read the cluster.
        return queryset if self.action == "list" else queryset.select_related("cluster")

    @extend_schema(request=MuteSerializer, responses=FindingSerializer)
    @action(detail=True, methods=["post"])
    def mute(self, request, pk=None):
        finding = self.get_object()
        access.demand(request.user, finding.cluster.team, findings.MUTE)
        body = MuteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(
            FindingSerializer(findings.mute(Actor.from_request(request), finding, body.validated_data["reason"])).data
        )

    @extend_schema(request=None, responses=FindingSerializer)
    @action(detail=True, methods=["post"])
    def unmute(self, request, pk=None):
        finding = self.get_object()
        access.demand(request.user, finding.cluster.team, findings.UNMUTE)
        return Response(FindingSerializer(findings.unmute(Actor.from_request(request), finding)).data)


class WizardStepSerializer(FastRows, serializers.ModelSerializer):
    status_label = serializers.CharField(source="get_status_display", read_only=True)
    change_state = serializers.CharField(source="change.state", default=None, read_only=True, allow_null=True)

    class Meta:
        model = WizardStep
        fields = [
            "position",
            "kind",
            "remedy",
            "title",
            "status",
            "status_label",
            "values",
            "patch",
            "change",
            "change_state",
            "calibration",
            "check_result",
            "note",
            "updated_at",
        ]
        read_only_fields = fields


class WizardSerializer(FastRows, serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    steps = WizardStepSerializer(many=True, read_only=True)

    class Meta:
        model = Wizard
        fields = [
            "id",
            "state",
            "revision",
            "cluster",
            "cluster_name",
            "application_name",
            "deployment_name",
            "deployment",
            "incident",
            "finding",
            "diagnosis",
            "latency_objective_ms",
            "failure_objective",
            "verification_window_s",
            "verify_started_at",
            "verify_ends_at",
            "before",
            "after",
            "outcome",
            "next_steps",
            "created_at",
            "updated_at",
            "finished_at",
            "steps",
        ]
        read_only_fields = fields
        # Filled by WizardViewSet's prefetch (a plain list); without it, read from the relation.
        prefetched_as = {"steps": "step_rows"}


class WizardStartSerializer(serializers.Serializer):
    incident = serializers.IntegerField(required=False, help_text="Start from this incident…")
    finding = serializers.IntegerField(required=False, help_text="…or from this finding.")
    latency_objective_ms = serializers.IntegerField(
        required=False,
        min_value=100,
        max_value=600_000,
        help_text="The p99 clients may see, end to end; sizes the queue bound (R10). Without it the wizard suggests "
        "one (from the p99 clients saw before the incident and the service time) and says so in every value's reason.",
    )
    failure_objective = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        help_text="Share of client requests that may fail (5xx, 408) in verification. Without it, suggested.",
    )
    verification_window_s = serializers.IntegerField(required=False, min_value=30, max_value=86_400)


class ObjectivesSerializer(serializers.Serializer):
    latency_objective_ms = serializers.IntegerField(
        min_value=100, max_value=600_000, help_text="The p99 clients may see, end to end (ms)."
    )
    failure_objective = serializers.FloatField(
        min_value=0.0, max_value=1.0, help_text="Share of client requests that may fail (5xx, 408), 0 to 1."
    )
    margin = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=0.9,
        help_text="Share of the node's room below Ray's kill level to keep free. Above the computed margin it "
        "is taken; below it only with confirm_less_margin.",
    )
    confirm_less_margin = serializers.CharField(
        required=False, allow_blank=True, default="", help_text='Type "accept the OOM risk" to take less margin.'
    )
    revision = serializers.IntegerField(required=False, help_text="The revision you acted on; a newer one answers 409.")


class RevisionSerializer(serializers.Serializer):
    revision = serializers.IntegerField(required=False, help_text="The revision you acted on; a newer one answers 409.")


class ApplySerializer(RevisionSerializer):
    steps = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        min_length=1,
        max_length=10,
        help_text="Positions of config steps, applied together as one change.",
    )


class StepSerializer(RevisionSerializer):
    step = serializers.IntegerField(min_value=1)
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    params = serializers.DictField(
        required=False,
        help_text=(
            "For checks: R3 takes method, path, field, size and timeout_s "
            f"({remedy_checks.MIN_PROBE_TIMEOUT_S:g}-{remedy_checks.MAX_PROBE_TIMEOUT_S:g} s); R6 takes factor "
            f"({remedy_checks.MIN_COLD_START_FACTOR:g}-{remedy_checks.MAX_COLD_START_FACTOR:g}, the most p99 after "
            "replica starts may be over the steady p50)."
        ),
    )


class WizardCalibrateSerializer(RevisionSerializer):
    request = serializers.JSONField(
        required=False, allow_null=True, help_text=calibration_inputs.REPRESENTATIVE_REQUEST_HELP
    )
    mix = MixField(required=False, allow_null=True, help_text=calibration_inputs.MIX_HELP)
    levels = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=64),
        required=False,
        min_length=1,
        max_length=8,
        help_text="Concurrency levels, increasing. Default 1, 2, 4, 8.",
    )


class VerifySerializer(RevisionSerializer):
    window_s = serializers.IntegerField(required=False, min_value=30, max_value=86_400)


class AbandonSerializer(RevisionSerializer):
    reason = serializers.CharField(max_length=2000)


class WizardViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Guided remediation: diagnosis, one step per remedy with computed values, verification
    under live traffic, outcome on the incident. Every action takes the `revision` it acted on;
    409 means another operator (or the worker) moved the wizard, or the deployment changed and
    the values were recomputed."""

    serializer_class = WizardSerializer
    pagination_class = StreamPagination
    filterset_fields = ["state", "cluster", "incident", "finding", "application_name", "deployment_name"]

    def get_queryset(self):
        # A step shows its change's state: not the change's two configs.
        steps = lean(narrow(WizardStep.objects.select_related("change"), "change__state").order_by("position"))
        return (
            access.visible(self.request.user, Wizard)
            .select_related("cluster")
            .prefetch_related(Prefetch("steps", queryset=steps, to_attr="step_rows"))
            .order_by("-created_at", "-id")
        )

    def _respond(self, wizard, code=status.HTTP_200_OK):
        return Response(WizardSerializer(self.get_queryset().get(pk=wizard.pk)).data, status=code)

    def _operable(self, request, operation: str):
        wizard = self.get_object()
        access.demand(request.user, wizard.cluster.team, wizards.OPERATIONS[operation])
        return wizard

    @extend_schema(
        request=WizardStartSerializer, responses={201: WizardSerializer, 200: WizardSerializer, 409: CONFLICT}
    )
    def create(self, request, *args, **kwargs):
        """Start a wizard from an incident or a finding. An active wizard for the same deployment is
        returned (200) instead of a second one."""
        body = WizardStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        incident = finding = None
        if data.get("incident"):
            incident = (
                access.visible(request.user, Incident)
                .filter(pk=data["incident"])
                .select_related("cluster__team")
                .first()
            )
            if incident is None:
                raise serializers.ValidationError({"incident": ["No such incident."]})
        if data.get("finding"):
            finding = (
                access.visible(request.user, Finding).filter(pk=data["finding"]).select_related("cluster__team").first()
            )
            if finding is None:
                raise serializers.ValidationError({"finding": ["No such finding."]})
        source = incident or finding
        if source is not None:
            access.demand(request.user, source.cluster.team, wizards.START)
        wizard, created = wizards.start(
            Actor.from_request(request),
            incident=incident,
            finding=finding,
            latency_objective_ms=data.get("latency_objective_ms"),
            failure_objective=data.get("failure_objective"),
            verification_window_s=data.get("verification_window_s"),
        )
        return self._respond(wizard, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=ApplySerializer, responses={202: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Apply config step(s) through the change protocol (one change). Poll the wizard for the result."""
        wizard = self._operable(request, "apply")
        body = ApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wizards.apply(
            Actor.from_request(request),
            wizard,
            body.validated_data["steps"],
            revision=body.validated_data.get("revision"),
        )
        return self._respond(wizard, status.HTTP_202_ACCEPTED)

    def _step_action(self, request, fn, operation, extra):
        wizard = self._operable(request, operation)
        body = StepSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        fn(Actor.from_request(request), wizard, data["step"], revision=data.get("revision"), **extra(data))
        return self._respond(wizard)

    @extend_schema(request=StepSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def confirm(self, request, pk=None):
        """Mark a code-level remedy as done, with a note."""
        return self._step_action(request, wizards.confirm, "confirm", extra=lambda d: {"note": d.get("note", "")})

    @extend_schema(request=StepSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def skip(self, request, pk=None):
        """Skip a remedy; `note` says why (required)."""
        return self._step_action(request, wizards.skip, "skip", extra=lambda d: {"reason": d.get("note", "")})

    @extend_schema(request=StepSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def scaler(self, request, pk=None):
        """Take R11: create the deployment's scaler in shadow mode with the sized bounds (or keep the one it
        has). It never takes control: activate it on the scaler itself."""
        return self._step_action(request, wizard_step.take, "scaler", extra=lambda d: {})

    @extend_schema(request=StepSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def check(self, request, pk=None):
        """Run a code-level remedy's automatic check (R3 oversized input, R6 cold start, R7, R8, R9)."""
        return self._step_action(request, remedy_checks.run, "check", extra=lambda d: {"params": d.get("params") or {}})

    @extend_schema(request=WizardCalibrateSerializer, responses={202: WizardSerializer, 400: CONFLICT, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def calibrate(self, request, pk=None):
        """Measure the deployment's memory at rising concurrency with a calibration job on its cluster,
        through its own interface; the values are recomputed when it ends. Poll the wizard."""
        wizard = self._operable(request, "calibrate")
        body = WizardCalibrateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        wizards.calibrate(
            Actor.from_request(request),
            wizard,
            request=data.get("request"),
            mix=checked_mix(data.get("mix"), data.get("levels") or list(wizards.CALIBRATION_LEVELS)),
            levels=data.get("levels"),
            revision=data.get("revision"),
        )
        return self._respond(wizard, status.HTTP_202_ACCEPTED)

    @extend_schema(request=RevisionSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @extend_schema(request=ObjectivesSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def objectives(self, request, pk=None):
        """State the objectives (p99 at the client, failed share): the values not yet applied are sized again.
        An objective below the calibrated service time is a 400 naming the field."""
        wizard = self._operable(request, "objectives")
        body = ObjectivesSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if refused := wizards.objective_below_service(wizard, data["latency_objective_ms"]):
            raise serializers.ValidationError({"latency_objective_ms": [refused]})
        if refused := wizards.margin_refused(wizard, data.get("margin"), data["confirm_less_margin"]):
            raise serializers.ValidationError({"margin": [refused]})
        wizard = wizards.set_objectives(
            Actor.from_request(request),
            wizard,
            latency_objective_ms=data["latency_objective_ms"],
            failure_objective=data["failure_objective"],
            revision=data.get("revision"),
            margin_fraction=data.get("margin"),
            confirmation=data["confirm_less_margin"],
        )
        return self._respond(wizard)

    @action(detail=True, methods=["post"])
    def replan(self, request, pk=None):
        """Recompute the diagnosis and the values of steps not yet applied (e.g. after a calibration)."""
        wizard = self._operable(request, "replan")
        body = RevisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wizards.replan(Actor.from_request(request), wizard, revision=body.validated_data.get("revision"))
        return self._respond(wizard)

    @extend_schema(request=VerifySerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def verify(self, request, pk=None):
        """Start the verification window; the worker concludes it (or call `evaluate`)."""
        wizard = self._operable(request, "verify")
        body = VerifySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        verification.start(
            Actor.from_request(request),
            wizard,
            window_s=body.validated_data.get("window_s"),
            revision=body.validated_data.get("revision"),
        )
        return self._respond(wizard)

    @extend_schema(request=None, responses=WizardSerializer)
    @action(detail=True, methods=["post"])
    def evaluate(self, request, pk=None):
        """Measure the verification window now: fails at once on an OOM kill, concludes when the window is over."""
        wizard = self._operable(request, "evaluate")
        verification.evaluate(wizard.pk)
        return self._respond(wizard)

    @extend_schema(request=AbandonSerializer, responses={200: WizardSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def abandon(self, request, pk=None):
        wizard = self._operable(request, "abandon")
        body = AbandonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        wizards.abandon(
            Actor.from_request(request),
            wizard,
            reason=body.validated_data["reason"],
            revision=body.validated_data.get("revision"),
        )
        return self._respond(wizard)
