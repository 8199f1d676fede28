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


class UnsupportedModel(ModelConfigError):
    """A model whose KV cache this planner does not size: it says what it cannot plan and why."""


# Attention-free or state-space layers: vLLM sizes their state with MambaSpec pages aligned to the attention pages,
# which this planner does not model.
_STATE_LAYER_TYPES = {"mamba", "mamba2", "linear_attention", "ssm", "recurrent", "conv", "short_conv"}
_HYBRID_MODEL_TYPES = {
    "jamba",
    "mamba",
    "mamba2",
    "falcon_h1",
    "nemotron_h",
    "qwen3_next",
    "granitemoehybrid",
    "bamba",
    "zamba2",
    "plamo2",
    "minimax_text_01",
    "minimax_m1",
    "lfm2",
    "kimi_linear",
    "recurrent_gemma",
    "falcon_mamba",
}


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
    # Per decoder layer, the sliding window it attends over, or None for full attention; None: all full.
    layer_windows: tuple[int | None, ...] | None = None
    # The vision tower and projector of a multimodal model (vLLM loads them with the decoder), in parameters.
    vision_parameters: int = 0
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    vision_layers: int = 0
    # The context length vLLM derives from the config (max_position_embeddings, stretched by rope scaling).
    derived_max_model_len: int | None = None

    @property
    def sliding_layers(self) -> int:
        return sum(1 for w in self.layer_windows or () if w)

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
    outer = config
    vision = vision_tower(outer)
    # Vision-language models keep the decoder's keys under text_config.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
        config = {
            **config["text_config"],
            **{k: v for k, v in config.items() if k in ("torch_dtype", "dtype", "architectures")},
        }
        if config.get("torch_dtype") is None and config.get("dtype") is None:
            raise ModelConfigError("the model config has no 'torch_dtype' (the weights' dtype)")
    if config.get("kv_lora_rank") is not None:
        raise UnsupportedModel(
            "the model uses multi-head latent attention ('kv_lora_rank', DeepSeek-style): vLLM caches one "
            "compressed latent per token (MLAAttentionSpec), which this planner does not size yet"
        )
    _refuse_state_layers(config)
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
        tie_word_embeddings=bool(config.get("tie_word_embeddings", _tied_by_default(config))),
        dtype=_dtype(config),
        qkv_bias=bool(config.get("attention_bias", architecture in _QKV_BIAS_ARCHITECTURES)),
        max_position_embeddings=(
            _int(config, "max_position_embeddings", "the context length")
            if config.get("max_position_embeddings")
            else None
        ),
        parameter_count=parameter_count,
        quantization=(quantization.get("quant_method") or "unknown") if isinstance(quantization, Mapping) else None,
        layer_windows=layer_windows(config, num_layers),
        derived_max_model_len=derived_max_len(config),
        **vision,
        **moe,
    )


def _tied_by_default(config: Mapping[str, Any]) -> bool:
    """What transformers assumes when config.json leaves tie_word_embeddings out: True for the Gemma
    configs (whose published config.json files omit it), False for LlamaConfig, Qwen2Config and
    MixtralConfig. Untied, a Gemma's 256k-row LM head would be counted twice (1 GiB for Gemma 2 2B)."""
    return str(config.get("model_type", "")).lower().startswith("gemma")


def _refuse_state_layers(config: Mapping[str, Any]) -> None:
    types = {str(t).lower() for t in config.get("layer_types") or ()}
    model_type = str(config.get("model_type", "")).lower()
    if types & _STATE_LAYER_TYPES or model_type in _HYBRID_MODEL_TYPES or config.get("hybrid_override_pattern"):
        raise UnsupportedModel(
            f"the model ({model_type or 'unknown type'}) has Mamba or linear-attention layers: vLLM keeps a fixed "
            "state per sequence for them (MambaSpec) and pads the attention pages to its size, which this planner "
            "does not size yet"
        )


def layer_windows(config: Mapping[str, Any], num_layers: int) -> tuple[int | None, ...] | None:
    """Each layer's sliding window as vLLM's model code applies it; None when every layer attends in full."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if config.get("use_sliding_window") is False:  # Qwen2 and Qwen3 carry a window they do not use
        return None
    types = config.get("layer_types")
    model_type = str(config.get("model_type", "")).lower()
    if isinstance(types, list) and len(types) == num_layers:
        return tuple(window if "sliding" in str(t) else None for t in types)
    if model_type.startswith("gemma2"):  # Gemma2Attention: even layers slide
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    if model_type.startswith("gemma3"):  # every sliding_window_pattern-th layer attends in full
        pattern = config.get("sliding_window_pattern") or 6
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(num_layers))
    if model_type in ("mistral", "mixtral") or config.get("use_sliding_window"):
        return tuple(window for _ in range(num_layers))
    return None


def derived_max_len(config: Mapping[str, Any]) -> int | None:
    """max_position_embeddings, stretched by a rope scaling factor the way vLLM's _get_and_verify_max_len does."""
    length = config.get("max_position_embeddings")
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        return None
    scaling = config.get("rope_scaling") or {}
    if isinstance(scaling, Mapping):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        # llama3, longrope and su scale inside max_position_embeddings already (vLLM leaves them alone).
        if kind not in (None, "llama3", "longrope", "su", "default", "mrope") and isinstance(factor, int | float):
            base = scaling.get("original_max_position_embeddings") or length
            return int(base * factor)
    return length


def vision_tower(config: Mapping[str, Any]) -> dict[str, int]:
    """The vision encoder and projector's size, estimated from vision_config: a ViT of `depth` blocks."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return {}
    hidden = vision.get("hidden_size") or vision.get("embed_dim") or vision.get("width")
    layers = vision.get("depth") or vision.get("num_hidden_layers") or vision.get("num_layers")
    if not isinstance(hidden, int) or not isinstance(layers, int):
        raise ModelConfigError(
            "the model config's vision_config has no hidden_size/embed_dim or depth/num_hidden_layers: the vision "
            "tower's weights cannot be sized"
        )
    embed = vision.get("embed_dim") or hidden
    inner = vision.get("intermediate_size") or int(embed * (vision.get("mlp_ratio") or 4))
    gated = str(vision.get("hidden_act", "")).lower() in ("silu", "swiglu") or "intermediate_size" not in vision
    per_layer = 4 * embed * embed + (3 if gated else 2) * embed * inner
    patch = vision.get("patch_size") or 14
    channels = vision.get("in_channels") or vision.get("num_channels") or 3
    temporal = vision.get("temporal_patch_size") or 1
    merge = vision.get("spatial_merge_size") or 1
    text_config = config.get("text_config")
    text = text_config if isinstance(text_config, Mapping) else config
    text_hidden = text.get("hidden_size") or vision.get("out_hidden_size") or hidden
    merged = embed * merge * merge
    projector = merged * merged + merged * int(text_hidden)
    patch_embed = channels * temporal * patch * patch * embed
    return {
        "vision_parameters": layers * per_layer + patch_embed + projector,
        "vision_hidden_size": int(embed),
        "vision_intermediate_size": int(inner),
        "vision_layers": int(layers),
    }
