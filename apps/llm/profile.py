"""What vLLM's start-up profile measures besides the weights: the activation peak, memory outside torch, CUDA graphs.

vLLM does not compute these, it measures them (Worker.determine_available_memory: profile_run under
memory_profiling, then profile_cudagraph_memory). The planner estimates each from the model's shape and the
engine settings, and errs high: a figure above what vLLM measures costs a few KV tokens, one below it advises a
setting vLLM refuses. The per-element constants were fitted to the start-up logs in tests/fixtures/llm/startup_logs
(their breakdown lines: "PyTorch activation peak memory", "non_torch_memory", "Estimated CUDA graph memory") and
then rounded up; bench/llm_planner.py shows the fit on every log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.llm.accelerators import GIB, MIB, Accelerator
from apps.llm.shapes import ModelShape
from apps.llm.vllm_versions import Accounting

# _dummy_sampler_run samples max_num_seqs rows of full-vocabulary logits with top-k and top-p set: the bf16 logits,
# their float32 copy, sorted values and int64 indices, masks, softmax and the scattered result are alive at once
# in 0.8 (about 30 bytes a logit by the sampler's code, more as measured); later releases hold less. Every
# TP rank samples the whole vocabulary, so this does not shrink with tensor parallelism. 0.19's logs fit 14-15 bytes
# (Llama-3.1-8B and Qwen3-8B at 1,024 sequences); the one 0.8 record needs about 40.
SAMPLER_BYTES_PER_LOGIT_V0_8 = 42
SAMPLER_BYTES_PER_LOGIT = 16
# The CUDA context (and, from vLLM 0.11, NCCL communicators) are in place before vLLM's baseline snapshot: they
# take memory the gpu_memory_utilization budget does not count, and the start fails when the budget plus them
# exceeds the GPU.
CUDA_CONTEXT_BYTES = 640 * MIB
NCCL_BYTES = 1 * GIB
# Memory outside torch that grows between the snapshot and the end of the profile run: cuBLAS and attention
# workspaces on one GPU (0.25 GiB logged on H100s), plus the buffers NCCL and custom all-reduce allocate at their
# first collective under tensor parallelism (2.07-2.13 GiB logged at TP 2 and 4, 1.38 GiB at TP 2 on 0.10.2).
NON_TORCH_TP1_BYTES = 288 * MIB
NON_TORCH_TP_BYTES = 2304 * MIB
# profile_cudagraph_memory: the first capture's buffers plus a little per graph and layer (vLLM logs "Estimated
# CUDA graph memory: X GiB total"; 0.52 GiB for a 36-layer 8B model at 51 + 35 capture sizes).
CUDA_GRAPH_BASE_BYTES = 256 * MIB
CUDA_GRAPH_PER_LAYER_BYTES = 10 * MIB


@dataclass(frozen=True)
class Estimate:
    value: int
    source: str


def batch_defaults(gpu: Accelerator, vllm: Accounting, *, offline: bool = False) -> tuple[int, int, str]:
    """max_num_batched_tokens and max_num_seqs vLLM picks when unset (EngineArgs.get_batch_defaults).

    serve.llm runs vLLM's OpenAI server context; `offline` is vLLM's LLM class (scripts, Ray Data batch)."""
    context = "LLM class" if offline else "OpenAI server, as serve.llm runs it"
    if vllm.version >= (0, 18, 0) and gpu.memory_bytes >= 160 * GIB:
        return 16384, 1024, f"vLLM's default ({context}) for GPUs of 160 GiB or more"
    if gpu.memory_bytes >= 70 * GIB and (not gpu.is_a100 or vllm.version < (0, 9, 0)):
        return (16384 if offline else 8192), 1024, f"vLLM's default ({context}) for GPUs of 70 GiB or more"
    return (8192 if offline else 2048), 256, f"vLLM's default ({context}) on {gpu.name}"


def _mlp_width(shape: ModelShape, tp: int) -> int:
    if shape.is_moe:
        # A mixture of experts carries both (shapes.py sets them with num_experts).
        assert shape.experts_per_token is not None and shape.expert_intermediate_size is not None
        width = shape.experts_per_token * math.ceil(shape.expert_intermediate_size / tp)
        return width + math.ceil((shape.shared_expert_intermediate_size or 0) / tp)
    return math.ceil(shape.intermediate_size / tp)


def forward_bytes(shape: ModelShape, tp: int, tokens: int, dtype_bytes: int) -> int:
    """One layer's live tensors at `tokens`: residual and normed input, QKV, attention output, gate/up and act."""
    qkv = (shape.num_attention_heads // tp + 2 * max(1, shape.num_kv_heads // tp)) * shape.head_dim
    attn = shape.num_attention_heads // tp * shape.head_dim
    per_token = 3 * shape.hidden_size + qkv + attn + 3 * _mlp_width(shape, tp)
    router = tokens * shape.num_experts * 4 if shape.num_experts is not None else 0  # is_moe, narrowed
    return tokens * per_token * dtype_bytes + router


def encoder_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> int:
    """The vision tower's profile: its widest layer over a batch of the largest image, and the outputs it keeps."""
    if not shape.vision_parameters:
        return 0
    patches = tokens * 4  # 2 x 2 patches merge into one token (Qwen2-VL's spatial_merge_size)
    width = shape.vision_hidden_size
    inner = shape.vision_intermediate_size or 4 * width
    return patches * (4 * width + 6 * inner) * dtype_bytes + tokens * shape.hidden_size * dtype_bytes


def activation(
    shape: ModelShape,
    tp: int,
    *,
    batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int,
    vllm: Accounting,
    last_stage: bool = True,
) -> Estimate:
    """The torch peak of profile_run: the forward at batched tokens, then the sampler over max_num_seqs rows."""
    forward = forward_bytes(shape, tp, batched_tokens, dtype_bytes)
    kept = batched_tokens * shape.hidden_size * dtype_bytes  # the hidden states the sampler run starts from
    rows = min(max_num_seqs, batched_tokens)
    per_logit = SAMPLER_BYTES_PER_LOGIT_V0_8 if vllm.version < (0, 9, 0) else SAMPLER_BYTES_PER_LOGIT
    sampler = rows * shape.vocab_size * per_logit if last_stage else 0
    # The vision tower's profile covers one item of the largest size the budget admits (16,384 tokens for
    # Qwen2-VL's default max_pixels), never less than a step's tokens.
    encoder = encoder_bytes(shape, max(batched_tokens, 16384), dtype_bytes)
    value = kept + max(forward, sampler, encoder)
    parts = [
        f"{kept / GIB:.2f} GiB hidden states of {batched_tokens:,} tokens kept",
        f"the largest of the forward ({forward / GIB:.2f} GiB)",
        f"the sampler over {rows:,} sequences x {shape.vocab_size:,} vocabulary x {per_logit} bytes "
        f"({sampler / GIB:.2f} GiB)",
    ]
    if encoder:
        parts.append(f"the vision tower's profile ({encoder / GIB:.2f} GiB)")
    return Estimate(value, f"estimate of vLLM's profile_run peak: {parts[0]} plus {', '.join(parts[1:])}")


def non_torch(tp: int, vllm: Accounting) -> Estimate:
    """Memory outside torch that vLLM's profile counts against the budget."""
    value = NON_TORCH_TP1_BYTES if tp == 1 else NON_TORCH_TP_BYTES
    why = "cuBLAS and attention workspaces" if tp == 1 else "workspaces, NCCL and custom all-reduce buffers"
    if vllm.non_torch_includes_context:
        value += CUDA_CONTEXT_BYTES
        why += f", and the CUDA context ({vllm.label} counts everything outside torch)"
    return Estimate(value, f"estimate: {why}")


def outside_budget(tp: int, vllm: Accounting) -> Estimate:
    """Memory in use before vLLM's snapshot, which the budget does not count but the GPU must hold."""
    if vllm.non_torch_includes_context:
        return Estimate(0, f"none: {vllm.label} counts the CUDA context inside the budget")
    value = CUDA_CONTEXT_BYTES + (NCCL_BYTES if tp > 1 and vllm.nccl_before_snapshot else 0)
    nccl = " and NCCL's communicators" if tp > 1 and vllm.nccl_before_snapshot else ""
    return Estimate(value, f"estimate: the CUDA context{nccl}, in place before {vllm.label}'s baseline snapshot")


def cuda_graphs(shape: ModelShape, layers: int, enforce_eager: bool, vllm: Accounting) -> Estimate:
    if enforce_eager:
        return Estimate(0, "none: enforce_eager captures no CUDA graphs")
    value = CUDA_GRAPH_BASE_BYTES + layers * CUDA_GRAPH_PER_LAYER_BYTES
    where = (
        f"inside the budget: {vllm.label} subtracts its estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)"
        if vllm.cuda_graphs_in_budget
        else f"outside the budget: {vllm.label} captures them after the KV cache is allocated"
    )
    return Estimate(
        value,
        f"estimate: {CUDA_GRAPH_BASE_BYTES // MIB} MiB + {layers} layers x "
        f"{CUDA_GRAPH_PER_LAYER_BYTES // MIB} MiB, {where}",
    )
