"""Recognise `ray.serve.llm` applications in a Serve application config, as Ray 2.60's dashboard returns it.

Two ways in: the application's `import_path` is one of serve.llm's builders and its `args` hold the LLMConfigs
(their model, parallelism, accelerator and engine settings are then known), or the application is a user module
that builds serve.llm deployments itself, and only the deployment names give it away (`LLMServer:<model>`,
`OpenAiIngress`...). Unset settings are reported with the value serve.llm or vLLM takes for them, and where that
value comes from.

Everything here is read from the installed Ray 2.60 source, not imported: `ray.serve.llm` needs pyarrow, which
Fleetdeck does not install. tests/unit/llm/test_ray_schema.py checks these names and defaults against that source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.llm.vllm_args import KNOWN_ENGINE_KWARGS, VLLM_ARGS_SOURCE

# Builders in ray/serve/llm/__init__.py, by what their single argument holds.
OPENAI_APP = "build_openai_app"  # LLMServingArgs: llm_configs, ingress_cls_config, ingress_deployment_config
DP_OPENAI_APP = "build_dp_openai_app"  # DPOpenAiServingArgs: llm_config, ...
PD_OPENAI_APP = "build_pd_openai_app"  # PDServingArgs: prefill_config, decode_config, ...
LLM_DEPLOYMENT = "build_llm_deployment"  # takes an LLMConfig plus keyword-only options
BUILDERS = (OPENAI_APP, DP_OPENAI_APP, PD_OPENAI_APP, LLM_DEPLOYMENT)

# LLMConfig's fields (ray/llm/_internal/serve/core/configs/llm_config.py); its base model forbids others.
LLM_CONFIG_FIELDS = frozenset(
    {
        "runtime_env",
        "model_loading_config",
        "llm_engine",
        "engine_kwargs",
        "accelerator_type",
        "accelerator_config",
        "placement_group_config",
        "lora_config",
        "deployment_config",
        "server_cls",
        "experimental_configs",
        "log_engine_metrics",
        "callback_config",
    }
)
MODEL_LOADING_CONFIG_FIELDS = frozenset({"model_id", "model_source", "tokenizer_source"})

# Deployment names serve.llm gives: build_llm_deployment prefixes `<server class>:` to the model id with "/" as
# "--" and "." as "_" (ray/llm/_internal/serve/core/server/builder.py); the P/D builder uses "Prefill:" and
# "Decode:"; the OpenAI ingress keeps its class name (make_fastapi_ingress), the direct-streaming router is LLMRouter.
SERVER_PREFIXES = ("LLMServer:", "DPServer:", "Prefill:", "Decode:")
INGRESS_NAMES = frozenset({"OpenAiIngress", "LLMRouter"})

# serve.llm's deployment defaults: DEFAULT_DEPLOYMENT_OPTIONS in ray/llm/_internal/serve/core/server/builder.py,
# values from ray/llm/_internal/serve/constants.py (each can be changed by an environment variable there).
_SERVE_LLM_DEFAULTS_SOURCE = (
    "serve.llm's default (DEFAULT_DEPLOYMENT_OPTIONS in ray/llm/_internal/serve/core/server/builder.py, "
    "ray/llm/_internal/serve/constants.py)"
)
SERVE_LLM_DEFAULTS: dict[str, Any] = {
    "max_ongoing_requests": int(1e9),  # DEFAULT_MAX_ONGOING_REQUESTS
    "health_check_period_s": 10,  # DEFAULT_HEALTH_CHECK_PERIOD_S
    "health_check_timeout_s": 10,  # DEFAULT_HEALTH_CHECK_TIMEOUT_S
    "target_ongoing_requests": int(1e9),  # DEFAULT_MAX_TARGET_ONGOING_REQUESTS, only when num_replicas is unset
}

# vLLM's values for the engine settings that matter when engine_kwargs leaves them out.
_VLLM_DEFAULTS: dict[str, tuple[Any, str]] = {
    "tensor_parallel_size": (1, "unset: vLLM's default"),
    "pipeline_parallel_size": (1, "unset: vLLM's default"),
    "gpu_memory_utilization": (0.9, "unset: vLLM's default (CacheConfig.gpu_memory_utilization)"),
    "max_model_len": (None, "unset: vLLM takes the model's max_position_embeddings"),
    "max_num_seqs": (None, "unset: vLLM picks 256, or 1024 on GPUs of 70 GiB or more other than A100"),
    "max_num_batched_tokens": (None, "unset: vLLM picks 2048, 8192 or 16384 by GPU memory"),
    "dtype": ("auto", "unset: vLLM's default, the checkpoint's dtype (float16 for float32 checkpoints)"),
    "kv_cache_dtype": ("auto", "unset: vLLM's default, the model's dtype"),
    "enforce_eager": (False, "unset: vLLM's default, CUDA graphs on"),
    "enable_prefix_caching": (None, "unset: vLLM's default"),
    "quantization": (None, "unset: read from the checkpoint"),
    "block_size": (None, "unset: vLLM's default for the platform (16 on CUDA)"),
    "data_parallel_size": (1, "unset: vLLM's default"),
}

_POSITIVE_INTS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "data_parallel_size",
)


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str


@dataclass(frozen=True)
class LLMModel:
    """One LLM deployment of the application: the model and the settings that size it."""

    deployment_name: str
    role: str  # "server", "prefill" or "decode"
    model_id: str | None
    model_source: str | None
    accelerator_type: str | None
    gpus_per_replica: float | None
    gpu_fraction: float | None  # GPU per vLLM worker when below 1 (a shared GPU)
    engine: dict[str, Setting]
    serve: dict[str, Setting]
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()

    @property
    def tensor_parallel_size(self) -> int | None:
        return self.engine["tensor_parallel_size"].value if "tensor_parallel_size" in self.engine else None

    @property
    def pipeline_parallel_size(self) -> int | None:
        return self.engine["pipeline_parallel_size"].value if "pipeline_parallel_size" in self.engine else None


@dataclass(frozen=True)
class LLMApplication:
    name: str | None
    builder: str | None
    recognised_by: str  # "import_path" or "deployment names"
    ingress_deployment: str | None
    models: tuple[LLMModel, ...]
    errors: tuple[str, ...] = ()


def builder_of(import_path: str | None) -> str | None:
    """The serve.llm builder an import path names ("module:attr" or "module.attr", as Serve accepts both)."""
    if not import_path:
        return None
    module, sep, attr = import_path.partition(":")
    if not sep:
        module, _, attr = import_path.rpartition(".")
    return attr if module == "ray.serve.llm" and attr in BUILDERS else None


def deployment_role(name: str) -> str | None:
    """What a deployment of a serve.llm application is, from its name alone."""
    if name in INGRESS_NAMES:
        return "ingress"
    if name.startswith("Prefill:"):
        return "prefill"
    if name.startswith("Decode:"):
        return "decode"
    if name.startswith(SERVER_PREFIXES):
        return "server"
    return None


def server_deployment_name(model_id: str, prefix: str = "LLMServer:", deployment_config: Mapping | None = None) -> str:
    """The name build_llm_deployment gives a model's deployment (`_get_deployment_name` plus the class prefix)."""
    explicit = (deployment_config or {}).get("name")
    return prefix + (explicit or model_id.replace("/", "--").replace(".", "_"))


