"""A model's memory on each GPU: its weights and KV bytes per token under tensor and pipeline parallelism.

Pure arithmetic over the model's shape (apps.llm.shapes), every figure with its source. KV heads split across TP
ranks, at least one each (ModelConfig.get_num_kv_heads); layers split across PP stages as vLLM's get_pp_indices
does; the vocabulary is padded to 64 and split across TP (VocabParallelEmbedding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.llm.accelerators import GIB
from apps.llm.shapes import DTYPE_BYTES, ModelShape


class PlanError(ValueError):
    """The inputs cannot be planned (a layout vLLM rejects, a length above the model's...); `field` names the input."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str

    def __str__(self) -> str:
        return f"{_show(self.value, self.unit)}: {self.source}"


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1
    pipeline: int = 1

    def __post_init__(self) -> None:
        if self.tensor < 1 or self.pipeline < 1:
            raise PlanError(f"tensor and pipeline parallel sizes must be at least 1, got {self.tensor}/{self.pipeline}")

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline


def _show(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / GIB:.2f} GiB"
    if unit == "fraction":
        return f"{value:.2f}"
    return f"{value:,.0f} {unit}"


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def floor2(value: float) -> float:
    return math.floor(round(value * 100, 6)) / 100


def ceil2(value: float) -> float:
    return math.ceil(round(value * 100, 6)) / 100


# --- dtypes ---------------------------------------------------------------------------------------------------


def weight_dtype(shape: ModelShape, dtype: str | None = None) -> tuple[str, str]:
    """The dtype vLLM loads the weights in, and why: engine `dtype`, or "auto" as vLLM resolves it."""
    if dtype and dtype != "auto":
        if dtype not in DTYPE_BYTES:
            raise PlanError(f"engine dtype {dtype!r} is not one of auto, {', '.join(sorted(DTYPE_BYTES))}")
        return dtype, f"engine_kwargs dtype {dtype!r}"
    # vLLM's "auto": FP16 for FP32 and FP16 checkpoints, the checkpoint's dtype otherwise (EngineArgs.dtype).
    if shape.dtype in ("float32", "float"):
        return "float16", f"dtype auto: vLLM serves the {shape.dtype} checkpoint in float16"
    return shape.dtype, f"dtype auto: the checkpoint's torch_dtype {shape.dtype}"


def kv_dtype(shape: ModelShape, kv_cache_dtype: str | None = "auto", dtype: str | None = None) -> tuple[int, str]:
    """Bytes per KV element: `kv_cache_dtype`, where "auto" is the model's dtype."""
    if kv_cache_dtype and kv_cache_dtype != "auto":
        if kv_cache_dtype not in DTYPE_BYTES:
            raise PlanError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of auto, {', '.join(sorted(DTYPE_BYTES))}")
        return DTYPE_BYTES[kv_cache_dtype], f"kv_cache_dtype {kv_cache_dtype}"
    name, _ = weight_dtype(shape, dtype)
    return DTYPE_BYTES[name], f"kv_cache_dtype auto: the model dtype {name}"


# --- parameters -------------------------------------------------------------------------------------------------


def check_parallelism(shape: ModelShape, parallel: Parallelism) -> None:
    """Raise PlanError for a layout vLLM refuses (heads not divisible, more stages than layers)."""
    tp = parallel.tensor
    if shape.num_attention_heads % tp:
        raise PlanError(
            f"tensor_parallel_size {tp} does not divide the model's {shape.num_attention_heads} attention heads"
        )
    if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        raise PlanError(
            f"tensor_parallel_size {tp} and the model's {shape.num_kv_heads} KV heads: one must divide the other"
        )
    if parallel.pipeline > shape.num_layers:
        raise PlanError(f"pipeline_parallel_size {parallel.pipeline} exceeds the model's {shape.num_layers} layers")


def pipeline_partitions(num_layers: int, pipeline: int) -> list[int]:
    """Layers per stage as vLLM's get_pp_indices splits them: the remainder goes to the stages before the last."""
    partitions = [num_layers // pipeline] * pipeline
    for i in range(2, num_layers % pipeline + 2):
        partitions[-i] += 1
    return partitions


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    return max(1, shape.num_kv_heads // tp)


def _attention_params(shape: ModelShape, tp: int) -> int:
    q = shape.num_attention_heads // tp * shape.head_dim
    kv = kv_heads_per_gpu(shape, tp) * shape.head_dim
    weights = shape.hidden_size * (q + 2 * kv) + q * shape.hidden_size
    return weights + ((q + 2 * kv) if shape.qkv_bias else 0)


def _dense_mlp_params(shape: ModelShape, tp: int) -> int:
    # gate, up and down projections (SwiGLU), column/row split over TP.
    return 3 * shape.hidden_size * math.ceil(shape.intermediate_size / tp)


def _moe_mlp_params(shape: ModelShape, tp: int) -> int:
    # Under TP every rank holds a slice of every expert; the router is replicated.
    # Called for a mixture of experts only, whose shape carries both (shapes.py sets them together).
    assert shape.num_experts is not None and shape.expert_intermediate_size is not None
    experts = shape.num_experts * 3 * shape.hidden_size * math.ceil(shape.expert_intermediate_size / tp)
    router = shape.hidden_size * shape.num_experts
    shared = 0
    if shape.shared_expert_intermediate_size:
        shared = 3 * shape.hidden_size * math.ceil(shape.shared_expert_intermediate_size / tp) + shape.hidden_size
    return experts + router + shared


def stage_params(shape: ModelShape, parallel: Parallelism) -> list[int]:
    """Parameters on one GPU of each pipeline stage."""
    tp = parallel.tensor
    # VocabParallelEmbedding pads the vocabulary to a multiple of 64 before splitting it over the ranks.
    embedding = math.ceil(math.ceil(shape.vocab_size / 64) * 64 / tp) * shape.hidden_size
    norms = 2 * shape.hidden_size
    dense_layer = _attention_params(shape, tp) + _dense_mlp_params(shape, tp) + norms
    moe_layer = _attention_params(shape, tp) + _moe_mlp_params(shape, tp) + norms if shape.is_moe else dense_layer
    num_moe = shape.num_moe_layers or 0
    stages = []
    partitions = pipeline_partitions(shape.num_layers, parallel.pipeline)
    for index, layers in enumerate(partitions):
        # Where a stage could hold either, count sparse layers first: the larger estimate.
        sparse = min(layers, num_moe)
        params = sparse * moe_layer + (layers - sparse) * dense_layer
        first, last = index == 0, index == len(partitions) - 1
        if first:
            params += embedding
        if last:
            params += shape.hidden_size  # the final norm
            # The LM head shares the embedding when tied, unless the embedding sits on another stage.
            if not (shape.tie_word_embeddings and first):
                params += embedding
        if first and shape.vision_parameters:
            params += math.ceil(shape.vision_parameters / tp)  # the vision tower is sharded like the decoder
        stages.append(params)
    return stages


def parameter_count(shape: ModelShape) -> Figure:
    """All parameters, computed from the shape (norms included, vocabulary padding not)."""
    count = stage_params(shape, Parallelism())[0]
    what = "dense" if not shape.is_moe else f"{shape.num_experts} experts, {shape.experts_per_token} per token"
    return Figure(count, "parameters", f"computed from the {shape.architecture} shape ({what})")


def weights_bytes(shape: ModelShape, dtype: str | None = None) -> Figure:
    """The weights' size: the published parameter count when known, else the computed one, times the dtype."""
    if shape.quantization:
        raise PlanError(
            f"the checkpoint is quantized ({shape.quantization}): its weights are not parameters x dtype, "
            "so this planner does not size them"
        )
    name, why = weight_dtype(shape, dtype)
    per = DTYPE_BYTES[name]
    count: float
    if shape.parameter_count:
        count, counted = shape.parameter_count, f"{shape.parameter_count:,} published parameters"
    else:
        count = parameter_count(shape).value
        counted = f"{count:,} parameters computed from the shape"
    return Figure(count * per, "bytes", f"{counted} x {per} bytes ({why})")


def weights_bytes_per_gpu(shape: ModelShape, parallel: Parallelism, dtype: str | None = None) -> Figure:
    """The weights on the fullest GPU: TP splits every matrix but the norms and router, PP splits the layers."""
    check_parallelism(shape, parallel)
    total = weights_bytes(shape, dtype)
    if parallel.gpus == 1:
        return Figure(total.value, "bytes", f"one GPU holds all weights: {total.source}")
    stages = stage_params(shape, parallel)
    computed_total = stage_params(shape, Parallelism())[0]
    share = max(stages) / computed_total
    notes = [f"TP {parallel.tensor}: matrices split across ranks, norms and router replicated"]
    if shape.num_kv_heads < parallel.tensor:
        notes.append(f"{shape.num_kv_heads} KV heads < TP {parallel.tensor}: K/V projections replicated")
    if parallel.pipeline > 1:
        partitions = pipeline_partitions(shape.num_layers, parallel.pipeline)
        notes.append(f"PP {parallel.pipeline}: layers {partitions}, embedding on the first stage, LM head on the last")
    return Figure(
        round(total.value * share),
        "bytes",
        f"{share:.4f} of {gib(total.value)} on the fullest GPU ({'; '.join(notes)})",
    )


# --- KV cache ---------------------------------------------------------------------------------------------------


def kv_bytes_per_token(shape: ModelShape, kv_cache_dtype: str | None = "auto", dtype: str | None = None) -> Figure:
    """KV cache per token for the whole model: 2 (K and V) x layers x KV heads x head dim x bytes."""
    per, why = kv_dtype(shape, kv_cache_dtype, dtype)
    value = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * per
    return Figure(
        value,
        "bytes/token",
        f"2 x {shape.num_layers} layers x {shape.num_kv_heads} KV heads x {shape.head_dim} head dim x {per} bytes "
        f"({why})",
    )


def stage_kv_per_token(shape: ModelShape, parallel: Parallelism, per: int) -> list[int]:
    heads = kv_heads_per_gpu(shape, parallel.tensor)
    return [
        2 * layers * heads * shape.head_dim * per for layers in pipeline_partitions(shape.num_layers, parallel.pipeline)
    ]


def kv_bytes_per_token_per_gpu(
    shape: ModelShape, parallel: Parallelism, kv_cache_dtype: str | None = "auto", dtype: str | None = None
) -> Figure:
    """KV cache per token on the fullest GPU: KV heads split across TP (at least one each), layers across PP."""
    check_parallelism(shape, parallel)
    per, why = kv_dtype(shape, kv_cache_dtype, dtype)
    heads = kv_heads_per_gpu(shape, parallel.tensor)
    layers = max(pipeline_partitions(shape.num_layers, parallel.pipeline))
    replicated = " (replicated: fewer KV heads than TP ranks)" if shape.num_kv_heads < parallel.tensor else ""
    return Figure(
        2 * layers * heads * shape.head_dim * per,
        "bytes/token",
        f"2 x {layers} layers x {heads} KV heads per GPU{replicated} x {shape.head_dim} head dim x {per} bytes ({why})",
    )
