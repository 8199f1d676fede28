"""The GPU memory planner against figures computed by hand for published model shapes.

Each expected value is written out as the arithmetic that gives it, from the shapes in tests/fixtures/llm:
Llama-3-8B (32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128, MLP 14336, vocabulary 128256),
Qwen2.5-32B (64 layers, hidden 5120, 40 heads, 8 KV heads, head dim 128, MLP 27648, vocabulary 152064, q/k/v
biases) and Mixtral-8x7B (Llama-3-8B's attention, 8 experts of 14336 with 2 per token, vocabulary 32000).
All three are bfloat16 with untied embeddings. An H100 is 81,559 MiB = 85,520,809,984 bytes.
"""

from __future__ import annotations

import math

import pytest

from apps.llm.accelerators import GIB, MIB, UnknownAccelerator, accelerator
from apps.llm.planner import (
    CUDA_CONTEXT_BYTES,
    CUDA_GRAPH_RESERVE_BYTES,
    NON_TORCH_BYTES,
    Parallelism,
    PlanError,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    parameter_count,
    pipeline_partitions,
    plan_memory,
    safe_gpu_memory_utilization,
    shared_gpu_headroom,
    vllm_batch_defaults,
    weights_bytes,
    weights_bytes_per_gpu,
)
from apps.llm.shapes import parse_hf_config
from tests.unit.llm.models import LLAMA3_8B, MIXTRAL_8X7B, QWEN15_MOE, QWEN25_32B, config, shape

H100 = 81_559 * MIB


def test_the_assumptions():
    assert CUDA_GRAPH_RESERVE_BYTES == 1.5 * GIB
    assert CUDA_CONTEXT_BYTES == NON_TORCH_BYTES == 512 * MIB


# --- parameters and weights ---------------------------------------------------------------------------------------

LLAMA_LAYER = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096  # q, k+v, o, MLP, 2 norms
QWEN_LAYER = 2 * 5120 * 5120 + 2 * 5120 * 1024 + (5120 + 2 * 1024) + 3 * 5120 * 27648 + 2 * 5120  # with q/k/v biases
MIXTRAL_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096  # experts + router


def test_parameter_counts_match_the_published_ones():
    # embedding + LM head + layers + final norm
    assert LLAMA_LAYER == 218_112_000
    assert (
        parameter_count(shape(LLAMA3_8B)).value == 2 * 128256 * 4096 + 32 * LLAMA_LAYER + 4096 == 8_030_261_248
    )  # 8.03B
    assert QWEN_LAYER == 487_605_248
    assert parameter_count(shape(QWEN25_32B)).value == 2 * 152064 * 5120 + 64 * QWEN_LAYER + 5120 == 32_763_876_352
    assert MIXTRAL_LAYER == 1_451_270_144
    assert parameter_count(shape(MIXTRAL_8X7B)).value == 2 * 32000 * 4096 + 32 * MIXTRAL_LAYER + 4096 == 46_702_792_704
    # Qwen1.5-MoE-A2.7B: 60 experts of 1408, a shared expert of 5632 with its gate, 16 KV heads, q/k/v biases.
    layer = 4 * 2048 * 2048 + 3 * 2048 + 60 * 3 * 2048 * 1408 + 2048 * 60 + 3 * 2048 * 5632 + 2048 + 2 * 2048
    assert parameter_count(shape(QWEN15_MOE)).value == 2 * 151936 * 2048 + 24 * layer + 2048 == 14_315_784_192  # 14.3B


def test_tied_embeddings_are_counted_once():
    tied = parse_hf_config(config(LLAMA3_8B) | {"tie_word_embeddings": True})
    assert parameter_count(tied).value == 8_030_261_248 - 128256 * 4096


def test_weights_are_parameters_times_dtype_bytes():
    assert weights_bytes(shape(LLAMA3_8B)).value == 8_030_261_248 * 2 == 16_060_522_496  # 14.96 GiB
    assert weights_bytes(shape(QWEN25_32B)).value == 32_763_876_352 * 2 == 65_527_752_704  # 61.03 GiB
    assert weights_bytes(shape(MIXTRAL_8X7B)).value == 46_702_792_704 * 2 == 93_405_585_408  # 86.99 GiB


