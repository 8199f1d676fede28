"""The memory plan of a recognised serve.llm deployment: its engine settings fed to the planner."""

from __future__ import annotations

from apps.llm.accelerators import accelerator
from apps.llm.planner import EngineSettings, MemoryPlan, PlanError, plan_memory
from apps.llm.recognise import LLMModel
from apps.llm.shapes import ModelShape
from apps.llm.vllm_versions import UnknownVersion, accounting


def plan_llm_model(
    model: LLMModel, shape: ModelShape, *, memory_gib: float | None = None, ray_version: str | None = None
) -> MemoryPlan:
    """Plan one replica of `model` on the vLLM its cluster's Ray pins; an unknown accelerator raises
    UnknownAccelerator (ask for memory)."""
    if model.errors:
        raise PlanError(f"{model.deployment_name} has config errors: {'; '.join(model.errors)}")
    if not model.engine:
        raise PlanError(f"{model.deployment_name}: its engine settings are not visible in the Serve config")
    gpu = accelerator(model.accelerator_type, memory_gib)
    engine = {key: setting.value for key, setting in model.engine.items()}
    if engine.get("quantization"):
        raise PlanError(f"{model.deployment_name} is quantized ({engine['quantization']}): not sized by this planner")
    try:
        vllm, source = accounting(ray_version=ray_version or None)
    except UnknownVersion as exc:
        raise PlanError(str(exc)) from exc
    settings = EngineSettings(
        tensor_parallel_size=engine["tensor_parallel_size"],
        pipeline_parallel_size=engine["pipeline_parallel_size"],
        gpu_memory_utilization=engine["gpu_memory_utilization"],
        max_model_len=engine["max_model_len"],
        max_num_seqs=engine["max_num_seqs"],
        max_num_batched_tokens=engine["max_num_batched_tokens"],
        dtype=engine["dtype"],
        kv_cache_dtype=engine["kv_cache_dtype"],
        block_size=engine["block_size"],
        enforce_eager=bool(engine["enforce_eager"]),
    )
    return plan_memory(shape, gpu, settings, vllm=vllm, vllm_source=source, gpu_share=model.gpu_fraction or 1.0)
