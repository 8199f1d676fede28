"""The capacity planner's request and answer: a config.json and engine settings in, vLLM's KV cache out.

`plan_capacity` is what `POST /api/v2/llm/plan/` and the "LLM capacity planner" page call. Its answer's field
names (kv_cache_tokens, max_concurrency, fits, memory, problems, suggestions) are a published contract. Bad input
raises PlanInputError naming the field, so both callers can answer 400 with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

from apps.llm.accelerators import KNOWN_ACCELERATORS, UnknownAccelerator, accelerator
from apps.llm.planner import EngineSettings, MemoryPlan, PlanError, over_context, plan_memory, tradeoff
from apps.llm.shapes import ModelConfigError, UnsupportedModel, parse_hf_config
from apps.llm.vllm_versions import UnknownVersion, accounting

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
PERFORMANCE_MODES = ("balanced", "throughput", "interactivity")
# A bound on what one request may ask to plan: far above any GPU built, small enough that no input loops long.
MAX_GPUS = 1024
MAX_BLOCK_SIZE = 1024
MAX_TOKENS = 1 << 24
# Far above any decoder built (hundreds of layers); the parser and the planner loop over the layers.
MAX_LAYERS = 4096
MAX_GPU_MEMORY_BYTES = 1 << 50


class PlanInputError(ValueError):
    """One field of the request is wrong; `field` names it as the request spelled it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@overload