def recognise_application(application: Mapping[str, Any]) -> LLMApplication | None:
    """An entry of `applications` from GET /api/serve/applications/: its submitted config and running deployments."""
    config = application.get("deployed_app_config") or {}
    running = application.get("deployments") or {}
    return recognise_app_config(config, running=running, name=application.get("name"))


def recognise_app_config(
    config: Mapping[str, Any], *, running: Mapping[str, Any] | None = None, name: str | None = None
) -> LLMApplication | None:
    """One application of a Serve config (`deployed_app_config`, or one about to be pushed); None if not serve.llm."""
    running = running or {}
    name = config.get("name", name)
    # A deployment entry without a name is kept under None, where no lookup by name finds it.
    overrides: dict[str | None, Mapping[str, Any]] = {
        d.get("name"): d for d in config.get("deployments") or () if isinstance(d, Mapping)
    }
    builder = builder_of(config.get("import_path"))
    if builder is None:
        return _recognise_by_names(name, set(overrides) | set(running), overrides, running)

    args = config.get("args") or {}
    errors: list[str] = []
    labelled: list[tuple[str, str, str, Any]] = []  # (label, role, name prefix, llm config)
    if builder == OPENAI_APP:
        llm_configs = args.get("llm_configs")
        if not isinstance(llm_configs, list) or not llm_configs:
            errors.append("args.llm_configs must be a non-empty list of LLMConfigs (LLMServingArgs)")
            llm_configs = []
        labelled = [(f"llm_configs[{i}]", "server", "LLMServer:", c) for i, c in enumerate(llm_configs)]
    elif builder == DP_OPENAI_APP:
        labelled = [("llm_config", "server", "DPServer:", args.get("llm_config"))]
    elif builder == PD_OPENAI_APP:
        labelled = [
            ("prefill_config", "prefill", "Prefill:", args.get("prefill_config")),
            ("decode_config", "decode", "Decode:", args.get("decode_config")),
        ]
    else:
        # Serve calls a builder with the args dict only and refuses one that takes more than a single
        # parameter (call_user_app_builder_with_args_if_necessary in ray/serve/_private/api.py).
        errors.append(
            "ray.serve.llm:build_llm_deployment cannot be an import_path: Serve calls builders with one argument and "
            "it takes an LLMConfig and keyword options; use ray.serve.llm:build_openai_app with args.llm_configs"
        )
        labelled = [("args", "server", "LLMServer:", args)]

    models = []
    for label, role, prefix, llm_config in labelled:
        model = _model_from_llm_config(label, role, prefix, llm_config, overrides, running)
        if model is not None:
            models.append(model)
        elif llm_config is None:
            errors.append(f"args.{label} is missing")
        else:
            errors.append(
                f"args.{label} is {llm_config!r}: a YAML file path on the cluster (or not an LLMConfig), whose "
                "settings Fleetdeck cannot read"
            )
    ingress = None
    if builder in (OPENAI_APP, DP_OPENAI_APP, PD_OPENAI_APP):
        ingress_cls = (args.get("ingress_cls_config") or {}).get("ingress_cls") or "OpenAiIngress"
        ingress = str(ingress_cls).replace(":", ".").rsplit(".", 1)[-1]
    return LLMApplication(
        name=name,
        builder=builder,
        recognised_by="import_path",
        ingress_deployment=ingress,
        models=tuple(models),
        errors=tuple(errors),
    )