def test_a_published_parameter_count_is_preferred():
    figure = weights_bytes(shape(LLAMA3_8B, parameter_count=8_030_000_000))
    assert figure.value == 16_060_000_000
    assert "8,030,000,000 published parameters" in figure.source


def test_dtype_auto_serves_float32_checkpoints_in_float16_and_an_explicit_dtype_wins():
    fp32 = parse_hf_config(config(LLAMA3_8B) | {"torch_dtype": "float32"})
    assert weights_bytes(fp32).value == 8_030_261_248 * 2
    assert weights_bytes(fp32, "float32").value == 8_030_261_248 * 4
    assert "float16" in weights_bytes(fp32).source


def test_weights_per_gpu_under_tensor_parallelism():
    # Llama-3-8B, TP 2: every matrix halves, the 65 norms of 4096 stay whole on each rank.
    layer = 4096 * 2048 + 2 * 4096 * 512 + 2048 * 4096 + 3 * 4096 * 7168 + 2 * 4096
    per_gpu = 2 * 64128 * 4096 + 32 * layer + 4096
    assert per_gpu == 4_015_263_744
    assert weights_bytes_per_gpu(shape(LLAMA3_8B), Parallelism(tensor=2)).value == per_gpu * 2 == 8_030_527_488

    # Qwen2.5-32B, TP 4: 10 heads, 2 KV heads and a quarter of the MLP per rank.
    layer = 2 * 5120 * 1280 + 2 * 5120 * 256 + (1280 + 2 * 256) + 3 * 5120 * 6912 + 2 * 5120
    per_gpu = 2 * 38016 * 5120 + 64 * layer + 5120
    assert per_gpu == 8_191_464_448
    assert weights_bytes_per_gpu(shape(QWEN25_32B), Parallelism(tensor=4)).value == per_gpu * 2 == 16_382_928_896

    # Mixtral-8x7B, TP 4: each rank holds a quarter of every expert (no expert parallelism) and the whole router.
    layer = 2 * 4096 * 1024 + 2 * 4096 * 256 + 8 * 3 * 4096 * 3584 + 4096 * 8 + 2 * 4096
    per_gpu = 2 * 8000 * 4096 + 32 * layer + 4096
    assert per_gpu == 11_676_684_288
    assert weights_bytes_per_gpu(shape(MIXTRAL_8X7B), Parallelism(tensor=4)).value == per_gpu * 2 == 23_353_368_576


def test_weights_per_gpu_under_pipeline_parallelism():
    # 32 layers over 3 stages: vLLM gives the remainder to the stages before the last.
    assert pipeline_partitions(32, 3) == [11, 11, 10]
    assert pipeline_partitions(5, 3) == [2, 2, 1]
    assert pipeline_partitions(22, 4) == [5, 6, 6, 5]
    # Stage 0 holds the embedding and 11 layers, stage 2 the LM head, the final norm and 10 layers.
    first = 128256 * 4096 + 11 * LLAMA_LAYER
    last = 128256 * 4096 + 4096 + 10 * LLAMA_LAYER
    assert first > last
    figure = weights_bytes_per_gpu(shape(LLAMA3_8B), Parallelism(pipeline=3))
    assert figure.value == first * 2 == 5_849_137_152
    assert "[11, 11, 10]" in figure.source


def test_a_tied_lm_head_is_a_second_copy_on_the_last_stage():
    tied = parse_hf_config(config(LLAMA3_8B) | {"tie_word_embeddings": True})
    last = 128256 * 4096 + 4096 + 16 * LLAMA_LAYER
    assert weights_bytes_per_gpu(tied, Parallelism(pipeline=2)).value == last * 2


# --- KV cache -----------------------------------------------------------------------------------------------------


def test_kv_bytes_per_token():
    # 2 (K and V) x layers x KV heads x head dim x 2 bytes
    assert kv_bytes_per_token(shape(LLAMA3_8B)).value == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB
    assert kv_bytes_per_token(shape(QWEN25_32B)).value == 2 * 64 * 8 * 128 * 2 == 262_144  # 256 KiB
    assert kv_bytes_per_token(shape(MIXTRAL_8X7B)).value == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(shape(LLAMA3_8B), "fp8").value == 2 * 32 * 8 * 128 * 1