def _int(payload: Mapping, field: str, default: int, *, low: int, high: int, allow: tuple[int, ...] = ()) -> int: ...
@overload
def _int(
    payload: Mapping, field: str, default: None, *, low: int, high: int, allow: tuple[int, ...] = ()
) -> int | None: ...
def _int(
    payload: Mapping, field: str, default: int | None, *, low: int, high: int, allow: tuple[int, ...] = ()
) -> int | None:
    # JSON's null is an unset field, as in vLLM's engine arguments: its default, not a None the planner trips on.
    value = default if payload.get(field) is None else payload[field]
    if value is None or value in allow:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError(field, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise PlanInputError(field, f"must be between {low:,} and {high:,}, got {value:,}")
    return value


def _float(payload: Mapping, field: str, default: float, *, low: float, high: float, low_open: bool = True) -> float:
    value = default if payload.get(field) is None else payload[field]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanInputError(field, f"must be a number, got {value!r}")
    if not low <= value <= high or (low_open and value == low):  # NaN fails the first test too
        bracket = "(" if low_open else "["
        shown = f"{value:g}" if isinstance(value, float) else f"{value:,}"  # an int past a float's range too
        raise PlanInputError(field, f"must be in {bracket}{low:g}, {high:g}], got {shown}")
    return float(value)


def _choice(payload: Mapping, field: str, default: str, choices: tuple[str, ...]) -> str:
    value = payload.get(field, default)
    if value not in choices:
        raise PlanInputError(field, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _bool(payload: Mapping, field: str) -> bool:
    value = payload.get(field, False)
    if not isinstance(value, bool):
        raise PlanInputError(field, f"must be true or false, got {value!r}")
    return value


def engine_settings(payload: Mapping) -> EngineSettings:
    """The engine settings of a request, each checked; unknown ones are vLLM's defaults."""
    return EngineSettings(
        tensor_parallel_size=_int(payload, "tensor_parallel_size", 1, low=1, high=MAX_GPUS),
        pipeline_parallel_size=_int(payload, "pipeline_parallel_size", 1, low=1, high=MAX_GPUS),
        gpu_memory_utilization=_float(payload, "gpu_memory_utilization", 0.9, low=0.0, high=1.0),
        max_model_len=_int(payload, "max_model_len", None, low=1, high=MAX_TOKENS, allow=(-1,)),
        block_size=_int(payload, "block_size", 16, low=1, high=MAX_BLOCK_SIZE),
        max_num_seqs=_int(payload, "max_num_seqs", None, low=1, high=MAX_TOKENS),
        max_num_batched_tokens=_int(payload, "max_num_batched_tokens", None, low=1, high=MAX_TOKENS),
        enforce_eager=_bool(payload, "enforce_eager"),
        kv_cache_dtype=_choice(payload, "kv_cache_dtype", "auto", KV_CACHE_DTYPES),
        kv_cache_memory_bytes=_int(payload, "kv_cache_memory_bytes", None, low=1, high=1 << 50),
        num_gpu_blocks_override=_int(payload, "num_gpu_blocks_override", None, low=1, high=MAX_TOKENS),
        performance_mode=_choice(payload, "performance_mode", "balanced", PERFORMANCE_MODES),
    )


def plan_request(payload: Any) -> MemoryPlan:
    """The plan for one request; PlanInputError names the first field that is wrong."""
    if not isinstance(payload, Mapping):
        raise PlanInputError("detail", "the request body must be a JSON object")
    config = payload.get("config")
    if not isinstance(config, Mapping):
        raise PlanInputError("config", "give the model's config.json as a JSON object")
    for part in (config, config.get("text_config")):
        layers = part.get("num_hidden_layers") if isinstance(part, Mapping) else None
        if isinstance(layers, int) and layers > MAX_LAYERS:
            raise PlanInputError("config", f"num_hidden_layers must be at most {MAX_LAYERS:,}, got {layers:,}")
    try:
        shape = parse_hf_config(config)
    except UnsupportedModel as exc:
        raise PlanInputError("config", f"cannot be planned: {exc}") from exc
    except ModelConfigError as exc:
        raise PlanInputError("config", str(exc)) from exc
    except (TypeError, ValueError, LookupError, OverflowError) as exc:  # a value of the wrong type deep in the JSON
        raise PlanInputError("config", f"cannot be read: {exc}") from exc
    memory = payload.get("gpu_memory_bytes")
    if memory is not None and (
        isinstance(memory, bool) or not isinstance(memory, int) or not 0 < memory <= MAX_GPU_MEMORY_BYTES
    ):
        raise PlanInputError(
            "gpu_memory_bytes", f"must be a positive integer of bytes, at most {MAX_GPU_MEMORY_BYTES:,}, got {memory!r}"
        )
    name = payload.get("accelerator")
    if name is not None and not isinstance(name, str):
        raise PlanInputError("accelerator", f"must be a Ray accelerator type such as H100, got {name!r}")
    try:
        gpu = accelerator(name, memory_bytes=memory)
    except UnknownAccelerator as exc:
        raise PlanInputError(
            "accelerator", f"{exc} (or give gpu_memory_bytes; known: {', '.join(KNOWN_ACCELERATORS)})"
        ) from exc
    settings = engine_settings(payload)
    version = payload.get("vllm_version")
    if version is not None and not isinstance(version, str):
        raise PlanInputError("vllm_version", f"must be a version string such as 0.11.0, got {version!r}")
    try:
        vllm, vllm_source = accounting(version, ray_version=payload.get("ray_version"))
    except UnknownVersion as exc:
        raise PlanInputError("vllm_version", str(exc)) from exc
    if refused := over_context(shape, settings):
        raise PlanInputError("max_model_len", refused)
    try:
        return plan_memory(shape, gpu, settings, vllm=vllm, vllm_source=vllm_source)
    except PlanError as exc:
        raise PlanInputError(exc.field or "config", str(exc)) from exc
    except OverflowError as exc:  # sizes past a float's range: no GPU holds such a model
        raise PlanInputError("config", f"its sizes are too large to plan: {exc}") from exc


def plan_capacity(payload: Any) -> dict[str, Any]:
    """The API's answer for one request (see the module's docstring for the contract)."""
    plan = plan_request(payload)
    answer = plan.as_dict()
    answer["tradeoff"] = tradeoff(plan)
    return answer
