"""Reading a model's architecture from its config.json, and the configs that cannot be read."""

from __future__ import annotations

import pytest

from apps.llm.shapes import ModelConfigError, parse_hf_config
from tests.unit.llm.models import LLAMA3_8B, MIXTRAL_8X7B, QWEN15_MOE, QWEN25_32B, config, shape


def test_llama3_8b():
    s = shape(LLAMA3_8B)
    assert (s.architecture, s.num_layers, s.hidden_size, s.num_attention_heads, s.num_kv_heads) == (
        "LlamaForCausalLM",
        32,
        4096,
        32,
        8,
    )
    assert (s.head_dim, s.intermediate_size, s.vocab_size, s.tie_word_embeddings) == (128, 14336, 128256, False)
    assert (s.dtype, s.dtype_bytes, s.qkv_bias, s.is_moe, s.max_position_embeddings) == (
        "bfloat16",
        2,
        False,
        False,
        8192,
    )


def test_qwen2_has_qkv_bias_without_a_key_for_it():
    s = shape(QWEN25_32B)
    assert (s.num_layers, s.hidden_size, s.num_attention_heads, s.num_kv_heads, s.head_dim) == (64, 5120, 40, 8, 128)
    assert s.qkv_bias


def test_mixtral_experts_are_as_wide_as_intermediate_size():
    s = shape(MIXTRAL_8X7B)
    assert s.is_moe
    assert (s.num_experts, s.experts_per_token, s.expert_intermediate_size, s.num_moe_layers) == (8, 2, 14336, 32)
    assert s.shared_expert_intermediate_size is None


def test_qwen_moe_keys():
    s = shape(QWEN15_MOE)
    assert (s.num_experts, s.experts_per_token, s.expert_intermediate_size) == (60, 4, 1408)
    assert (s.shared_expert_intermediate_size, s.num_moe_layers, s.qkv_bias) == (5632, 24, True)


def test_dense_layers_of_a_qwen_moe():
    c = config(QWEN15_MOE) | {"mlp_only_layers": [0, 1], "decoder_sparse_step": 2}
    # Sparse are the layers i with (i + 1) % 2 == 0 outside [0, 1]: 3, 5, ..., 23, that is 11 of 24.
    assert parse_hf_config(c).num_moe_layers == 11


def test_kv_heads_default_to_attention_heads_and_head_dim_to_hidden_over_heads():
    c = config(LLAMA3_8B)
    del c["num_key_value_heads"]
    s = parse_hf_config(c)
    assert (s.num_kv_heads, s.head_dim) == (32, 4096 // 32)


def test_explicit_head_dim_wins():
    assert parse_hf_config(config(LLAMA3_8B) | {"head_dim": 256}).head_dim == 256
    assert parse_hf_config(config(LLAMA3_8B) | {"head_dim": None}).head_dim == 128


@pytest.mark.parametrize(
    ("torch_dtype", "dtype", "per"),
    [
        ("float32", "float32", 4),
        ("float16", "float16", 2),
        ("torch.bfloat16", "bfloat16", 2),
        ("float8_e4m3fn", "float8_e4m3fn", 1),
    ],
)
def test_torch_dtype_to_bytes(torch_dtype, dtype, per):
    s = parse_hf_config(config(LLAMA3_8B) | {"torch_dtype": torch_dtype})
    assert (s.dtype, s.dtype_bytes) == (dtype, per)


def test_newer_configs_name_the_dtype_dtype():
    c = config(LLAMA3_8B)
    c["dtype"] = c.pop("torch_dtype")
    assert parse_hf_config(c).dtype == "bfloat16"


def test_vision_language_config_reads_its_text_config():
    c = {"architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float16", "text_config": config(LLAMA3_8B)}
    del c["text_config"]["torch_dtype"]
    s = parse_hf_config(c)
    assert (s.num_layers, s.dtype) == (32, "float16")


def test_published_parameter_count_and_quantization_are_kept():
    assert shape(LLAMA3_8B, parameter_count=8_030_261_248).parameter_count == 8_030_261_248
    c = config(LLAMA3_8B) | {"quantization_config": {"quant_method": "awq", "bits": 4}}
    assert parse_hf_config(c).quantization == "awq"


@pytest.mark.parametrize(
    "key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size"]
)
def test_a_missing_key_is_named(key):
    c = config(LLAMA3_8B)
    del c[key]
    with pytest.raises(ModelConfigError, match=f"no '{key}'"):
        parse_hf_config(c)


def test_missing_dtype_is_named():
    c = config(LLAMA3_8B)
    del c["torch_dtype"]
    with pytest.raises(ModelConfigError, match="no 'torch_dtype'"):
        parse_hf_config(c)


def test_missing_moe_keys_are_named():
    c = config(QWEN15_MOE)
    del c["moe_intermediate_size"]
    with pytest.raises(ModelConfigError, match="no 'moe_intermediate_size'"):
        parse_hf_config(c)
    c = config(MIXTRAL_8X7B)
    del c["num_experts_per_tok"]
    with pytest.raises(ModelConfigError, match="no 'num_experts_per_tok'"):
        parse_hf_config(c)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": "4096"}, "'hidden_size' must be a positive integer"),
        ({"num_hidden_layers": 0}, "'num_hidden_layers' must be a positive integer"),
        ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads 5"),
        ({"torch_dtype": "int4"}, "'torch_dtype' 'int4' is not one of"),
        ({"kv_lora_rank": 512}, "multi-head latent attention"),
    ],
)
def test_unreadable_values(change, message):
    with pytest.raises(ModelConfigError, match=message):
        parse_hf_config(config(LLAMA3_8B) | change)


def test_head_dim_that_cannot_be_derived():
    c = config(LLAMA3_8B) | {"hidden_size": 4100}
    with pytest.raises(ModelConfigError, match="no 'head_dim'"):
        parse_hf_config(c)


def test_a_config_that_is_not_an_object():
    with pytest.raises(ModelConfigError, match="JSON object"):
        parse_hf_config(["LlamaForCausalLM"])


def test_a_gemma_config_without_the_key_ties_its_embeddings_as_transformers_does():
    gemma = {k: v for k, v in config(LLAMA3_8B).items() if k != "tie_word_embeddings"}
    assert parse_hf_config(gemma | {"model_type": "gemma2"}).tie_word_embeddings
    assert not parse_hf_config(gemma).tie_word_embeddings  # LlamaConfig's default
