"""The GPU memory planner against figures computed by hand for published model shapes.

Each expected value is written out as the arithmetic that gives it, from the shapes in tests/fixtures/llm:
Llama-3-8B (32 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128, MLP 14336, vocabulary 128256),
Qwen2.5-32B (64 layers, hidden 5120, 40 heads, 8 KV heads, head dim 128, MLP 27648, vocabulary 152064, q/k/v
biases) and Mixtral-8x7B (Llama-3-8B's attention, 8 experts of 14336 with 2 per token, vocabulary 32000).
All three are bfloat16 with untied embeddings. CUDA reports 79.19 GiB = 85,030,558,679 bytes on an H100.
"""

from __future__ import annotations

import math

import pytest

from apps.llm import profile
from apps.llm.accelerators import GIB, MIB, UnknownAccelerator, accelerator
from apps.llm.model_memory import (
    Parallelism,
    PlanError,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    parameter_count,
    pipeline_partitions,
    weights_bytes,
    weights_bytes_per_gpu,
)
from apps.llm.planner import EngineSettings, plan_memory, safe_gpu_memory_utilization
from apps.llm.shapes import parse_hf_config
from apps.llm.vllm_versions import Accounting
from tests.unit.llm.models import LLAMA3_8B, MIXTRAL_8X7B, QWEN15_MOE, QWEN25_32B, config, shape

H100 = round(79.19 * GIB)
V0_19, V0_29 = Accounting((0, 19, 0)), Accounting((0, 29, 0))
NON_TORCH = profile.NON_TORCH_TP1_BYTES


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


def _plan(name, gpu="H100", vllm=V0_19, **settings):
    return plan_memory(shape(name), accelerator(gpu), EngineSettings(**settings), vllm=vllm, activation_bytes=GIB)


def test_llama3_8b_on_one_h100():
    plan = _plan(LLAMA3_8B, gpu_memory_utilization=0.9, max_model_len=8192)
    free = 0.9 * H100 - 16_060_522_496 - GIB - NON_TORCH  # weights, activation, non-torch
    assert plan.kv_cache_per_gpu.value == pytest.approx(free)
    blocks = math.floor(free / (131_072 * 16))
    assert plan.num_blocks == blocks
    assert plan.kv_cache_tokens.value == blocks * 16  # 0.19 logs num_blocks x block_size
    assert plan.max_concurrency.value == pytest.approx(blocks / (8192 / 16))
    assert plan.fits and plan.problems == ()


def test_cuda_graphs_come_out_of_the_budget_from_vllm_0_20():
    old = _plan(LLAMA3_8B, vllm=V0_19, max_model_len=8192)
    new = _plan(LLAMA3_8B, vllm=V0_29, max_model_len=8192)
    graphs = profile.CUDA_GRAPH_BASE_BYTES + 32 * profile.CUDA_GRAPH_PER_LAYER_BYTES
    assert new.cuda_graphs_per_gpu.value == graphs and new.cuda_graphs_in_budget
    assert not old.cuda_graphs_in_budget
    assert old.kv_cache_per_gpu.value - new.kv_cache_per_gpu.value == pytest.approx(graphs)
    # Outside the budget they make the safe utilisation stricter; inside, they do not.
    assert new.safe_gpu_memory_utilization.value > old.safe_gpu_memory_utilization.value
    eager = _plan(LLAMA3_8B, vllm=V0_29, max_model_len=8192, enforce_eager=True)
    assert eager.cuda_graphs_per_gpu.value == 0 and eager.kv_cache_per_gpu.value > new.kv_cache_per_gpu.value


def test_vllm_0_21_logs_tokens_as_concurrency_times_length():
    plan = _plan(LLAMA3_8B, vllm=V0_29, max_model_len=1000)  # not a multiple of the block size
    per_request = math.ceil(1000 / 16)
    assert plan.kv_cache_tokens.value == int(plan.num_blocks / per_request * 1000)
    older = _plan(LLAMA3_8B, vllm=Accounting((0, 20, 0)), max_model_len=1000)
    assert older.kv_cache_tokens.value == older.num_blocks * 16


def test_qwen25_32b_on_two_h100s():
    plan = _plan(QWEN25_32B, tensor_parallel_size=2, gpu_memory_utilization=0.9, max_model_len=32768)
    weights = 2 * (
        2 * 76032 * 5120 + 64 * (2 * 5120 * 2560 + 2 * 5120 * 512 + 2560 + 1024 + 3 * 5120 * 13824 + 10240) + 5120
    )
    assert plan.weights_per_gpu.value == weights == 32_764_536_832  # 30.51 GiB
    free = 0.9 * H100 - weights - GIB - profile.NON_TORCH_TP_BYTES
    blocks = math.floor(free / (2 * 64 * 4 * 128 * 2 * 16))  # 128 KiB per token per GPU, 16-token blocks
    assert plan.kv_cache_tokens.value == blocks * 16
    assert plan.fits


