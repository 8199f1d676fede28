"""GPU memory and KV-cache planning for one vLLM replica, as vLLM itself accounts it at start.

vLLM (vllm/v1/worker/gpu_worker.py, per release in apps.llm.vllm_versions) requests
`total CUDA memory x gpu_memory_utilization` per GPU and gives the KV cache what its profile leaves of that:

    KV = requested - weights - activation peak - non-torch growth [- CUDA graph estimate, from 0.20]

then splits the KV memory into blocks over the layers' groups (apps.llm.kv_layout) and refuses to start when one
`max_model_len` request does not fit. The weights are the model's parameters on the fullest GPU (TP splits the
matrices, PP the layers); the profile's figures are estimates (apps.llm.profile). Every figure keeps its source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from apps.llm import kv_layout, profile
from apps.llm.accelerators import Accelerator
from apps.llm.model_memory import (
    Figure,
    Parallelism,
    PlanError,
    ceil2,
    check_parallelism,
    floor2,
    gib,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_dtype,
    kv_heads_per_gpu,
    pipeline_partitions,
    stage_params,
    weight_dtype,
    weights_bytes,
    weights_bytes_per_gpu,
)
from apps.llm.shapes import DTYPE_BYTES, ModelShape
from apps.llm.vllm_versions import Accounting, accounting

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM engine arguments that decide its memory; None is vLLM's default."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None  # -1: vLLM fits it to the KV cache
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    kv_cache_dtype: str | None = "auto"
    dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    performance_mode: str = "balanced"
    offline: bool = False  # vLLM's LLM class rather than the OpenAI server serve.llm runs

    @property
    def parallel(self) -> Parallelism:
        return Parallelism(self.tensor_parallel_size, self.pipeline_parallel_size)


def safe_gpu_memory_utilization(
    accelerator: Accelerator,
    *,
    gpu_share: float = 1.0,
    enforce_eager: bool = False,
    tensor_parallel_size: int = 1,
    layers: int = 80,
    vllm: Accounting | None = None,
) -> Figure:
    """The highest utilisation whose budget plus what lies outside it (CUDA context, NCCL, and CUDA graphs where
    vLLM captures them outside the budget) fits this replica's share of the GPU.

    `gpu_share` is the part of the GPU this replica may take: Ray's fractional GPU, or 1 / the replicas sharing it.
    vLLM's limit is a request, not a boundary (vllm PR#1821): the shares must leave each one's overhead free.
    """
    if not 0 < gpu_share <= 1:
        raise PlanError(f"a GPU share is in (0, 1], got {gpu_share}")
    vllm = vllm or accounting()[0]
    outside = profile.outside_budget(tensor_parallel_size, vllm)
    extra, graphs_why = outside.value, ""
    if not vllm.cuda_graphs_in_budget and not enforce_eager:
        graphs = profile.CUDA_GRAPH_BASE_BYTES + layers * profile.CUDA_GRAPH_PER_LAYER_BYTES
        extra += graphs
        graphs_why = f" and {gib(graphs)} of CUDA graphs captured after the KV cache"
    value = floor2(gpu_share - extra / accelerator.memory_bytes)
    share_why = "the whole GPU" if gpu_share == 1 else f"a {gpu_share:g} share of the GPU"
    return Figure(
        max(value, 0.0),
        "fraction",
        f"{share_why} less {gib(outside.value)} outside {vllm.label}'s budget ({outside.source}){graphs_why}, "
        f"of {accelerator.source}",
    )


# --- the plan -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPlan:
    vllm: str
    parallel: Parallelism
    gpu_memory_utilization: Figure
    weights: Figure
    weights_per_gpu: Figure
    kv_bytes_per_token: Figure
    kv_bytes_per_token_per_gpu: Figure
    total_per_gpu: Figure
    requested_per_gpu: Figure
    activation_per_gpu: Figure
    non_torch_per_gpu: Figure
    cuda_graphs_per_gpu: Figure
    outside_budget_per_gpu: Figure
    kv_cache_per_gpu: Figure
    kv_cache_tokens: Figure
    max_concurrency: Figure
    max_model_len: Figure
    max_num_seqs: Figure
    max_num_batched_tokens: Figure
    safe_gpu_memory_utilization: Figure
    minimum_gpu_memory_utilization: Figure
    problems: tuple[str, ...]
    cuda_graphs_in_budget: bool = False
    layout: kv_layout.Layout | None = field(default=None, repr=False)
    num_blocks: int = 0
    # What the plan was made from, so a suggestion can be checked by planning it (replan).
    inputs: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def replan(self, **changes: Any) -> MemoryPlan:
        """The same plan with some engine settings changed: how a suggested value is checked before it is given."""
        settings = replace(self.inputs["settings"], **changes)
        return plan_memory(
            self.inputs["shape"],
            self.inputs["accelerator"],
            settings,
            vllm=self.inputs["vllm"],
            vllm_source=self.vllm,
            gpu_share=self.inputs["gpu_share"],
        )

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def max_concurrent_sequences(self) -> Figure:
        return Figure(int(self.max_concurrency.value), "sequences", self.max_concurrency.source)

    def figures(self) -> dict[str, Figure]:
        return {name: value for name, value in vars(self).items() if isinstance(value, Figure)}

    def memory(self) -> dict[str, dict[str, Any]]:
        """Where each GPU's memory goes, part by part, in bytes with the source of each."""
        graphs_inside = self.cuda_graphs_in_budget
        parts = {
            "weights": self.weights_per_gpu,
            "activation_peak": self.activation_per_gpu,
            "non_torch": self.non_torch_per_gpu,
            "cuda_graphs": self.cuda_graphs_per_gpu,
            "kv_cache": self.kv_cache_per_gpu,
            "outside_budget": self.outside_budget_per_gpu,
        }
        answer = {name: {"bytes": int(f.value), "source": f.source} for name, f in parts.items()}
        answer["cuda_graphs"]["inside_budget"] = graphs_inside
        used = sum(int(f.value) for f in parts.values())
        answer["total"] = {"bytes": int(self.total_per_gpu.value), "source": self.total_per_gpu.source}
        answer["requested"] = {"bytes": int(self.requested_per_gpu.value), "source": self.requested_per_gpu.source}
        answer["unused"] = {
            "bytes": max(0, int(self.total_per_gpu.value) - used),
            "source": "what neither the budget nor the memory outside it takes",
        }
        return answer

    def suggestions(self) -> dict[str, Any]:
        tokens = int(self.kv_cache_tokens.value)
        top = int(self.max_model_len.value)
        shape = self.inputs.get("shape")
        if shape is not None and shape.derived_max_model_len:
            top = min(top, shape.derived_max_model_len)  # vLLM refuses more than the model's context
        fit_len = 0
        if self.layout is not None and self.num_blocks:
            fit_len = kv_layout.fit_model_len(
                self.layout, self.num_blocks, max(top, 1), int(self.max_num_batched_tokens.value)
            )
        return {
            "max_model_len": min(fit_len, top) or None,
            "gpu_memory_utilization": {
                "minimum": self.minimum_gpu_memory_utilization.value,
                "safe": self.safe_gpu_memory_utilization.value,
            },
            "kv_cache_tokens": tokens,
            "engine_kwargs": self._engine_kwargs(min(fit_len, top)),
        }

    def _engine_kwargs(self, fit_len: int) -> dict[str, Any]:
        util = self.gpu_memory_utilization.value
        if util > self.safe_gpu_memory_utilization.value:
            util = self.safe_gpu_memory_utilization.value
        elif util < self.minimum_gpu_memory_utilization.value <= self.safe_gpu_memory_utilization.value:
            util = self.minimum_gpu_memory_utilization.value
        kwargs: dict[str, Any] = {
            "tensor_parallel_size": self.parallel.tensor,
            "pipeline_parallel_size": self.parallel.pipeline,
            "gpu_memory_utilization": util,
            "max_model_len": fit_len or int(self.max_model_len.value),
            "max_num_seqs": int(self.max_num_seqs.value),
        }
        return kwargs

    def as_dict(self) -> dict[str, Any]:
        return {
            "vllm_version": self.vllm,
            "kv_cache_tokens": int(self.kv_cache_tokens.value),
            "max_concurrency": round(self.max_concurrency.value, 2),
            "fits": self.fits,
            "memory": self.memory(),
            "problems": list(self.problems),
            "suggestions": self.suggestions(),
            "figures": {name: asdict(f) for name, f in self.figures().items()},
        }