def _recognise_by_names(
    name: str | None, names: set[str | None], overrides: Mapping[str | None, Any], running: Mapping[str, Any]
) -> LLMApplication | None:
    roles = {n: deployment_role(n) for n in names if n}
    if not any(role in ("server", "prefill", "decode") for role in roles.values()):
        return None
    models = []
    for deployment, role in sorted(roles.items()):
        if role in (None, "ingress"):
            continue
        serve = _serve_settings(deployment, {}, overrides, running)
        models.append(
            LLMModel(
                deployment_name=deployment,
                role=role,
                # The name keeps the model id but for "." (written "_"), which cannot be told from a real "_".
                model_id=deployment.partition(":")[2].replace("--", "/") or None,
                model_source=None,
                accelerator_type=None,
                gpus_per_replica=None,
                gpu_fraction=None,
                engine={},
                serve=serve,
            )
        )
    ingress = next((n for n, r in sorted(roles.items()) if r == "ingress"), None)
    return LLMApplication(
        name=name,
        builder=None,
        recognised_by="deployment names",
        ingress_deployment=ingress,
        models=tuple(models),
        errors=("the application builds its serve.llm deployments itself: their engine settings are not visible",),
    )


def _model_from_llm_config(
    label: str,
    role: str,
    prefix: str,
    llm_config: Any,
    overrides: Mapping[str | None, Any],
    running: Mapping[str, Any],
) -> LLMModel | None:
    if not isinstance(llm_config, Mapping):
        return None
    errors = [
        f"{label}: unknown LLMConfig field {k!r} (serve.llm forbids extra fields)"
        for k in llm_config
        if k not in LLM_CONFIG_FIELDS
    ]

    loading = llm_config.get("model_loading_config")
    model_id = model_source = None
    if not isinstance(loading, Mapping) or not loading.get("model_id"):
        errors.append(f"{label}.model_loading_config.model_id is required")
    else:
        model_id = str(loading["model_id"])
        source = loading.get("model_source")
        # A string is a Hugging Face id, a local path or a bucket URI; a mapping is a CloudMirrorConfig.
        model_source = source.get("bucket_uri") if isinstance(source, Mapping) else source
        errors += [
            f"{label}.model_loading_config: unknown field {k!r}"
            for k in loading
            if k not in MODEL_LOADING_CONFIG_FIELDS
        ]
    if llm_config.get("llm_engine", "vLLM") != "vLLM":
        errors.append(f"{label}.llm_engine {llm_config['llm_engine']!r}: serve.llm supports only 'vLLM'")

    engine_kwargs = llm_config.get("engine_kwargs") or {}
    if not isinstance(engine_kwargs, Mapping):
        errors.append(f"{label}.engine_kwargs must be a mapping")
        engine_kwargs = {}
    errors += [
        f"{label}.engine_kwargs: unknown vLLM engine argument {k!r} (not an EngineArgs or FrontendArgs field at "
        f'{VLLM_ARGS_SOURCE}); serve.llm fails with "Unknown engine argument: {k}"'
        for k in engine_kwargs
        if k not in KNOWN_ENGINE_KWARGS
    ]
    engine = _engine_settings(label, engine_kwargs, errors)
    if llm_config.get("log_engine_metrics", True) and engine_kwargs.get("disable_log_stats"):
        errors.append(f"{label}: disable_log_stats cannot be set while log_engine_metrics is on (serve.llm rejects it)")

    deployment_config = llm_config.get("deployment_config") or {}
    if "placement_group_bundles" in deployment_config or "placement_group_strategy" in deployment_config:
        errors.append(
            f"{label}.deployment_config: placement_group_bundles/strategy are serve.llm's to set; use "
            "placement_group_config"
        )
    deployment = server_deployment_name(model_id or "", prefix, deployment_config)
    gpus, fraction = _gpus(llm_config.get("placement_group_config"), engine)
    return LLMModel(
        deployment_name=deployment,
        role=role,
        model_id=model_id,
        model_source=model_source,
        accelerator_type=llm_config.get("accelerator_type"),
        gpus_per_replica=gpus,
        gpu_fraction=fraction,
        engine=engine,
        serve=_serve_settings(deployment, deployment_config, overrides, running),
        engine_kwargs=dict(engine_kwargs),
        errors=tuple(errors),
    )


