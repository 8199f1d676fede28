"""GPU memory and KV-cache planning for one vLLM replica: pure functions, every figure with its source.

The accounting follows vLLM's own (vLLM at vllm-project/vllm@5606eaf, the layout Ray 2.60's serve.llm imports):

- `Worker.init_device` (vllm/v1/worker/gpu_worker.py) takes a memory snapshot after CUDA and NCCL are up and
  requests `total_memory * gpu_memory_utilization`; it refuses to start when less than that is free.
- `Worker.determine_available_memory` profiles one forward pass at `max_num_batched_tokens` and gives the KV cache
  `requested - (weights + peak activation + non-torch memory)`.
- `Worker.compile_or_warm_up_model` captures CUDA graphs *after* the KV cache is allocated ("memory_profiling does
  not consider CUDAGraph memory size"), so graphs, like the CUDA context, live in the `1 - utilisation` left over.
- A KV block of one layer holds `2 * block_size * num_kv_heads * head_size * dtype_size` bytes (AttentionSpec
  .page_size_bytes in vllm/v1/kv_cache_interface.py; `CacheEngine.get_cache_block_size` in the older
  vllm/worker/cache_engine.py), with `num_kv_heads = max(1, total_kv_heads // tensor_parallel_size)`
  (ModelConfig.get_num_kv_heads: KV heads are replicated when there are fewer than TP ranks).
- `_check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_utils.py) fails the start when no memory is left
  ("No available memory for the cache blocks") or one `max_model_len` request does not fit (vllm#2418).
- Pipeline stages get layers by `get_pp_indices` (vllm/distributed/utils.py); the engine runs with the fewest KV
  blocks any worker can hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.llm.accelerators import GIB, MIB, Accelerator
from apps.llm.shapes import DTYPE_BYTES, ModelShape

# CUDA graphs take about 1-3 GiB per GPU: vLLM logs it ("Graph capturing finished in N secs, took X GiB"), less for
# small models and the default capture sizes, more with a large max_num_seqs, nothing with enforce_eager. They are
# captured after the KV cache is allocated, outside gpu_memory_utilization, so this much must stay free. 1.5 GiB
# covers the usual 7B-70B deployments; a measured figure can be passed instead (cuda_graph_bytes).
CUDA_GRAPH_RESERVE_BYTES = 3 * GIB // 2
# The CUDA context and NCCL communicators exist before vLLM's memory snapshot, so they too come out of the
# memory gpu_memory_utilization leaves free.
CUDA_CONTEXT_BYTES = 512 * MIB
# Memory outside PyTorch's allocator that grows during vLLM's profiling run (cuBLAS workspaces, custom
# all-reduce buffers under TP); vLLM logs about 0.1 GiB on one GPU and more with NCCL, this covers both.
NON_TORCH_BYTES = 512 * MIB
# vLLM's defaults: CacheConfig.gpu_memory_utilization, and the CUDA block size.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16
# The sampler's profile run holds float32 logits and probabilities for every sequence of a batch.
_SAMPLER_BYTES_PER_LOGIT = 2 * 4


class PlanError(ValueError):
    """The inputs cannot be planned (a parallel layout vLLM would reject, a dtype it does not know...)."""


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


@dataclass(frozen=True)
class MemoryPlan:
    parallel: Parallelism
    gpu_memory_utilization: Figure
    weights: Figure
    weights_per_gpu: Figure
    kv_bytes_per_token: Figure
    kv_bytes_per_token_per_gpu: Figure
    requested_per_gpu: Figure
    activation_per_gpu: Figure
    non_torch_per_gpu: Figure
    kv_cache_per_gpu: Figure
    kv_cache_tokens: Figure
    max_model_len: Figure
    max_concurrent_sequences: Figure
    max_num_seqs: Figure
    safe_gpu_memory_utilization: Figure
    minimum_gpu_memory_utilization: Figure
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems


def _show(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / GIB:.2f} GiB"
    if unit == "fraction":
        return f"{value:.2f}"
    return f"{value:,.0f} {unit}"


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _floor2(value: float) -> float:
    return math.floor(round(value * 100, 6)) / 100


def _ceil2(value: float) -> float:
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


def _kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    return max(1, shape.num_kv_heads // tp)


def _attention_params(shape: ModelShape, tp: int) -> int:
    q = shape.num_attention_heads // tp * shape.head_dim
    kv = _kv_heads_per_gpu(shape, tp) * shape.head_dim
    weights = shape.hidden_size * (q + 2 * kv) + q * shape.hidden_size
    return weights + ((q + 2 * kv) if shape.qkv_bias else 0)


def _dense_mlp_params(shape: ModelShape, tp: int) -> int:
    # gate, up and down projections (SwiGLU), column/row split over TP.
    return 3 * shape.hidden_size * math.ceil(shape.intermediate_size / tp)


def _moe_mlp_params(shape: ModelShape, tp: int) -> int:
    # Under TP every rank holds a slice of every expert; the router is replicated.
    experts = shape.num_experts * 3 * shape.hidden_size * math.ceil(shape.expert_intermediate_size / tp)
    router = shape.hidden_size * shape.num_experts
    shared = 0
    if shape.shared_expert_intermediate_size:
        shared = 3 * shape.hidden_size * math.ceil(shape.shared_expert_intermediate_size / tp) + shape.hidden_size
    return experts + router + shared


def _stage_params(shape: ModelShape, parallel: Parallelism) -> list[int]:
    """Parameters on one GPU of each pipeline stage."""
    tp = parallel.tensor
    embedding = math.ceil(shape.vocab_size / tp) * shape.hidden_size
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
        stages.append(params)
    return stages


def parameter_count(shape: ModelShape) -> Figure:
    """All parameters, computed from the shape (norms included, vocabulary padding not)."""
    count = _stage_params(shape, Parallelism())[0]
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
    stages = _stage_params(shape, parallel)
    computed_total = _stage_params(shape, Parallelism())[0]
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
        f"{share:.4f} of {_gib(total.value)} on the fullest GPU ({'; '.join(notes)})",
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


def _stage_kv_per_token(shape: ModelShape, parallel: Parallelism, per: int) -> list[int]:
    heads = _kv_heads_per_gpu(shape, parallel.tensor)
    return [
        2 * layers * heads * shape.head_dim * per for layers in pipeline_partitions(shape.num_layers, parallel.pipeline)
    ]


def kv_bytes_per_token_per_gpu(
    shape: ModelShape, parallel: Parallelism, kv_cache_dtype: str | None = "auto", dtype: str | None = None
) -> Figure:
    """KV cache per token on the fullest GPU: KV heads split across TP (at least one each), layers across PP."""
    check_parallelism(shape, parallel)
    per, why = kv_dtype(shape, kv_cache_dtype, dtype)
    heads = _kv_heads_per_gpu(shape, parallel.tensor)
    layers = max(pipeline_partitions(shape.num_layers, parallel.pipeline))
    replicated = " (replicated: fewer KV heads than TP ranks)" if shape.num_kv_heads < parallel.tensor else ""
    return Figure(
        2 * layers * heads * shape.head_dim * per,
        "bytes/token",
        f"2 x {layers} layers x {heads} KV heads per GPU{replicated} x {shape.head_dim} head dim x {per} bytes ({why})",
    )


def vllm_batch_defaults(accelerator: Accelerator) -> tuple[int, int, str]:
    """max_num_batched_tokens and max_num_seqs vLLM picks when unset, for its OpenAI server (which serve.llm uses)."""
    # EngineArgs.get_batch_defaults in vllm/engine/arg_utils.py, UsageContext.OPENAI_API_SERVER.
    where = "vLLM's default for the OpenAI server on"
    if accelerator.memory_bytes >= 160 * GIB:
        return 16384, 1024, f"{where} GPUs of 160 GiB or more"
    if accelerator.memory_bytes >= 70 * GIB and "a100" not in accelerator.name.lower():
        return 8192, 1024, f"{where} GPUs of 70 GiB or more other than A100"
    return 2048, 256, f"{where} {accelerator.name}"


def activation_bytes_per_gpu(
    shape: ModelShape, parallel: Parallelism, max_num_batched_tokens: int, max_num_seqs: int, dtype: str | None = None
) -> Figure:
    """An estimate of vLLM's profiled peak activation: one forward pass of max_num_batched_tokens plus the sampler."""
    name, _ = weight_dtype(shape, dtype)
    per = DTYPE_BYTES[name]
    tp = parallel.tensor
    qkv = (shape.num_attention_heads // tp + 2 * _kv_heads_per_gpu(shape, tp)) * shape.head_dim
    if shape.is_moe:
        mlp = shape.experts_per_token * math.ceil(shape.expert_intermediate_size / tp)
        mlp += math.ceil((shape.shared_expert_intermediate_size or 0) / tp)
    else:
        mlp = math.ceil(shape.intermediate_size / tp)
    # Residual, normed input and attention output (4 x hidden), the QKV projection, and gate/up/activation (3 x MLP).
    forward = max_num_batched_tokens * (4 * shape.hidden_size + qkv + 3 * mlp) * per
    sequences = min(max_num_seqs, max_num_batched_tokens)
    sampler = sequences * shape.vocab_size * _SAMPLER_BYTES_PER_LOGIT
    return Figure(
        forward + sampler,
        "bytes",
        f"estimate: {max_num_batched_tokens:,} batched tokens x (4 x {shape.hidden_size} hidden + {qkv} QKV + 3 x "
        f"{mlp} MLP) x {per} bytes, plus float32 logits and probabilities of {sequences} sequences x "
        f'{shape.vocab_size:,} vocabulary; vLLM measures this at start ("PyTorch activation peak memory" in its log)',
    )


def _graph_bytes(enforce_eager: bool, cuda_graph_bytes: int | None) -> tuple[int, str]:
    if enforce_eager:
        return 0, "no CUDA graphs (enforce_eager)"
    if cuda_graph_bytes is not None:
        return cuda_graph_bytes, f"{_gib(cuda_graph_bytes)} for CUDA graphs, as measured"
    return CUDA_GRAPH_RESERVE_BYTES, f"{_gib(CUDA_GRAPH_RESERVE_BYTES)} assumed for CUDA graphs"


def safe_gpu_memory_utilization(
    accelerator: Accelerator,
    *,
    gpu_share: float = 1.0,
    enforce_eager: bool = False,
    cuda_graph_bytes: int | None = None,
) -> Figure:
    """The highest utilisation that leaves room for CUDA graphs and the CUDA context within this replica's share.

    `gpu_share` is the part of the GPU this replica may take: Ray's fractional GPU (a placement bundle of
    GPU 0.5), or 1 / the number of replicas sharing one GPU. Their utilisations must sum below 1 with each one's
    overhead on top: vLLM's limit is a request, not a boundary (vllm PR#1821).
    """
    if not 0 < gpu_share <= 1:
        raise PlanError(f"a GPU share is in (0, 1], got {gpu_share}")
    graphs, graphs_why = _graph_bytes(enforce_eager, cuda_graph_bytes)
    value = _floor2(gpu_share - (graphs + CUDA_CONTEXT_BYTES) / accelerator.memory_bytes)
    share_why = "the whole GPU" if gpu_share == 1 else f"a {gpu_share:g} share of the GPU"
    return Figure(
        max(value, 0.0),
        "fraction",
        f"{share_why} minus {graphs_why} and {_gib(CUDA_CONTEXT_BYTES)} for the CUDA context, both outside vLLM's "
        f"budget, of {accelerator.source}",
    )


def shared_gpu_headroom(
    utilizations: list[float],
    accelerator: Accelerator,
    *,
    enforce_eager: bool = False,
    cuda_graph_bytes: int | None = None,
) -> Figure:
    """What is left of one GPU after every replica on it took its utilisation plus its own overhead (< 0: OOM)."""
    graphs, _ = _graph_bytes(enforce_eager, cuda_graph_bytes)
    per_replica = (graphs + CUDA_CONTEXT_BYTES) / accelerator.memory_bytes
    left = 1 - sum(utilizations) - len(utilizations) * per_replica
    return Figure(
        round(left, 4),
        "fraction",
        f"1 - ({' + '.join(f'{u:g}' for u in utilizations)}) - {len(utilizations)} x {per_replica:.3f} overhead each: "
        "vLLM does not enforce a boundary between replicas on one GPU (vllm PR#1821), the last to start fails "
        "or one of them OOMs",
    )


# --- the plan -----------------------------------------------------------------------------------------------------


def plan_memory(
    shape: ModelShape,
    accelerator: Accelerator,
    *,
    parallel: Parallelism | None = None,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    dtype: str | None = None,
    kv_cache_dtype: str | None = "auto",
    block_size: int | None = None,
    enforce_eager: bool = False,
    gpu_share: float = 1.0,
    activation_bytes: int | None = None,
    cuda_graph_bytes: int | None = None,
) -> MemoryPlan:
    """Weights, KV cache and concurrency of one replica, as vLLM would size them at start."""
    parallel = parallel or Parallelism()
    check_parallelism(shape, parallel)
    if gpu_memory_utilization is None:
        util = Figure(DEFAULT_GPU_MEMORY_UTILIZATION, "fraction", "unset: vLLM's default")
    elif not 0 < gpu_memory_utilization <= 1:
        raise PlanError(f"gpu_memory_utilization is in (0, 1], got {gpu_memory_utilization}")
    else:
        util = Figure(gpu_memory_utilization, "fraction", "engine_kwargs gpu_memory_utilization")
    block = block_size or DEFAULT_BLOCK_SIZE
    default_tokens, default_seqs, defaults_why = vllm_batch_defaults(accelerator)
    seqs = Figure(max_num_seqs, "sequences", "engine_kwargs max_num_seqs") if max_num_seqs else None
    seqs = seqs or Figure(default_seqs, "sequences", f"unset: {defaults_why}")
    batched = max_num_batched_tokens or default_tokens

    if max_model_len:
        model_len = Figure(max_model_len, "tokens", "engine_kwargs max_model_len")
    elif shape.max_position_embeddings:
        model_len = Figure(
            shape.max_position_embeddings, "tokens", "unset: vLLM takes the model's max_position_embeddings"
        )
    else:
        raise PlanError("max_model_len is unset and the model config has no max_position_embeddings to default to")

    weights = weights_bytes(shape, dtype)
    weights_gpu = weights_bytes_per_gpu(shape, parallel, dtype)
    kv_token = kv_bytes_per_token(shape, kv_cache_dtype, dtype)
    kv_token_gpu = kv_bytes_per_token_per_gpu(shape, parallel, kv_cache_dtype, dtype)
    if activation_bytes is not None:
        activation = Figure(activation_bytes, "bytes", "as measured")
    else:
        activation = activation_bytes_per_gpu(shape, parallel, batched, int(seqs.value), dtype)
    non_torch = Figure(NON_TORCH_BYTES, "bytes", "assumed: cuBLAS workspaces and all-reduce buffers outside PyTorch")
    requested = accelerator.memory_bytes * util.value
    requested_fig = Figure(
        requested,
        "bytes",
        f"gpu_memory_utilization {util.value:g} x {_gib(accelerator.memory_bytes)} ({accelerator.source})",
    )

    # Every stage sizes its own cache; the engine runs with the fewest blocks (the min over workers).
    per, _ = kv_dtype(shape, kv_cache_dtype, dtype)
    whole = _stage_params(shape, Parallelism())[0]
    stage_weights = [weights.value * params / whole for params in _stage_params(shape, parallel)]
    stage_kv = _stage_kv_per_token(shape, parallel, per)
    stage_tokens = []
    stage_free = []
    for w, kv in zip(stage_weights, stage_kv, strict=True):
        free = requested - w - activation.value - non_torch.value
        stage_free.append(free)
        stage_tokens.append(max(0, int(free // (kv * block))) * block)
    worst = min(range(len(stage_tokens)), key=stage_tokens.__getitem__)
    kv_free = stage_free[worst]
    tokens = stage_tokens[worst]
    kv_cache = Figure(
        max(kv_free, 0),
        "bytes",
        f"{_gib(requested)} requested - {_gib(stage_weights[worst])} weights - {_gib(activation.value)} activation - "
        f"{_gib(non_torch.value)} non-torch, per GPU",
    )
    kv_tokens = Figure(
        tokens,
        "tokens",
        f"{_gib(max(kv_free, 0))} / {kv_token_gpu.value:,} bytes per token, in whole blocks of {block} tokens",
    )
    sequences = tokens // model_len.value
    concurrent = Figure(
        sequences,
        "sequences",
        f"{tokens:,} KV tokens / {model_len.value:,} max_model_len ({tokens / model_len.value:.2f} full-length "
        "sequences at once; shorter ones share the cache)",
    )
    safe = safe_gpu_memory_utilization(
        accelerator, gpu_share=gpu_share, enforce_eager=enforce_eager, cuda_graph_bytes=cuda_graph_bytes
    )
    one_sequence = math.ceil(model_len.value / block) * block
    need = max(
        w + activation.value + non_torch.value + one_sequence * kv
        for w, kv in zip(stage_weights, stage_kv, strict=True)
    )
    minimum = Figure(
        _ceil2(need / accelerator.memory_bytes),
        "fraction",
        f"({_gib(max(stage_weights))} weights + {_gib(activation.value)} activation + {_gib(non_torch.value)} "
        f"non-torch + KV for one {model_len.value:,}-token sequence) / {_gib(accelerator.memory_bytes)}",
    )

    problems = []
    if kv_free <= 0:
        problems.append(
            f"no memory is left for the KV cache: {_gib(requested)} requested holds {_gib(stage_weights[worst])} of "
            f'weights and {_gib(activation.value + non_torch.value)} of activations; vLLM fails with "No available '
            'memory for the cache blocks" (raise gpu_memory_utilization or tensor_parallel_size)'
        )
    elif tokens < one_sequence:
        problems.append(
            f"max_model_len {model_len.value:,} ({model_len.source}) needs {_gib(one_sequence * kv_token_gpu.value)} "
            f"of KV cache per GPU but {_gib(kv_free)} fits ({tokens:,} tokens): vLLM refuses to start (vllm#2418); "
            f"set max_model_len to at most {tokens:,} or give the cache more memory"
        )
    if util.value > safe.value:
        problems.append(
            f"gpu_memory_utilization {util.value:g} is above the safe {safe.value:g} ({safe.source}): "
            "vLLM may OOM at start or when it captures CUDA graphs"
        )
    if minimum.value > safe.value:
        problems.append(
            f"the model needs gpu_memory_utilization {minimum.value:g} but {safe.value:g} is safe: it does not fit "
            f"{parallel.gpus} x {accelerator.name} at this max_model_len"
        )
    return MemoryPlan(
        parallel=parallel,
        gpu_memory_utilization=util,
        weights=weights,
        weights_per_gpu=weights_gpu,
        kv_bytes_per_token=kv_token,
        kv_bytes_per_token_per_gpu=kv_token_gpu,
        requested_per_gpu=requested_fig,
        activation_per_gpu=activation,
        non_torch_per_gpu=non_torch,
        kv_cache_per_gpu=kv_cache,
        kv_cache_tokens=kv_tokens,
        max_model_len=model_len,
        max_concurrent_sequences=concurrent,
        max_num_seqs=seqs,
        safe_gpu_memory_utilization=safe,
        minimum_gpu_memory_utilization=minimum,
        problems=tuple(problems),
    )
