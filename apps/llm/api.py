"""The capacity planner's endpoint: a model's config.json and engine settings in, vLLM's KV cache out.

Any signed-in user may plan: it reads and writes nothing of any team's, so there is no object to hide."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.llm import capacity
from apps.llm.accelerators import KNOWN_ACCELERATORS


# For the schema only: `capacity.plan_request` checks every field itself and names the one that is wrong, so the
# page and the API refuse the same input with the same words.
class LLMPlanSerializer(serializers.Serializer):
    """A model's config.json and the engine settings serve.llm would give vLLM; an absent setting is vLLM's
    default."""

    config = serializers.DictField(
        help_text="The model's Hugging Face config.json, as a JSON object (Fleetdeck does not download it)."
    )
    accelerator = serializers.CharField(
        required=False,
        allow_null=True,
        help_text=f"The Ray accelerator type ({', '.join(KNOWN_ACCELERATORS)}); another needs gpu_memory_bytes.",
    )
    gpu_memory_bytes = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="One GPU's memory as CUDA reports it; replaces the table's figure for the accelerator.",
    )
    tensor_parallel_size = serializers.IntegerField(default=1, min_value=1, max_value=capacity.MAX_GPUS)
    pipeline_parallel_size = serializers.IntegerField(default=1, min_value=1, max_value=capacity.MAX_GPUS)
    gpu_memory_utilization = serializers.FloatField(default=0.9, min_value=0, max_value=1, help_text="In (0, 1].")
    max_model_len = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=-1,
        max_value=capacity.MAX_TOKENS,
        help_text="Absent: the model's context length; -1: vLLM fits it to the KV cache (vLLM 0.14 and later).",
    )
    block_size = serializers.IntegerField(default=16, min_value=1, max_value=capacity.MAX_BLOCK_SIZE)
    max_num_seqs = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=capacity.MAX_TOKENS)
    max_num_batched_tokens = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=capacity.MAX_TOKENS
    )
    enforce_eager = serializers.BooleanField(default=False)
    kv_cache_dtype = serializers.ChoiceField(choices=capacity.KV_CACHE_DTYPES, default="auto")
    vllm_version = serializers.CharField(
        required=False, allow_null=True, help_text="The vLLM whose accounting to plan with; absent: Ray's pin."
    )
    ray_version = serializers.CharField(
        required=False, allow_null=True, help_text="The Ray version, to find the vLLM it pins."
    )
    kv_cache_memory_bytes = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="vLLM skips profiling and takes this as given."
    )
    num_gpu_blocks_override = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=capacity.MAX_TOKENS
    )
    performance_mode = serializers.ChoiceField(choices=capacity.PERFORMANCE_MODES, default="balanced")


class LLMMemoryPartSerializer(serializers.Serializer):
    bytes = serializers.IntegerField()
    # A declared field named like Field.source: the metaclass takes it off the class, the stubs cannot tell.
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="Where the figure comes from: a measurement, a formula or a setting."
    )
    inside_budget = serializers.BooleanField(
        required=False, help_text="CUDA graphs only: whether this vLLM counts them inside gpu_memory_utilization."
    )


class LLMMemorySerializer(serializers.Serializer):
    weights = LLMMemoryPartSerializer()
    activation_peak = LLMMemoryPartSerializer()
    non_torch = LLMMemoryPartSerializer()
    cuda_graphs = LLMMemoryPartSerializer()
    kv_cache = LLMMemoryPartSerializer()
    outside_budget = LLMMemoryPartSerializer()
    total = LLMMemoryPartSerializer()
    requested = LLMMemoryPartSerializer()
    unused = LLMMemoryPartSerializer()


class LLMUtilizationSerializer(serializers.Serializer):
    minimum = serializers.FloatField()
    safe = serializers.FloatField()


class LLMSuggestionsSerializer(serializers.Serializer):
    max_model_len = serializers.IntegerField(allow_null=True)
    gpu_memory_utilization = LLMUtilizationSerializer()
    kv_cache_tokens = serializers.IntegerField()
    engine_kwargs = serializers.DictField(
        child=serializers.JSONField(), help_text="For the application's llm_configs[i].engine_kwargs."
    )


class LLMFigureSerializer(serializers.Serializer):
    value = serializers.FloatField()
    unit = serializers.CharField()
    source = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.source, as above


class LLMTradeoffSerializer(serializers.Serializer):
    max_model_len = serializers.IntegerField()
    max_concurrency = serializers.FloatField()
    fits = serializers.BooleanField()


class CapacityPlanSerializer(serializers.Serializer):
    vllm_version = serializers.CharField(help_text="The vLLM whose accounting was planned with, and why that one.")
    kv_cache_tokens = serializers.IntegerField()
    max_concurrency = serializers.FloatField(help_text="Requests of max_model_len tokens the KV cache holds at once.")
    fits = serializers.BooleanField(help_text="False when vLLM would refuse to start or run out of memory.")
    memory = LLMMemorySerializer(help_text="One GPU's memory, part by part.")
    problems = serializers.ListField(child=serializers.CharField())
    suggestions = LLMSuggestionsSerializer()
    figures = serializers.DictField(child=LLMFigureSerializer())
    tradeoff = LLMTradeoffSerializer(many=True, help_text="Concurrency at shorter max_model_len on the same KV cache.")


class NestedJSONParser(JSONParser):
    """DRF's JSON parser, refusing a body nested past Python's recursion limit as malformed: a config.json is a
    few levels deep, and 100 kB of brackets would otherwise end the request in a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - the body is nested too deeply.") from exc


class PlanView(APIView):
    """Plan the GPU memory and KV cache of a vLLM engine as serve.llm runs it, every figure with its source."""

    # The body nests a config.json: a form could not carry it.
    parser_classes = [NestedJSONParser]

    @extend_schema(
        request=LLMPlanSerializer,
        responses={
            200: CapacityPlanSerializer,
            413: OpenApiResponse(description="The body is larger than FLEETDECK_MAX_BODY_BYTES (1 MiB by default)."),
        },
    )
    def post(self, request, *args, **kwargs):
        """Plan one engine (any signed-in user). A field that is wrong answers 400 naming it."""
        try:
            answer = capacity.plan_capacity(request.data)
        except capacity.PlanInputError as exc:
            raise serializers.ValidationError({exc.field: [exc.message]}) from exc
        return Response(answer)
