"""Recognising serve.llm applications in the configs Ray 2.60's dashboard returns.

The LLMConfig dicts are built by hand from the installed schema (ray/llm/_internal/serve/core/configs/
llm_config.py; test_ray_schema.py checks the field names against it): `LLMConfig(...).model_dump()` is out of
reach because importing ray.serve.llm needs pyarrow. The application entries wrap them in the shape of the
captured tests/fixtures/ray/serve_applications_running.json.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from apps.llm.accelerators import UnknownAccelerator
from apps.llm.deployment_plan import plan_llm_model
from apps.llm.planner import PlanError
from apps.llm.recognise import deployment_role, recognise_app_config, recognise_application
from tests.unit.llm.models import LLAMA3_8B, QWEN25_32B, shape

RAY_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ray"


def captured_running() -> dict:
    return json.loads((RAY_FIXTURES / "serve_applications_running.json").read_text())


def llm_config(model_id="Qwen/Qwen2.5-32B-Instruct", **changes) -> dict:
    config = {
        "model_loading_config": {"model_id": model_id, "model_source": model_id},
        "accelerator_type": "H100",
        "engine_kwargs": {
            "tensor_parallel_size": 2,
            "max_model_len": 32768,
            "gpu_memory_utilization": 0.92,
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 8192,
            "enable_prefix_caching": True,
            "enable_auto_tool_choice": True,  # a FrontendArgs field
            "tool_call_parser": "hermes",
        },
        "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}},
    }
    return config | changes


def openai_app(*llm_configs, **changes) -> dict:
    return {
        "name": "llm",
        "route_prefix": "/",
        "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": list(llm_configs)},
    } | changes


def running_deployment(name: str, **deployment_config) -> dict:
    """A running deployment's status in the captured shape, its deployment_config changed."""
    model = copy.deepcopy(captured_running()["applications"]["demo"]["deployments"]["Model"])
    model["name"] = name
    model["deployment_config"] = model["deployment_config"] | {"name": name} | deployment_config
    return model


def test_a_build_openai_app_config():
    app = recognise_app_config(openai_app(llm_config()))
    assert (app.name, app.builder, app.recognised_by, app.ingress_deployment) == (
        "llm",
        "build_openai_app",
        "import_path",
        "OpenAiIngress",
    )
    assert app.errors == ()
    (model,) = app.models
    assert model.deployment_name == "LLMServer:Qwen--Qwen2_5-32B-Instruct"
    assert (model.role, model.model_id, model.accelerator_type) == ("server", "Qwen/Qwen2.5-32B-Instruct", "H100")
    assert (model.tensor_parallel_size, model.pipeline_parallel_size, model.gpus_per_replica) == (2, 1, 2.0)
    assert model.errors == ()
    engine = model.engine
    assert (engine["max_model_len"].value, engine["max_model_len"].source) == (32768, "engine_kwargs")
    assert engine["gpu_memory_utilization"].value == 0.92
    assert engine["pipeline_parallel_size"].source == "unset: vLLM's default"
    assert engine["max_num_seqs"].value is None and "256, or 1024" in engine["max_num_seqs"].source
    assert engine["kv_cache_dtype"].value == "auto"


def test_serve_llm_defaults_where_unset():
    (model,) = recognise_app_config(openai_app(llm_config())).models
    serve = model.serve
    assert serve["max_ongoing_requests"].value == 1_000_000_000  # effectively unbounded (ray#54070)
    assert "DEFAULT_DEPLOYMENT_OPTIONS" in serve["max_ongoing_requests"].source
    assert (serve["health_check_timeout_s"].value, serve["health_check_period_s"].value) == (10, 10)
    assert serve["target_ongoing_requests"].value == 1_000_000_000
    assert "num_replicas" not in serve


def test_settings_from_the_llm_config_the_serve_config_and_the_running_deployment():
    config = llm_config(deployment_config={"max_ongoing_requests": 64, "health_check_timeout_s": 30})
    app = openai_app(
        config, deployments=[{"name": "LLMServer:Qwen--Qwen2_5-32B-Instruct", "health_check_timeout_s": 60}]
    )
    (model,) = recognise_app_config(app).models
    assert (model.serve["max_ongoing_requests"].value, model.serve["max_ongoing_requests"].source) == (
        64,
        "LLMConfig.deployment_config",
    )
    assert (model.serve["health_check_timeout_s"].value, model.serve["health_check_timeout_s"].source) == (
        60,
        "the Serve config's deployments entry",
    )

    name = "LLMServer:Qwen--Qwen2_5-32B-Instruct"
    status = {
        "name": "llm",
        "status": "RUNNING",
        "deployed_app_config": app,
        "deployments": {
            name: running_deployment(name, max_ongoing_requests=48),
            "OpenAiIngress": running_deployment("OpenAiIngress"),
        },
    }
    (model,) = recognise_application(status).models
    assert (model.serve["max_ongoing_requests"].value, model.serve["max_ongoing_requests"].source) == (
        48,
        "the running deployment",
    )
    # The captured deployment autoscales with a target of 4, which the running config reports.
    assert model.serve["target_ongoing_requests"].value == 4.0