def test_kv_heads_split_across_tensor_parallel_ranks():
    assert kv_bytes_per_token_per_gpu(shape(LLAMA3_8B), Parallelism(tensor=2)).value == 2 * 32 * 4 * 128 * 2
    assert kv_bytes_per_token_per_gpu(shape(QWEN25_32B), Parallelism(tensor=4)).value == 2 * 64 * 2 * 128 * 2
    assert kv_bytes_per_token_per_gpu(shape(MIXTRAL_8X7B), Parallelism(tensor=4)).value == 2 * 32 * 2 * 128 * 2


def test_fewer_kv_heads_than_ranks_replicates_them():
    # 8 KV heads on 16 ranks: each rank keeps one head, not half of one.
    figure = kv_bytes_per_token_per_gpu(shape(LLAMA3_8B), Parallelism(tensor=16))
    assert figure.value == 2 * 32 * 1 * 128 * 2
    assert "replicated" in figure.source
    assert "replicated" in weights_bytes_per_gpu(shape(LLAMA3_8B), Parallelism(tensor=16)).source


def test_kv_per_gpu_under_pipeline_parallelism_is_the_fullest_stage():
    assert kv_bytes_per_token_per_gpu(shape(LLAMA3_8B), Parallelism(pipeline=3)).value == 2 * 11 * 8 * 128 * 2


def _plan(name, gpu="H100", **kwargs):
    return plan_memory(shape(name), accelerator(gpu), activation_bytes=GIB, **kwargs)


def test_llama3_8b_on_one_h100():
    plan = _plan(LLAMA3_8B, gpu_memory_utilization=0.9, max_model_len=8192)
    requested = 0.9 * 85_520_809_984  # 76,968,728,985.6
    free = requested - 16_060_522_496 - GIB - 512 * MIB  # weights, activation, non-torch: 59,297,593,753.6 (55.23 GiB)
    assert plan.kv_cache_per_gpu.value == pytest.approx(free)
    blocks = math.floor(free / (131_072 * 16))  # 28,275 blocks of 16 tokens
    assert plan.kv_cache_tokens.value == blocks * 16 == 452_400
    assert plan.max_concurrent_sequences.value == 452_400 // 8192 == 55
    # (weights + activation + non-torch + one 8192-token sequence) / total = 0.2192 -> 0.22
    assert plan.minimum_gpu_memory_utilization.value == 0.22
    assert plan.safe_gpu_memory_utilization.value == 0.97  # 1 - 2 GiB / 81,559 MiB = 0.9749
    assert plan.fits and plan.problems == ()


def test_qwen25_32b_on_two_h100s():
    plan = _plan(QWEN25_32B, parallel=Parallelism(tensor=2), gpu_memory_utilization=0.9, max_model_len=32768)
    weights = 2 * (
        2 * 76032 * 5120 + 64 * (2 * 5120 * 2560 + 2 * 5120 * 512 + 2560 + 1024 + 3 * 5120 * 13824 + 10240) + 5120
    )
    assert plan.weights_per_gpu.value == weights == 32_764_536_832  # 30.51 GiB
    free = 0.9 * 85_520_809_984 - weights - GIB - 512 * MIB  # 42,593,579,417.6 (39.67 GiB)
    blocks = math.floor(free / (2 * 64 * 4 * 128 * 2 * 16))  # 128 KiB per token per GPU, 16-token blocks
    assert plan.kv_cache_tokens.value == blocks * 16 == 324_960
    assert plan.max_concurrent_sequences.value == 324_960 // 32768 == 9
    assert plan.fits


def test_mixtral_8x7b_on_four_h100s():
    plan = _plan(MIXTRAL_8X7B, parallel=Parallelism(tensor=4), gpu_memory_utilization=0.9, max_model_len=32768)
    free = 0.9 * 85_520_809_984 - 23_353_368_576 - GIB - 512 * MIB  # 52,004,747,673.6 (48.43 GiB)
    blocks = math.floor(free / (2 * 32 * 2 * 128 * 2 * 16))  # 32 KiB per token per GPU
    assert plan.kv_cache_tokens.value == blocks * 16 == 1_587_056
    assert plan.max_concurrent_sequences.value == 1_587_056 // 32768 == 48
    assert plan.fits