def _engine_settings(label: str, engine_kwargs: Mapping[str, Any], errors: list[str]) -> dict[str, Setting]:
    settings = {}
    for key, (default, why) in _VLLM_DEFAULTS.items():
        if key in engine_kwargs and engine_kwargs[key] is not None:
            settings[key] = Setting(engine_kwargs[key], "engine_kwargs")
        else:
            settings[key] = Setting(default, why)
    for key in _POSITIVE_INTS:
        value = settings[key].value
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            errors.append(f"{label}.engine_kwargs.{key} must be a positive integer, got {value!r}")
    util = settings["gpu_memory_utilization"].value
    if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
        errors.append(f"{label}.engine_kwargs.gpu_memory_utilization must be in (0, 1], got {util!r}")
    return settings


def _gpus(placement_group_config: Any, engine: Mapping[str, Setting]) -> tuple[float | None, float | None]:
    """GPUs one replica's vLLM workers take, and the per-worker fraction when it is below one GPU."""
    tp, pp = engine["tensor_parallel_size"].value, engine["pipeline_parallel_size"].value
    workers = tp * pp if isinstance(tp, int) and isinstance(pp, int) else None
    if not isinstance(placement_group_config, Mapping):
        return (float(workers) if workers else None), None
    # As VLLMEngineConfig.placement_bundles: bundle_per_worker repeats per TP x PP worker, bundles are taken as is.
    per_worker = placement_group_config.get("bundle_per_worker")
    if isinstance(per_worker, Mapping):
        gpu = float(per_worker.get("GPU", 0))
        total = gpu * workers if workers else None
        return total, (gpu if 0 < gpu < 1 else None)
    bundles = [b for b in placement_group_config.get("bundles") or () if isinstance(b, Mapping)]
    gpus = [float(b.get("GPU", 0)) for b in bundles]
    fraction = next((g for g in gpus if g > 0), None)
    return sum(gpus), (fraction if fraction is not None and fraction < 1 else None)


def _serve_settings(
    deployment: str,
    deployment_config: Mapping[str, Any],
    overrides: Mapping[str | None, Any],
    running: Mapping[str, Any],
) -> dict[str, Setting]:
    """The Serve options that matter for an LLM engine, from the most to the least authoritative source."""
    live = (running.get(deployment) or {}).get("deployment_config") or {}
    override = overrides.get(deployment) or {}
    settings = {}
    for key in ("max_ongoing_requests", "health_check_period_s", "health_check_timeout_s"):
        settings[key] = _first(
            key,
            (live, "the running deployment"),
            (override, "the Serve config's deployments entry"),
            (deployment_config, "LLMConfig.deployment_config"),
            ({key: SERVE_LLM_DEFAULTS[key]}, _SERVE_LLM_DEFAULTS_SOURCE),
        )
    autoscaling = [
        ((source.get("autoscaling_config") or {}), where)
        for source, where in (
            (live, "the running deployment"),
            (override, "the Serve config's deployments entry"),
            (deployment_config, "LLMConfig.deployment_config"),
        )
    ]
    fixed = any(
        "num_replicas" in s and s["num_replicas"] not in (None, "auto") for s in (live, override, deployment_config)
    )
    default_target = {} if fixed else {"target_ongoing_requests": SERVE_LLM_DEFAULTS["target_ongoing_requests"]}
    target = _first("target_ongoing_requests", *autoscaling, (default_target, _SERVE_LLM_DEFAULTS_SOURCE))
    if target.value is not None:
        settings["target_ongoing_requests"] = target
    replicas = _first(
        "num_replicas",
        (live, "the running deployment"),
        (override, "the Serve config's deployments entry"),
        (deployment_config, "LLMConfig.deployment_config"),
    )
    if replicas.value is not None:
        settings["num_replicas"] = replicas
    return settings


def _first(key: str, *sources: tuple[Mapping[str, Any], str]) -> Setting:
    for values, where in sources:
        if values.get(key) is not None:
            return Setting(values[key], where)
    return Setting(None, "unset")
