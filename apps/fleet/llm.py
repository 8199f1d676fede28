"""LLM deployments as such: what serve.llm runs in a deployment, and its GPU memory plan, every figure with its source.

The pure work is apps.llm's; this module feeds it what Fleetdeck stores (the application's submitted config, the
running deployment options, the memory and model config an operator gave) and stores what the operator gives."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.db.models import Prefetch, prefetch_related_objects

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Application, Deployment
from apps.llm.accelerators import UnknownAccelerator
from apps.llm.deployment_plan import plan_llm_model
from apps.llm.planner import MemoryPlan, PlanError
from apps.llm.recognise import LLMModel, builder_of, deployment_role, recognise_app_config
from apps.llm.shapes import ModelConfigError, ModelShape, parse_hf_config

SET_PLAN_INPUTS = Permission(Role.OPERATOR, "give an LLM deployment's GPU memory or model config")

CONFIG_NEEDED = (
    "The model's config.json is needed to plan GPU memory and the KV cache (layers, KV heads, head dimension, "
    "dtype): Fleetdeck does not download it. Paste the config.json of {model} below."
)


def application_models(app: Application, deployments: list[Deployment] | None = None) -> list[LLMModel]:
    """The serve.llm models of an application, [] for any other; `deployments` are its live ones when known."""
    if deployments is None:
        # A list reads them for its page (read_for_descriptions): not one query per LLM deployment.
        deployments = getattr(app, "live_deployments", None)
    if deployments is None:
        deployments = list(app.deployments.filter(removed_at__isnull=True).only("name", "effective_config"))
    config = app.deployed_app_config or {"name": app.name, "import_path": app.import_path}
    running = {d.name: {"deployment_config": d.effective_config} for d in deployments}
    recognised = recognise_app_config(config, running=running, name=app.name)
    return list(recognised.models) if recognised else []


def could_serve_llm(deployment: Deployment) -> bool:
    """Built by a serve.llm builder or named like a serve.llm deployment: only then does a
    description read the application's config and its live deployments."""
    return builder_of(deployment.application.import_path) is not None or deployment_role(deployment.name) is not None


def read_for_descriptions(deployments: list[Deployment]) -> None:
    """What describing a page of deployments reads, for the few that could be LLM deployments, in
    two queries: their applications' configs and live deployments. Every row used to carry its
    application's config and every live sibling's config, decoded for rows that never read them.
    A list defers `application__deployed_app_config`; this fills it where it is needed."""
    # Each row has an application object of its own, even where two rows share the application.
    apps = [d.application for d in deployments if could_serve_llm(d)]
    if not apps:
        return
    configs = dict(Application.objects.filter(pk__in={app.pk for app in apps}).values_list("pk", "deployed_app_config"))
    for app in apps:
        app.deployed_app_config = configs.get(app.pk)
    prefetch_related_objects(
        apps,
        Prefetch(
            "deployments",
            queryset=Deployment.objects.filter(removed_at__isnull=True).only(
                "application_id", "name", "effective_config"
            ),
            to_attr="live_deployments",
        ),
    )


def deployments_by_model(cluster_id: int, models: set[str]) -> dict[str, tuple[str, str]]:
    """The (application, deployment) serving each of `models` (vLLM's `model_name`, serve.llm's
    model id) on the cluster: how an engine's metrics find their deployment."""
    if not models:
        return {}
    found = {}
    apps = Application.objects.filter(cluster_id=cluster_id, removed_at__isnull=True).prefetch_related(
        Prefetch(
            "deployments",
            queryset=Deployment.objects.filter(removed_at__isnull=True).only(
                "application_id", "name", "effective_config"
            ),
            to_attr="live_deployments",
        )
    )
    for app in apps:
        if builder_of(app.import_path) is None and not any(deployment_role(d.name) for d in app.live_deployments):
            continue
        for model in application_models(app):
            if model.model_id in models:
                found.setdefault(model.model_id, (app.name, model.deployment_name))
    return found