def _settings_figures(shape: ModelShape, gpu: Accelerator, s: EngineSettings, vllm: Accounting):
    if s.gpu_memory_utilization is None:
        util = Figure(DEFAULT_GPU_MEMORY_UTILIZATION, "fraction", "unset: vLLM's default")
    elif not 0 < s.gpu_memory_utilization <= 1:
        raise PlanError(
            f"gpu_memory_utilization is in (0, 1], got {s.gpu_memory_utilization}", "gpu_memory_utilization"
        )
    else:
        util = Figure(s.gpu_memory_utilization, "fraction", "engine_kwargs gpu_memory_utilization")
    default_tokens, default_seqs, why = profile.batch_defaults(gpu, vllm, offline=s.offline)
    doubled = s.performance_mode == "throughput" and vllm.performance_mode
    if doubled:
        default_tokens, default_seqs, why = 2 * default_tokens, 2 * default_seqs, f"{why}, doubled by performance_mode"
    seqs = (
        Figure(s.max_num_seqs, "sequences", "engine_kwargs max_num_seqs")
        if s.max_num_seqs
        else Figure(default_seqs, "sequences", f"unset: {why}")
    )
    batched = (
        Figure(s.max_num_batched_tokens, "tokens", "engine_kwargs max_num_batched_tokens")
        if s.max_num_batched_tokens
        else Figure(default_tokens, "tokens", f"unset: {why}")
    )
    derived = shape.derived_max_model_len
    if s.max_model_len is None or s.max_model_len == -1:
        if not derived:
            raise PlanError(
                "max_model_len is unset and the model config has no max_position_embeddings to default to",
                "max_model_len",
            )
        if s.max_model_len == -1 and not vllm.auto_fit_model_len:
            raise PlanError(
                f"max_model_len -1 (fit to memory) needs vLLM 0.14 or later; {vllm.label} is planned", "max_model_len"
            )
        how = "-1: vLLM fits it to the KV cache, up to" if s.max_model_len == -1 else "unset: vLLM takes"
        model_len = Figure(derived, "tokens", f"{how} the model's context length")
    else:
        model_len = Figure(s.max_model_len, "tokens", "engine_kwargs max_model_len")
    return util, seqs, batched, model_len