def test_a_stage_with_fewer_kv_blocks_bounds_the_engine():
    plan = _plan(LLAMA3_8B, parallel=Parallelism(pipeline=3), max_model_len=8192)
    # Stage 0 (embedding + 11 layers) has the least memory left and the most KV per token.
    free = 0.9 * 85_520_809_984 - 5_849_137_152 - GIB - 512 * MIB
    assert plan.kv_cache_tokens.value == math.floor(free / (2 * 11 * 8 * 128 * 2 * 16)) * 16


def test_max_model_len_unset_takes_max_position_embeddings():
    plan = _plan(LLAMA3_8B)
    assert plan.max_model_len.value == 8192
    assert "max_position_embeddings" in plan.max_model_len.source
    assert plan.gpu_memory_utilization.value == 0.9
    assert plan.max_num_seqs.value == 1024  # vLLM's default on an H100


def test_max_model_len_larger_than_the_cache_fails_at_start():
    # Qwen2.5-32B on one H100 at 0.85: 0.85 x 85,520,809,984 - 65,527,752,704 - 1.5 GiB = 5.17 GiB of cache,
    # 5,554,323,046.4 / (256 KiB x 16) = 1,324 blocks = 21,184 tokens < 32,768 (vllm#2418).
    plan = _plan(QWEN25_32B, gpu_memory_utilization=0.85, max_model_len=32768)
    assert plan.kv_cache_tokens.value == 21_184
    assert plan.max_concurrent_sequences.value == 0
    assert not plan.fits
    (problem,) = plan.problems
    assert "vllm#2418" in problem and "at most 21,184" in problem


def test_weights_that_leave_nothing_for_the_cache():
    plan = _plan(MIXTRAL_8X7B, max_model_len=4096)
    assert plan.kv_cache_tokens.value == 0
    assert any("No available memory for the cache blocks" in p for p in plan.problems)
    assert any("does not fit 1 x H100" in p for p in plan.problems)


def test_activation_estimate_scales_with_batched_tokens():
    small = plan_memory(shape(LLAMA3_8B), accelerator("H100"), max_num_batched_tokens=2048, max_num_seqs=256)
    large = plan_memory(shape(LLAMA3_8B), accelerator("H100"), max_num_batched_tokens=8192, max_num_seqs=256)
    # 2,048 tokens x (4 x 4096 + 6144 QKV + 3 x 14336 MLP) x 2 bytes, plus 256 x 128,256 float32 logits and probs
    assert small.activation_per_gpu.value == 2048 * (4 * 4096 + 6144 + 3 * 14336) * 2 + 256 * 128256 * 8
    assert large.activation_per_gpu.value > small.activation_per_gpu.value
    assert large.kv_cache_tokens.value < small.kv_cache_tokens.value


# --- safe utilisation, shared GPUs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "kwargs", "safe"),
    [
        ("A10G", {}, 0.91),  # 1 - (1.5 + 0.5) GiB / 23,028 MiB = 0.9111
        ("H100", {}, 0.97),  # 1 - 2,048 / 81,559 = 0.9749
        ("T4", {}, 0.86),  # 1 - 2,048 / 15,360 = 0.8667
        ("A10G", {"enforce_eager": True}, 0.97),  # 1 - 512 / 23,028 = 0.9778
        ("H100", {"gpu_share": 0.5}, 0.47),  # 0.5 - 2,048 / 81,559 = 0.4749
        ("L4", {"cuda_graph_bytes": 3 * GIB}, 0.84),  # 1 - 3,584 / 23,034 = 0.8444
    ],
)
def test_safe_gpu_memory_utilization(gpu, kwargs, safe):
    assert safe_gpu_memory_utilization(accelerator(gpu), **kwargs).value == safe


def test_the_default_utilisation_is_too_high_for_a_t4():
    plan = plan_memory(shape(LLAMA3_8B), accelerator("T4"), max_model_len=1024)
    assert any("above the safe 0.86" in p for p in plan.problems)


def test_replicas_sharing_a_gpu():
    # Two replicas at 0.5 on an L4 leave 1 - 1.0 - 2 x 2,048 / 23,034 = -0.178: there is no hard boundary.
    assert shared_gpu_headroom([0.5, 0.5], accelerator("L4")).value == pytest.approx(-0.1778, abs=1e-4)
    assert "PR#1821" in shared_gpu_headroom([0.5, 0.5], accelerator("L4")).source
    # Two at 0.45 on an H100: 1 - 0.9 - 2 x 2,048 / 81,559 = 0.0498.
    assert shared_gpu_headroom([0.45, 0.45], accelerator("H100")).value == pytest.approx(0.0498, abs=1e-4)