def test_a_stage_with_fewer_kv_blocks_bounds_the_engine():
    plan = _plan(LLAMA3_8B, pipeline_parallel_size=3, max_model_len=8192)
    # Stage 0 (embedding + 11 layers) has the least memory left and the most KV per token.
    free = 0.9 * H100 - 5_849_137_152 - GIB - NON_TORCH
    assert plan.kv_cache_tokens.value == math.floor(free / (2 * 11 * 8 * 128 * 2 * 16)) * 16


def test_max_model_len_unset_takes_the_models_context():
    plan = _plan(LLAMA3_8B)
    assert plan.max_model_len.value == 8192
    assert plan.gpu_memory_utilization.value == 0.9
    assert plan.max_num_seqs.value == 1024  # vLLM's default on an H100
    over = _plan(LLAMA3_8B, max_model_len=100_000)
    assert not over.fits and "above the model's context length 8,192" in over.problems[0]


def test_a_32b_model_on_one_80_gb_gpu_at_16000_tokens():
    # The worst case: most of the GPU holds weights, so the activation peak decides whether vLLM starts.
    settings = EngineSettings(max_model_len=16000, gpu_memory_utilization=0.85)
    plan = plan_memory(shape(QWEN25_32B), accelerator("H100"), settings, vllm=V0_29)
    assert plan.activation_per_gpu.value > 2 * GIB  # the sampler over 1,024 sequences of 152,064 logits
    assert not plan.fits
    (problem,) = plan.problems
    assert "refuses to start" in problem
    # What the findings would suggest instead is planned, and starts.
    suggested = plan.suggestions()["max_model_len"]
    assert 0 < suggested < 16000 and plan.replan(max_model_len=suggested).fits


def test_max_model_len_minus_one_is_fitted_to_the_cache():
    plan = plan_memory(shape(QWEN25_32B), accelerator("H100"), EngineSettings(max_model_len=-1), vllm=V0_29)
    assert plan.fits and 0 < plan.max_model_len.value < 32768
    assert plan.max_concurrency.value >= 1
    with pytest.raises(PlanError, match=r"0\.14 or later"):
        plan_memory(
            shape(QWEN25_32B), accelerator("H100"), EngineSettings(max_model_len=-1), vllm=Accounting((0, 11, 0))
        )


def test_engine_settings_that_replace_the_profile():
    fixed = _plan(LLAMA3_8B, max_model_len=8192, kv_cache_memory_bytes=10 * GIB)
    assert fixed.kv_cache_per_gpu.value == 10 * GIB and "skips profiling" in fixed.kv_cache_per_gpu.source
    assert fixed.kv_cache_tokens.value == 10 * GIB // (131_072 * 16) * 16
    override = _plan(LLAMA3_8B, max_model_len=8192, num_gpu_blocks_override=1000)
    assert override.kv_cache_tokens.value == 16_000
    fp8 = _plan(LLAMA3_8B, max_model_len=8192, kv_cache_dtype="fp8")
    assert fp8.kv_cache_tokens.value == pytest.approx(
        2 * _plan(LLAMA3_8B, max_model_len=8192).kv_cache_tokens.value, rel=1e-3
    )


def test_performance_mode_throughput_doubles_the_batch_defaults():
    plain = plan_memory(shape(LLAMA3_8B), accelerator("H100"), EngineSettings(), vllm=V0_29)
    doubled = plan_memory(
        shape(LLAMA3_8B), accelerator("H100"), EngineSettings(performance_mode="throughput"), vllm=V0_29
    )
    assert (doubled.max_num_seqs.value, doubled.max_num_batched_tokens.value) == (2048, 16384)
    assert doubled.activation_per_gpu.value > plain.activation_per_gpu.value


def test_the_activation_peak_does_not_shrink_with_tensor_parallelism():
    one = plan_memory(shape(QWEN25_32B), accelerator("H100"), EngineSettings(max_model_len=4096), vllm=V0_29)
    four = plan_memory(
        shape(QWEN25_32B), accelerator("H100"), EngineSettings(tensor_parallel_size=4, max_model_len=4096), vllm=V0_29
    )
    sampler = 1024 * 152064 * profile.SAMPLER_BYTES_PER_LOGIT
    assert one.activation_per_gpu.value >= sampler and four.activation_per_gpu.value >= sampler


def test_sliding_window_layers_form_groups_and_hold_only_their_window():
    gemma = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    s = parse_hf_config(gemma)
    assert s.sliding_layers == 34 - 5  # layers 6, 12, ... 30 attend in full
    plan = plan_memory(s, accelerator("H100"), EngineSettings(max_model_len=32768), vllm=V0_29)
    layout = plan.layout
    # 5 full layers and 29 sliding: groups of 5 (29 < 5 x 1.5 is false), 6 sliding groups with one padding layer.
    assert layout.group_size == 5 and len(layout.groups) == 7 and layout.padding_layers == 1
    full = _plan_full_attention(gemma)
    assert plan.max_concurrency.value > 2 * full.max_concurrency.value  # sliding groups need only their window
    old = plan_memory(s, accelerator("H100"), EngineSettings(max_model_len=32768), vllm=Accounting((0, 9, 0)))
    assert not old.layout.hybrid  # before the grouped allocator every layer is sized as full attention