def plan_memory(
    shape: ModelShape,
    accelerator: Accelerator,
    settings: EngineSettings | None = None,
    *,
    vllm: Accounting | None = None,
    vllm_source: str | None = None,
    gpu_share: float = 1.0,
    activation_bytes: int | None = None,
) -> MemoryPlan:
    """Weights, KV cache and concurrency of one replica, as the given vLLM would size them at start."""
    s = settings or EngineSettings()
    if vllm is None:
        vllm, vllm_source = accounting()
    vllm_source = vllm_source or vllm.label
    parallel = s.parallel
    check_parallelism(shape, parallel)
    util, seqs, batched, model_len = _settings_figures(shape, accelerator, s, vllm)
    block = s.block_size or DEFAULT_BLOCK_SIZE
    name, _ = weight_dtype(shape, s.dtype)
    dtype_bytes = DTYPE_BYTES[name]

    weights = weights_bytes(shape, s.dtype)
    whole = stage_params(shape, Parallelism())[0]
    stage_weights = [weights.value * params / whole for params in stage_params(shape, parallel)]
    weights_gpu = weights_bytes_per_gpu(shape, parallel, s.dtype)
    kv_token = kv_bytes_per_token(shape, s.kv_cache_dtype, s.dtype)
    kv_token_gpu = kv_bytes_per_token_per_gpu(shape, parallel, s.kv_cache_dtype, s.dtype)
    per, _ = kv_dtype(shape, s.kv_cache_dtype, s.dtype)
    heads = kv_heads_per_gpu(shape, parallel.tensor)
    page = 2 * block * heads * shape.head_dim * per

    total = accelerator.memory_bytes
    requested = total * util.value
    total_fig = Figure(total, "bytes", accelerator.source)
    requested_fig = Figure(
        requested, "bytes", f"gpu_memory_utilization {util.value:g} x {gib(total)} CUDA total ({accelerator.source})"
    )
    graphs = profile.cuda_graphs(shape, shape.num_layers // parallel.pipeline, s.enforce_eager, vllm)
    graphs_fig = Figure(graphs.value, "bytes", graphs.source)
    in_budget = vllm.cuda_graphs_in_budget and graphs.value > 0
    non_torch = profile.non_torch(parallel.tensor, vllm)
    non_torch_fig = Figure(non_torch.value, "bytes", non_torch.source)
    outside = profile.outside_budget(parallel.tensor, vllm)

    partitions = pipeline_partitions(shape.num_layers, parallel.pipeline)
    windows = list(shape.layer_windows or [None] * shape.num_layers)
    stage_free, stage_blocks, stage_layouts, activations = [], [], [], []
    start = 0
    for index, (w, layers) in enumerate(zip(stage_weights, partitions, strict=True)):
        last = index == len(partitions) - 1
        if activation_bytes is not None:
            act = profile.Estimate(activation_bytes, "as measured")
        else:
            act = profile.activation(
                shape,
                parallel.tensor,
                batched_tokens=int(batched.value),
                max_num_seqs=int(seqs.value),
                dtype_bytes=dtype_bytes,
                vllm=vllm,
                last_stage=last,
            )
        activations.append(act)
        if s.kv_cache_memory_bytes:
            free = float(s.kv_cache_memory_bytes)
        else:
            free = requested - w - act.value - non_torch.value - (graphs.value if in_budget else 0)
        lay = kv_layout.layout(windows[start : start + layers], page, block, vllm)
        start += layers
        stage_free.append(free)
        stage_layouts.append(lay)
        stage_blocks.append(kv_layout.blocks(lay, free))
    worst = min(range(len(stage_blocks)), key=stage_blocks.__getitem__)
    lay, num_blocks, kv_free = stage_layouts[worst], stage_blocks[worst], stage_free[worst]
    activation = Figure(activations[worst].value, "bytes", activations[worst].source)
    if s.num_gpu_blocks_override:
        num_blocks = s.num_gpu_blocks_override

    length = int(model_len.value)
    if s.max_model_len == -1:
        fitted = kv_layout.fit_model_len(lay, num_blocks, length, int(batched.value))
        if fitted:
            how = "fits in full" if fitted >= length else f"cut from {length:,} to fit the KV cache"
            model_len = Figure(min(fitted, length), "tokens", f"-1: vLLM's auto-fit; the model's context {how}")
            length = int(model_len.value)
    tokens = kv_layout.logged_tokens(lay, num_blocks, length, int(batched.value), vllm) if num_blocks else 0
    conc = kv_layout.concurrency(lay, num_blocks, length, int(batched.value)) if num_blocks else 0.0

    if s.kv_cache_memory_bytes:
        kv_source = f"kv_cache_memory_bytes {s.kv_cache_memory_bytes:,}: vLLM skips profiling and takes it as given"
    else:
        graphs_part = f" - {gib(graphs.value)} CUDA graphs" if in_budget else ""
        kv_source = (
            f"{gib(requested)} requested - {gib(stage_weights[worst])} weights - {gib(activation.value)} activation "
            f"- {gib(non_torch.value)} non-torch{graphs_part}, per GPU ({vllm_source})"
        )
    kv_cache = Figure(max(kv_free, 0), "bytes", kv_source)
    groups = f" in {len(lay.groups)} groups of {lay.group_size} layers" if lay.hybrid else ""
    override = f" (num_gpu_blocks_override {s.num_gpu_blocks_override:,})" if s.num_gpu_blocks_override else ""
    kv_tokens = Figure(
        tokens,
        "tokens",
        f"{num_blocks:,} blocks{override} of {block} tokens{groups}, {lay.bytes_per_block:,} bytes each, as "
        f"{vllm.label} logs it",
    )
    concurrency = Figure(
        conc, "requests", f"{num_blocks:,} blocks / the blocks one {length:,}-token request holds in every group"
    )
    safe = safe_gpu_memory_utilization(
        accelerator,
        gpu_share=gpu_share,
        enforce_eager=s.enforce_eager,
        tensor_parallel_size=parallel.tensor,
        layers=shape.num_layers // parallel.pipeline,
        vllm=vllm,
    )
    one_request = kv_layout.blocks_per_request(lay, length, int(batched.value))
    need = max(
        stage_weights[i]
        + activations[i].value
        + non_torch.value
        + (graphs.value if in_budget else 0)
        + (one_request + 1) * stage_layouts[i].bytes_per_block  # and the null block
        for i in range(len(stage_weights))
    )
    minimum = Figure(
        ceil2(need / total),
        "fraction",
        f"(weights + activation + non-torch{' + CUDA graphs' if in_budget else ''} + the KV blocks of one "
        f"{length:,}-token request) / {gib(total)}",
    )
    overflow = over_context(shape, s)
    problems = [overflow] if overflow else []
    problems += _problems(
        util=util,
        safe=safe,
        minimum=minimum,
        kv_free=kv_free,
        num_blocks=num_blocks,
        one_request=one_request,
        length=length,
        model_len=model_len,
        tokens=tokens,
        parallel=parallel,
        accelerator=accelerator,
        vllm=vllm,
        explicit_memory=bool(s.kv_cache_memory_bytes),
    )
    return MemoryPlan(
        vllm=vllm_source,
        parallel=parallel,
        gpu_memory_utilization=util,
        weights=weights,
        weights_per_gpu=weights_gpu,
        kv_bytes_per_token=kv_token,
        kv_bytes_per_token_per_gpu=kv_token_gpu,
        total_per_gpu=total_fig,
        requested_per_gpu=requested_fig,
        activation_per_gpu=activation,
        non_torch_per_gpu=non_torch_fig,
        cuda_graphs_per_gpu=graphs_fig,
        outside_budget_per_gpu=Figure(outside.value, "bytes", outside.source),
        kv_cache_per_gpu=kv_cache,
        kv_cache_tokens=kv_tokens,
        max_concurrency=concurrency,
        max_model_len=model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        safe_gpu_memory_utilization=safe,
        minimum_gpu_memory_utilization=minimum,
        problems=tuple(problems),
        cuda_graphs_in_budget=in_budget,
        layout=lay,
        num_blocks=num_blocks,
        inputs={"shape": shape, "accelerator": accelerator, "settings": s, "vllm": vllm, "gpu_share": gpu_share},
    )


def over_context(shape: ModelShape, s: EngineSettings) -> str | None:
    """Why vLLM refuses a max_model_len above the model's context, or None."""
    derived = shape.derived_max_model_len
    if derived and s.max_model_len and s.max_model_len > derived:
        return (
            f"max_model_len {s.max_model_len:,} is above the model's context length {derived:,} "
            "(max_position_embeddings, with rope scaling): vLLM refuses it"
        )
    return None


def _problems(
    *,
    util,
    safe,
    minimum,
    kv_free,
    num_blocks,
    one_request,
    length,
    model_len,
    tokens,
    parallel,
    accelerator,
    vllm,
    explicit_memory,
) -> list[str]:
    problems = []
    if kv_free <= 0 or num_blocks == 0:
        problems.append(
            f"no memory is left for the KV cache at gpu_memory_utilization {util.value:g}: {vllm.label} fails with "
            '"No available memory for the cache blocks" (raise gpu_memory_utilization or tensor_parallel_size)'
        )
    elif num_blocks - 1 < one_request:
        problems.append(
            f"max_model_len {length:,} ({model_len.source}) needs {one_request:,} KV blocks but {num_blocks - 1:,} are "
            f"usable ({tokens:,} tokens): {vllm.label} refuses to start; set max_model_len lower or give the cache "
            "more memory"
        )
    if util.value > safe.value and not explicit_memory:
        problems.append(
            f"gpu_memory_utilization {util.value:g} is above the safe {safe.value:g} ({safe.source}): {vllm.label} "
            "refuses to start when less is free, or OOMs at CUDA graph capture"
        )
    if minimum.value > safe.value and not explicit_memory:
        problems.append(
            f"the model needs gpu_memory_utilization {minimum.value:g} but {safe.value:g} is the most that is safe: "
            f"it does not fit {parallel.gpus} x {accelerator.name} at max_model_len {length:,}"
        )
    return problems


def tradeoff(plan: MemoryPlan, lengths: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """Concurrency at several max_model_len values on the same KV cache: the trade-off the operator chooses on."""
    if plan.layout is None or not plan.num_blocks:
        return []
    top = int(plan.max_model_len.value)
    lengths = lengths or tuple(
        sorted({min(top, n) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)} | {top})
    )
    batched = int(plan.max_num_batched_tokens.value)
    rows = []
    for length in lengths:
        conc = kv_layout.concurrency(plan.layout, plan.num_blocks, length, batched)
        rows.append({"max_model_len": length, "max_concurrency": round(conc, 2), "fits": conc >= 1})
    return rows