def recognised_model(deployment: Deployment) -> LLMModel | None:
    """The serve.llm model this deployment serves, or None when it is not a serve.llm deployment."""
    if not could_serve_llm(deployment):
        return None
    models = application_models(deployment.application)
    return next((m for m in models if m.deployment_name == deployment.name), None)


def model_shape(deployment: Deployment) -> ModelShape | None:
    """The shape of the model config the operator gave; ModelConfigError when it cannot be read."""
    return parse_hf_config(deployment.llm_model_config) if deployment.llm_model_config else None


def memory_plan(deployment: Deployment, model: LLMModel) -> tuple[MemoryPlan | None, list[str]]:
    """The plan, or why there is none: each reason says what to give."""
    try:
        shape = model_shape(deployment)
    except ModelConfigError as exc:
        return None, [f"The model config given cannot be read: {exc}"]
    if shape is None:
        return None, [CONFIG_NEEDED.format(model=model.model_id or model.deployment_name)]
    try:
        cluster = deployment.application.cluster
        return (
            plan_llm_model(model, shape, memory_gib=deployment.llm_gpu_memory_gib, ray_version=cluster.ray_version),
            [],
        )
    except UnknownAccelerator as exc:
        return None, [str(exc)]
    except PlanError as exc:
        return None, [str(exc)]


def _settings(settings: dict) -> dict[str, dict[str, Any]]:
    return {key: {"value": s.value, "source": s.source} for key, s in settings.items()}


def describe(deployment: Deployment) -> dict[str, Any] | None:
    """The LLM summary of a deployment, JSON-ready for the page and the API; None when it is no LLM deployment."""
    model = recognised_model(deployment)
    if model is None:
        return None
    plan, needs = memory_plan(deployment, model) if model.engine else (None, [])
    return {
        "model_id": model.model_id,
        "model_source": model.model_source,
        "role": model.role,
        "tensor_parallel_size": model.tensor_parallel_size,
        "pipeline_parallel_size": model.pipeline_parallel_size,
        "accelerator_type": model.accelerator_type,
        "gpus_per_replica": model.gpus_per_replica,
        "gpu_fraction": model.gpu_fraction,
        "engine": _settings(model.engine),
        "serve": _settings(model.serve),
        "errors": list(model.errors),
        "engine_visible": bool(model.engine),
        "gpu_memory_gib_given": deployment.llm_gpu_memory_gib,
        "model_config_given": deployment.llm_model_config is not None,
        "plan": _plan_dict(plan) if plan else None,
        "plan_needs": needs,
    }


def _plan_dict(plan: MemoryPlan) -> dict[str, Any]:
    figures = {name: asdict(value) for name, value in plan.figures().items()}
    return {"figures": figures, "problems": list(plan.problems), "vllm_version": plan.vllm}


def set_plan_inputs(
    actor: Actor, deployment: Deployment, *, gpu_memory_gib: float | None, model_config: dict | None
) -> Deployment:
    """Store the GPU memory and model config an operator gave; a value that cannot be used is refused."""
    if gpu_memory_gib is not None and not 0 < gpu_memory_gib <= 4096:
        raise ValueError(f"GPU memory is in GiB, above 0 and at most 4096; got {gpu_memory_gib:g}")
    if model_config is not None:
        if not isinstance(model_config, dict):
            raise ValueError("The model config is the JSON object of the model's config.json.")
        try:
            parse_hf_config(model_config)
        except ModelConfigError as exc:
            raise ValueError(f"The model config cannot be read: {exc}") from exc
    deployment.llm_gpu_memory_gib, deployment.llm_model_config = gpu_memory_gib, model_config
    deployment.save(update_fields=["llm_gpu_memory_gib", "llm_model_config", "updated_at"])
    # The LLM findings read these inputs, which no dashboard answer shows.
    sync.apply_in_full_next(Cluster.objects.filter(pk=deployment.application.cluster_id))
    record(
        actor,
        "deployment.llm_plan_inputs",
        deployment,
        team=deployment.application.cluster.team,
        changes={"gpu_memory_gib": gpu_memory_gib, "model_config_given": model_config is not None},
    )
    return deployment