def test_num_replicas_drops_serve_llm_autoscaling_default():
    (model,) = recognise_app_config(openai_app(llm_config(deployment_config={"num_replicas": 2}))).models
    assert "target_ongoing_requests" not in model.serve
    assert model.serve["num_replicas"].value == 2


def test_an_explicit_deployment_name():
    (model,) = recognise_app_config(openai_app(llm_config(deployment_config={"name": "qwen"}))).models
    assert model.deployment_name == "LLMServer:qwen"


def test_dotted_import_path():
    assert recognise_app_config(openai_app(llm_config(), import_path="ray.serve.llm.build_openai_app")) is not None


def test_unknown_engine_kwargs_are_errors():
    config = llm_config()
    config["engine_kwargs"] |= {"tensor_paralel_size": 2, "max_num_seq": 64}
    (model,) = recognise_app_config(openai_app(config)).models
    assert len(model.errors) == 2
    assert "unknown vLLM engine argument 'tensor_paralel_size'" in model.errors[0]
    assert 'serve.llm fails with "Unknown engine argument: max_num_seq"' in model.errors[1]
    assert "vllm-project/vllm@5606eaf" in model.errors[0]


def test_bad_engine_values():
    config = llm_config()
    config["engine_kwargs"] |= {"tensor_parallel_size": "2", "gpu_memory_utilization": 1.5, "disable_log_stats": True}
    (model,) = recognise_app_config(openai_app(config)).models
    assert any("tensor_parallel_size must be a positive integer, got '2'" in e for e in model.errors)
    assert any("gpu_memory_utilization must be in (0, 1], got 1.5" in e for e in model.errors)
    assert any("disable_log_stats cannot be set while log_engine_metrics is on" in e for e in model.errors)


def test_unknown_llm_config_fields_and_a_missing_model_id():
    config = llm_config(engine_args={}, model_loading_config={"model_source": "s3://bucket/model"})
    (model,) = recognise_app_config(openai_app(config)).models
    assert "llm_configs[0]: unknown LLMConfig field 'engine_args' (serve.llm forbids extra fields)" in model.errors
    assert "llm_configs[0].model_loading_config.model_id is required" in model.errors


def test_other_llm_config_errors():
    config = llm_config(llm_engine="SGLang", deployment_config={"placement_group_bundles": [{"GPU": 1}]})
    (model,) = recognise_app_config(openai_app(config)).models
    assert any("supports only 'vLLM'" in e for e in model.errors)
    assert any("use placement_group_config" in e for e in model.errors)


def test_llm_configs_given_as_yaml_paths_are_not_readable():
    app = recognise_app_config(openai_app("/home/ray/models/qwen.yaml", llm_config()))
    assert len(app.models) == 1
    (error,) = app.errors
    assert "args.llm_configs[0] is '/home/ray/models/qwen.yaml'" in error
    assert recognise_app_config(openai_app() | {"args": {}}).errors[0].startswith("args.llm_configs must be")


def test_build_llm_deployment_is_not_a_serve_builder():
    app = recognise_app_config({"import_path": "ray.serve.llm:build_llm_deployment", "args": llm_config()})
    assert app.builder == "build_llm_deployment"
    assert "Serve calls builders with one argument" in app.errors[0]
    assert app.models[0].deployment_name == "LLMServer:Qwen--Qwen2_5-32B-Instruct"


def test_prefill_decode_app():
    prefill = llm_config(
        engine_kwargs={"tensor_parallel_size": 1, "kv_transfer_config": {"kv_connector": "NixlConnector"}}
    )
    decode = llm_config(
        engine_kwargs={"tensor_parallel_size": 2, "kv_transfer_config": {"kv_connector": "NixlConnector"}}
    )
    app = recognise_app_config(
        {
            "import_path": "ray.serve.llm:build_pd_openai_app",
            "args": {"prefill_config": prefill, "decode_config": decode},
        }
    )
    assert [(m.role, m.deployment_name, m.tensor_parallel_size) for m in app.models] == [
        ("prefill", "Prefill:Qwen--Qwen2_5-32B-Instruct", 1),
        ("decode", "Decode:Qwen--Qwen2_5-32B-Instruct", 2),
    ]
    assert app.errors == ()


