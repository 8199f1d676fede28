from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.audit import Actor
from apps.accounts.drf import VisiblePrimaryKeyRelatedField
from apps.calibration import inputs, services
from apps.calibration.curve import AXES, MAX_MIX
from apps.calibration.filters import CalibrationFilter
from apps.calibration.mix import QUANTILE_TEXT
from apps.calibration.models import MemoryCalibration
from apps.core.redaction import redact_anywhere
from apps.core.serializer_fields import RedactedJSONField
from apps.fleet.models import Deployment
from apps.incidents.request_sizes import observed as observed_sizes
from controlplane.api.pagination import StreamPagination


class MixEntrySerializer(serializers.Serializer):
    """One request of a calibrated mix, as asked and, once measured, as found."""

    request = RedactedJSONField(redact=redact_anywhere, help_text="The request, header values redacted.")
    share = serializers.FloatField(help_text="Its share of traffic, in percent.")
    tokens = serializers.IntegerField(
        required=False, allow_null=True, help_text="What it brings to a batch, when given."
    )
    label = serializers.CharField(required=False, help_text="How the job named it (method, path and query).")
    increment_bytes = serializers.IntegerField(
        required=False, help_text="What one more of it adds to a replica at rest: the steepest step of its levels."
    )
    points = serializers.ListField(
        child=serializers.DictField(), required=False, help_text="Its own levels, as the calibration's points."
    )
    limit_reason = serializers.CharField(required=False, help_text="Why its larger levels were not run; empty if run.")


class CalibrationSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    per_unit_bytes = serializers.SerializerMethodField(
        help_text="Steepest step of the curve: the most one more request (or token) adds. Null until it succeeded."
    )
    request = RedactedJSONField(
        redact=redact_anywhere,
        help_text="What was measured: import path, user_config, the representative request (header values "
        "redacted), the runtime_env (env var values redacted), resources and the memory stop.",
    )
    mix = MixEntrySerializer(
        many=True,
        read_only=True,
        help_text="The weighted mix measured instead of one request (the largest share's levels are `points`); "
        "empty for one request.",
    )
    mix_peaks = serializers.SerializerMethodField(
        help_text=f"For a mix that succeeded: at each measured level, a replica's peak holding that many requests "
        f"drawn from the mix, at the {QUANTILE_TEXT} (what sizing reads). Empty otherwise."
    )

    class Meta:
        model = MemoryCalibration
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "deployment",
            "application_name",
            "deployment_name",
            "submission_id",
            "state",
            "axis",
            "device",
            "shape",
            "baseline_bytes",
            "cold_baseline_bytes",
            "points",
            "limit_reason",
            "per_unit_bytes",
            "monotone",
            "warnings",
            "levels",
            "request",
            "mix",
            "mix_peaks",
            "error",
            "log_tail",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_per_unit_bytes(self, obj) -> int | None:
        if obj.state != MemoryCalibration.State.SUCCEEDED:
            return None
        return services.curve_of(obj).per_unit_bytes

    @extend_schema_field(
        inline_serializer(
            "MixPeak", {"concurrency": serializers.IntegerField(), "peak_bytes": serializers.IntegerField()}, many=True
        )
    )
    def get_mix_peaks(self, obj) -> list[dict]:
        if obj.state != MemoryCalibration.State.SUCCEEDED or len(obj.mix) < 2:
            return []
        curve = services.curve_of(obj)
        return [{"concurrency": int(x), "peak_bytes": curve.mix_peak(int(x))} for x, _ in curve.points]


@extend_schema_field(
    {
        "oneOf": [
            {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_MIX,
                "items": {
                    "type": "object",
                    "properties": {
                        "request": {"type": "object", "additionalProperties": True},
                        "share": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 100},
                        "tokens": {"type": "integer", "minimum": 1, "nullable": True},
                    },
                    "required": ["request", "share"],
                },
            },
            {"type": "string", "enum": [inputs.WARMUP_MIX, inputs.OBSERVED_MIX]},
        ],
        "nullable": True,
    }
)
class MixField(serializers.JSONField):
    """A mix as sent: checked by inputs.validate_mix, which names the entry and field at fault."""


class CalibrateSerializer(serializers.Serializer):
    deployment = VisiblePrimaryKeyRelatedField(queryset=Deployment.objects.select_related("application__cluster__team"))
    axis = serializers.ChoiceField(
        choices=AXES,
        default="concurrency",
        help_text="concurrency: k concurrent __call__s per level. token_sum: one batch per level through "
        "the class's calibration_batch(token_sum) hook.",
    )
    levels = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text=f"Concurrency levels (1–{inputs.MAX_LEVEL}; default {list(inputs.DEFAULT_LEVELS)}) or "
        f"token sums (1–{inputs.MAX_TOKEN_SUM}; default {list(inputs.DEFAULT_TOKEN_SUMS)}).",
    )
    call = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="A handle call with this one argument (concurrency axis only); the same as request "
        '{"kind": "handle", "args": [call]}.',
    )
    request = serializers.JSONField(required=False, allow_null=True, help_text=inputs.REPRESENTATIVE_REQUEST_HELP)
    mix = MixField(required=False, allow_null=True, help_text=inputs.MIX_HELP)

    def validate(self, attrs):
        attrs["mix"] = checked_mix(
            attrs.get("mix"), attrs.get("levels") or list(inputs.DEFAULTS_BY_AXIS[attrs["axis"]])
        )
        return attrs


def checked_mix(mix, levels):
    """A mix checked before anything is saved, so its errors come back under the field at fault
    ("mix", "mix[2].share"); None and the warmup preset pass as they are, for the service."""
    if mix is None or mix in (inputs.WARMUP_MIX, inputs.OBSERVED_MIX):
        return mix
    try:
        count = len(inputs.validate_levels(levels))
    except DjangoValidationError:
        count = 1  # the service refuses the levels with their own message
    try:
        return inputs.validate_mix(mix, count)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from exc


class CalibrationViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Memory calibrations: a Ray job that measures a deployment's peak memory at rising
    concurrency or batch token sum. The remediation wizard sizes `max_ongoing_requests` (and, from
    a token-sum curve, `max_batch_tokens`) from the latest curve."""

    serializer_class = CalibrationSerializer
    pagination_class = StreamPagination
    filterset_class = CalibrationFilter
    ordering_fields = ["created_at", "finished_at"]

    def get_queryset(self):
        return (
            access.visible(self.request.user, MemoryCalibration)
            .select_related("cluster")
            .order_by("-created_at", "-id")
        )

    @extend_schema(request=CalibrateSerializer, responses={202: CalibrationSerializer})
    def create(self, request, *args, **kwargs):
        """Calibrate a deployment (operator role). Answers 202 with the calibration; poll it until
        its state is final."""
        body = CalibrateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        deployment = body.validated_data["deployment"]
        access.demand(request.user, deployment.application.cluster.team, services.CALIBRATE)
        calibration = services.request_calibration(
            Actor.from_request(request),
            deployment,
            axis=body.validated_data["axis"],
            levels=body.validated_data.get("levels") or None,
            call=body.validated_data.get("call"),
            request=body.validated_data.get("request"),
            mix=body.validated_data.get("mix"),
            observed=observed_sizes(deployment) if body.validated_data.get("mix") == inputs.OBSERVED_MIX else None,
        )
        return Response(CalibrationSerializer(calibration).data, status=status.HTTP_202_ACCEPTED)
