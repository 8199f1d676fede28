"""A decoder model's architecture, read from its Hugging Face `config.json` (as a dict: fetching it is not done here).

Reads the keys of LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM and the Qwen MoE models
(Qwen2MoeForCausalLM, Qwen3MoeForCausalLM); other decoders that use the same key names read the same way.
Defaults follow transformers' config classes: `num_key_value_heads` absent means one KV head per attention head
(multi-head attention), `head_dim` absent means hidden_size / num_attention_heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Bytes per element of the dtypes a config.json or vLLM's `dtype` / `kv_cache_dtype` names.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# Qwen2's attention always has q/k/v biases (Qwen2Attention in transformers) and its config has no key for it.
_QKV_BIAS_ARCHITECTURES = {"Qwen2ForCausalLM", "Qwen2MoeForCausalLM"}


class ModelConfigError(ValueError):
    """The model's config.json cannot be read as a decoder architecture."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    qkv_bias: bool = False
    # The context length vLLM takes when max_model_len is unset.
    max_position_embeddings: int | None = None
    # Mixture of experts, when the model has them.
    num_experts: int | None = None
    experts_per_token: int | None = None
    expert_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    num_moe_layers: int | None = None
    # The published parameter count (e.g. the safetensors total on the model card), when known.
    parameter_count: int | None = None
    quantization: str | None = None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None


def _int(config: Mapping[str, Any], key: str, why: str) -> int:
    if config.get(key) is None:
        raise ModelConfigError(f"the model config has no {key!r} ({why})")
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"the model config's {key!r} must be a positive integer, got {value!r}")
    return value


def _dtype(config: Mapping[str, Any]) -> str:
    # transformers 4.56 renamed torch_dtype to dtype in the configs it writes; both occur on the Hub.
    dtype = config.get("torch_dtype", config.get("dtype"))
    if dtype is None:
        raise ModelConfigError("the model config has no 'torch_dtype' (the weights' dtype)")
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ModelConfigError(f"the model config's 'torch_dtype' {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return dtype


def _moe_layers(config: Mapping[str, Any], num_layers: int) -> int:
    # Qwen2-MoE: layer i is sparse unless listed in mlp_only_layers, every decoder_sparse_step-th layer
    # (Qwen2MoeDecoderLayer in transformers).
    step = config.get("decoder_sparse_step") or 1
    dense = set(config.get("mlp_only_layers") or ())
    return sum(1 for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def parse_hf_config(config: Mapping[str, Any], *, parameter_count: int | None = None) -> ModelShape:
    """The architecture in a config.json dict; a config that cannot be read raises ModelConfigError naming the key."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"a model config is a JSON object, got {type(config).__name__}")
    # Vision-language models keep the decoder's keys under text_config.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], **{k: v for k, v in config.items() if k in ("torch_dtype", "dtype")}}
    if config.get("kv_lora_rank") is not None:
        raise ModelConfigError(
            "the model uses multi-head latent attention ('kv_lora_rank', DeepSeek-style), whose KV cache "
            "this planner does not size"
        )
    architectures = config.get("architectures") or ["unknown"]
    architecture = str(architectures[0])
    num_layers = _int(config, "num_hidden_layers", "the number of decoder layers")
    hidden = _int(config, "hidden_size", "the width of the residual stream")
    heads = _int(config, "num_attention_heads", "the number of attention heads")
    kv_heads = _int(config, "num_key_value_heads", "KV heads") if config.get("num_key_value_heads") else heads
    if config.get("head_dim"):
        head_dim = _int(config, "head_dim", "the width of one attention head")
    elif hidden % heads:
        raise ModelConfigError(
            f"the model config has no 'head_dim' and hidden_size {hidden} is not a multiple of {heads}"
        )
    else:
        head_dim = hidden // heads
    if heads % kv_heads:
        raise ModelConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")

    moe: dict[str, Any] = {}
    if config.get("num_local_experts"):  # Mixtral: every layer sparse, experts as wide as intermediate_size
        moe = {
            "num_experts": _int(config, "num_local_experts", "experts per layer"),
            "experts_per_token": _int(config, "num_experts_per_tok", "experts routed per token"),
            "expert_intermediate_size": _int(config, "intermediate_size", "the width of one expert"),
            "num_moe_layers": num_layers,
        }
    elif config.get("num_experts"):  # Qwen2-MoE / Qwen3-MoE
        shared = config.get("shared_expert_intermediate_size") or None
        moe = {
            "num_experts": _int(config, "num_experts", "experts per layer"),
            "experts_per_token": _int(config, "num_experts_per_tok", "experts routed per token"),
            "expert_intermediate_size": _int(config, "moe_intermediate_size", "the width of one expert"),
            "shared_expert_intermediate_size": shared and _int(config, "shared_expert_intermediate_size", "shared"),
            "num_moe_layers": _moe_layers(config, num_layers),
        }
    quantization = config.get("quantization_config")
    return ModelShape(
        architecture=architecture,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(config, "intermediate_size", "the width of the MLP"),
        vocab_size=_int(config, "vocab_size", "the embedding rows"),
        # False is the default of LlamaConfig, Qwen2Config and MixtralConfig.
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=_dtype(config),
        qkv_bias=bool(config.get("attention_bias", architecture in _QKV_BIAS_ARCHITECTURES)),
        max_position_embeddings=(
            _int(config, "max_position_embeddings", "the context length")
            if config.get("max_position_embeddings")
            else None
        ),
        parameter_count=parameter_count,
        quantization=(quantization.get("quant_method") or "unknown") if isinstance(quantization, Mapping) else None,
        **moe,
    )