def test_data_parallel_app():
    config = llm_config(engine_kwargs={"data_parallel_size": 4})
    app = recognise_app_config({"import_path": "ray.serve.llm:build_dp_openai_app", "args": {"llm_config": config}})
    (model,) = app.models
    assert model.deployment_name == "DPServer:Qwen--Qwen2_5-32B-Instruct"
    assert model.engine["data_parallel_size"].value == 4
    assert recognise_app_config({"import_path": "ray.serve.llm:build_dp_openai_app", "args": {}}).errors == (
        "args.llm_config is missing",
    )


def test_fractional_gpus_from_the_placement_group():
    shared = llm_config(placement_group_config={"bundle_per_worker": {"GPU": 0.5, "CPU": 1}})
    (model,) = recognise_app_config(openai_app(shared)).models
    assert (model.gpus_per_replica, model.gpu_fraction) == (1.0, 0.5)  # TP 2 workers of half a GPU
    bundles = llm_config(placement_group_config={"bundles": [{"CPU": 1}, {"GPU": 0.25}, {"GPU": 0.25}]})
    (model,) = recognise_app_config(openai_app(bundles)).models
    assert (model.gpus_per_replica, model.gpu_fraction) == (0.5, 0.25)


def test_a_user_module_is_recognised_by_its_deployment_names():
    status = {
        "name": "chat",
        "deployed_app_config": {"name": "chat", "import_path": "chat_app:app"},
        "deployments": {
            "LLMServer:meta-llama--Llama-3_1-8B-Instruct": running_deployment(
                "LLMServer:meta-llama--Llama-3_1-8B-Instruct", max_ongoing_requests=1_000_000_000
            ),
            "OpenAiIngress": running_deployment("OpenAiIngress"),
        },
    }
    app = recognise_application(status)
    assert (app.recognised_by, app.builder, app.ingress_deployment) == ("deployment names", None, "OpenAiIngress")
    (model,) = app.models
    assert model.model_id == "meta-llama/Llama-3_1-8B-Instruct"  # the "." became "_" for good
    assert model.serve["max_ongoing_requests"].value == 1_000_000_000
    assert model.engine == {}
    assert "engine settings are not visible" in app.errors[0]


def test_other_applications_are_not_llm():
    for application in captured_running()["applications"].values():
        assert recognise_application(application) is None
    assert recognise_app_config({"import_path": "ray.serve.llm:build_something_else"}) is None


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("LLMServer:qwen", "server"),
        ("DPServer:qwen", "server"),
        ("Prefill:qwen", "prefill"),
        ("Decode:qwen", "decode"),
        ("OpenAiIngress", "ingress"),
        ("LLMRouter", "ingress"),
        ("Model", None),
    ],
)
def test_deployment_roles(name, role):
    assert deployment_role(name) == role


def test_planning_a_recognised_model():
    (model,) = recognise_app_config(openai_app(llm_config())).models
    plan = plan_llm_model(model, shape(QWEN25_32B))
    assert plan.parallel.tensor == 2
    assert plan.gpu_memory_utilization.value == 0.92
    assert plan.max_model_len.value == 32768
    assert plan.fits


def test_planning_needs_a_known_accelerator_or_its_memory():
    (model,) = recognise_app_config(openai_app(llm_config(accelerator_type="RTX-PRO-6000"))).models
    with pytest.raises(UnknownAccelerator, match="give the GPU memory size"):
        plan_llm_model(model, shape(QWEN25_32B))
    assert plan_llm_model(model, shape(QWEN25_32B), memory_gib=95).fits


def test_planning_refuses_what_it_cannot_see():
    config = llm_config(model_loading_config={"model_id": "meta-llama/Meta-Llama-3-8B"})
    config["engine_kwargs"] = {"swap_spcae": 4}
    (model,) = recognise_app_config(openai_app(config)).models
    with pytest.raises(PlanError, match="config errors"):
        plan_llm_model(model, shape(LLAMA3_8B))
    status = {"deployed_app_config": {"import_path": "app:app"}, "deployments": {"LLMServer:x": {}}}
    with pytest.raises(PlanError, match="not visible"):
        plan_llm_model(recognise_application(status).models[0], shape(LLAMA3_8B))