def test_a_fractional_gpu_caps_the_safe_utilisation():
    plan = plan_memory(
        shape(QWEN15_MOE), accelerator("H100"), gpu_share=0.5, gpu_memory_utilization=0.9, max_model_len=4096
    )
    assert plan.safe_gpu_memory_utilization.value == 0.47
    assert any("above the safe 0.47" in p for p in plan.problems)


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("H100", (8192, 1024)), ("H200", (8192, 1024)), ("A100-80G", (2048, 256)), ("A10G", (2048, 256))],
)
def test_vllm_batch_defaults(gpu, expected):
    assert vllm_batch_defaults(accelerator(gpu))[:2] == expected
    assert vllm_batch_defaults(accelerator("B200", memory_gib=180))[:2] == (16384, 1024)


def test_every_figure_says_where_it_comes_from():
    plan = _plan(MIXTRAL_8X7B, parallel=Parallelism(tensor=4))
    figures = [getattr(plan, f) for f in plan.__dataclass_fields__ if f not in ("parallel", "problems")]
    assert all(f.source for f in figures)
    assert str(plan.kv_bytes_per_token) == (
        "131,072 bytes/token: 2 x 32 layers x 8 KV heads x 128 head dim x 2 bytes "
        "(kv_cache_dtype auto: the model dtype bfloat16)"
    )


# --- bad inputs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parallel", "message"),
    [
        (LLAMA3_8B, Parallelism(tensor=3), "does not divide the model's 32 attention heads"),
        (QWEN25_32B, Parallelism(tensor=5), "8 KV heads: one must divide the other"),
        (LLAMA3_8B, Parallelism(pipeline=33), "exceeds the model's 32 layers"),
    ],
)
def test_layouts_vllm_rejects(name, parallel, message):
    with pytest.raises(PlanError, match=message):
        weights_bytes_per_gpu(shape(name), parallel)
    with pytest.raises(PlanError, match=message):
        plan_memory(shape(name), accelerator("H100"), parallel=parallel)


def test_bad_values():
    s, gpu = shape(LLAMA3_8B), accelerator("H100")
    with pytest.raises(PlanError, match="at least 1"):
        Parallelism(tensor=0)
    with pytest.raises(PlanError, match="gpu_memory_utilization is in"):
        plan_memory(s, gpu, gpu_memory_utilization=1.2)
    with pytest.raises(PlanError, match="engine dtype 'int8'"):
        weights_bytes(s, "int8")
    with pytest.raises(PlanError, match="kv_cache_dtype 'turboquant'"):
        kv_bytes_per_token(s, "turboquant")
    with pytest.raises(PlanError, match="GPU share"):
        safe_gpu_memory_utilization(gpu, gpu_share=0)
    quantized = parse_hf_config(config(LLAMA3_8B) | {"quantization_config": {"quant_method": "awq"}})
    with pytest.raises(PlanError, match="quantized \\(awq\\)"):
        weights_bytes(quantized)
    no_context = parse_hf_config({k: v for k, v in config(LLAMA3_8B).items() if k != "max_position_embeddings"})
    with pytest.raises(PlanError, match="max_model_len is unset"):
        plan_memory(no_context, gpu)


def test_accelerators():
    assert accelerator("H100").memory_bytes == 81_559 * MIB
    assert accelerator("A10").name == "A10G"  # as serve.llm renames it
    assert accelerator("A100-80G").memory_bytes == 81_920 * MIB
    assert accelerator("H100", memory_gib=94).memory_bytes == 94 * GIB  # an explicit size wins (H100 NVL)
    assert accelerator("MI300X", memory_gib=192).source == "192 GiB, as given"
    with pytest.raises(UnknownAccelerator, match="give the GPU memory size in GiB"):
        accelerator("AMD-Instinct-MI300X-OAM")
    with pytest.raises(UnknownAccelerator, match="names no accelerator_type"):
        accelerator(None)
    with pytest.raises(ValueError, match="must be positive"):
        accelerator("H100", memory_gib=0)