def _plan_full_attention(config_):
    full = {k: v for k, v in config_.items() if k not in ("sliding_window", "sliding_window_pattern")}
    return plan_memory(parse_hf_config(full), accelerator("H100"), EngineSettings(max_model_len=32768), vllm=V0_29)


def test_a_vision_model_counts_its_tower():
    text = config(LLAMA3_8B)
    vision = {
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "hidden_act": "silu",
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 4096,
        }
    }
    multimodal = parse_hf_config(
        {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "text_config": text,
            "torch_dtype": "bfloat16",
            **vision,
        }
    )
    plain = parse_hf_config(text)
    assert multimodal.vision_parameters > 600_000_000
    assert weights_bytes(multimodal).value - weights_bytes(plain).value == 2 * multimodal.vision_parameters
    assert (
        plan_memory(multimodal, accelerator("H100"), vllm=V0_29).activation_per_gpu.value
        > plan_memory(plain, accelerator("H100"), vllm=V0_29).activation_per_gpu.value
    )


# --- safe utilisation, shared GPUs ------------------------------------------------------------------------------


def test_safe_gpu_memory_utilization():
    gpu = accelerator("H100")
    context = profile.CUDA_CONTEXT_BYTES
    assert safe_gpu_memory_utilization(gpu, vllm=V0_29).value == math.floor((1 - context / H100) * 100) / 100
    graphs = profile.CUDA_GRAPH_BASE_BYTES + 80 * profile.CUDA_GRAPH_PER_LAYER_BYTES
    assert safe_gpu_memory_utilization(gpu, vllm=V0_19).value == math.floor((1 - (context + graphs) / H100) * 100) / 100
    assert safe_gpu_memory_utilization(gpu, gpu_share=0.5, vllm=V0_29).value == 0.49
    tp = safe_gpu_memory_utilization(gpu, tensor_parallel_size=2, vllm=V0_29)
    assert tp.value < safe_gpu_memory_utilization(gpu, vllm=V0_29).value and "NCCL" in tp.source


def test_a_fractional_gpu_caps_the_safe_utilisation():
    plan = plan_memory(
        shape(QWEN15_MOE),
        accelerator("H100"),
        EngineSettings(gpu_memory_utilization=0.9, max_model_len=4096),
        gpu_share=0.5,
        vllm=V0_29,
    )
    assert plan.safe_gpu_memory_utilization.value == 0.49
    assert any("above the safe 0.49" in p for p in plan.problems)


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("H100", (8192, 1024)), ("H200", (8192, 1024)), ("A100-80G", (2048, 256)), ("A10G", (2048, 256))],
)
def test_vllm_batch_defaults(gpu, expected):
    assert profile.batch_defaults(accelerator(gpu), V0_29)[:2] == expected
    assert profile.batch_defaults(accelerator("B200", memory_gib=180), V0_29)[:2] == (16384, 1024)
    assert profile.batch_defaults(accelerator("H100"), V0_29, offline=True)[:2] == (16384, 1024)


def test_every_figure_says_where_it_comes_from():
    plan = _plan(MIXTRAL_8X7B, tensor_parallel_size=4)
    assert all(f.source for f in plan.figures().values())
    assert all(part["source"] for part in plan.memory().values())
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
    settings = EngineSettings(tensor_parallel_size=parallel.tensor, pipeline_parallel_size=parallel.pipeline)
    with pytest.raises(PlanError, match=message):
        plan_memory(shape(name), accelerator("H100"), settings)


def test_bad_values():
    s, gpu = shape(LLAMA3_8B), accelerator("H100")
    with pytest.raises(PlanError, match="at least 1"):
        Parallelism(tensor=0)
    with pytest.raises(PlanError, match="gpu_memory_utilization is in"):
        plan_memory(s, gpu, EngineSettings(gpu_memory_utilization=1.2))
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
    assert accelerator("H100").memory_bytes == H100  # CUDA's total, as vLLM logs it
    assert accelerator("A10").name == "A10G"  # as serve.llm renames it
    assert accelerator("A100-80G").memory_bytes == round(79.15 * GIB)
    # A board without a read log: nvidia-smi's total less the most CUDA kept on the boards read.
    assert accelerator("L4").memory_bytes == int(23_034 * MIB * (1 - 0.0175)) // MIB * MIB
    assert "nvidia-smi" in accelerator("L4").source
    assert accelerator("H100", memory_gib=94).memory_bytes == 94 * GIB  # an explicit size wins (H100 NVL)
    assert accelerator("MI300X", memory_gib=192).source == "192.00 GiB, as given"
    with pytest.raises(UnknownAccelerator, match="give the GPU memory size in GiB"):
        accelerator("AMD-Instinct-MI300X-OAM")
