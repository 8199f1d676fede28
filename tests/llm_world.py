"""A serve.llm application as Fleetdeck stores it after a sync: the application's submitted config (the
`build_openai_app` args in the shape of the installed ray.serve.llm schema) and its LLMServer deployment."""

from __future__ import annotations

from apps.clusters.models import Cluster
from apps.fleet.models import Application, Deployment
from tests.unit.llm.models import LLAMA3_8B, config

MODEL_ID = "meta-llama/Meta-Llama-3-8B-Instruct"
SERVER = "LLMServer:meta-llama--Meta-Llama-3-8B-Instruct"


def llm_config(**engine_kwargs) -> dict:
    return {
        "model_loading_config": {"model_id": MODEL_ID, "model_source": MODEL_ID},
        "accelerator_type": "H100",
        "engine_kwargs": {"max_model_len": 8192, "gpu_memory_utilization": 0.9} | engine_kwargs,
    }


def openai_app(*llm_configs: dict) -> dict:
    return {
        "name": "llm",
        "route_prefix": "/v1",
        "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": list(llm_configs or (llm_config(),))},
    }


def llm_deployment(cluster: Cluster, app_config: dict | None = None, **effective) -> Deployment:
    """The LLMServer deployment of a serve.llm app; `effective` overrides its running deployment options."""
    app_config = app_config or openai_app()
    app = Application.objects.create(
        cluster=cluster,
        name=app_config["name"],
        status="RUNNING",
        import_path=app_config["import_path"],
        deployed_app_config=app_config,
    )
    # serve.llm's defaults as the running deployment reports them (DEFAULT_DEPLOYMENT_OPTIONS).
    options = {
        "name": SERVER,
        "max_ongoing_requests": 1_000_000_000,
        "health_check_period_s": 10,
        "health_check_timeout_s": 10,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 1_000_000_000},
    } | effective
    Deployment.objects.create(application=app, name="OpenAiIngress", status="HEALTHY", effective_config={})
    return Deployment.objects.create(
        application=app,
        name=SERVER,
        status="HEALTHY",
        effective_config=options,
        max_ongoing_requests=options.get("max_ongoing_requests"),
    )


def llama_config() -> dict:
    return config(LLAMA3_8B)
