"""Config lint for serve.llm deployments on vLLM. Pure functions over `Subject`, like rules.py.

A patch here is only what the push protocol can change: a deployment's Serve options (max_ongoing_requests,
health_check_timeout_s, autoscaling_config), which the Serve config's `deployments` entry overrides for a
serve.llm deployment too. vLLM's settings live in the application's args (`llm_configs[i].engine_kwargs`),
not in deployment options: those findings carry no patch and their message says what to change instead."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from apps.llm.accelerators import UnknownAccelerator, accelerator
from apps.llm.planner import safe_gpu_memory_utilization
from apps.llm.vllm_versions import accounting

if TYPE_CHECKING:
    from apps.remediation.rules import Hit, Subject

# More than this many times max_num_seqs waiting at one replica is a queue Serve cannot route around.
ONGOING_OVER_SEQS = 2
# The health check waits behind the batch like a first token does: half again the p99 leaves a margin.
HEALTH_CHECK_MARGIN = 1.5
# vLLM's smallest max_num_seqs default (EngineArgs.get_batch_defaults): used when the GPU is not known.
FALLBACK_MAX_NUM_SEQS = 256


def _hit(*args, **kwargs) -> Hit:
    from apps.remediation.rules import Hit

    return Hit(*args, **kwargs)


def _engine(s: Subject, key: str):
    setting = s.llm.engine.get(key) if s.llm else None
    return setting.value if setting else None


def _where(s: Subject) -> str:
    return (
        f"engine_kwargs of the LLMConfig of {s.llm.model_id} in application {s.application}'s args.llm_configs "
        "(a vLLM setting, not a deployment option: change the application's config)"
    )


def max_num_seqs(s: Subject) -> tuple[int, str]:
    """max_num_seqs as vLLM runs it, and where the figure comes from."""
    if isinstance(_engine(s, "max_num_seqs"), int):
        return _engine(s, "max_num_seqs"), "engine_kwargs max_num_seqs"
    if s.llm_plan is not None:
        return int(s.llm_plan.max_num_seqs.value), s.llm_plan.max_num_seqs.source
    return FALLBACK_MAX_NUM_SEQS, f"unset, GPU unknown: vLLM's smallest default ({FALLBACK_MAX_NUM_SEQS})"


def ongoing_unbounded(s: Subject) -> Hit | None:
    if not s.llm or not s.llm.engine:
        return None
    cap = s.llm.serve["max_ongoing_requests"]
    seqs, seqs_source = max_num_seqs(s)
    if cap.value is not None and cap.value <= ONGOING_OVER_SEQS * seqs:
        return None
    patch: dict = {"max_ongoing_requests": seqs}
    target = s.llm.serve.get("target_ongoing_requests")
    if target is not None and target.value > seqs:
        patch["autoscaling_config"] = {"target_ongoing_requests": max(2, seqs // 2)}
    message = (
        f"max_ongoing_requests is {cap.value:,} ({cap.source}) while the engine runs at most {seqs} sequences at once "
        f"(max_num_seqs, {seqs_source}): Serve keeps routing to a replica whose engine queue only grows, the health "
        f"check waits behind it and the replica is restarted (ray#54070). {seqs} lets Serve queue and route the rest."
    )
    evidence = {"max_ongoing_requests": cap.value, "source": cap.source, "max_num_seqs": seqs}
    return _hit("llm-ongoing-unbounded", "major", evidence, patch, message=message)


def gpu_memory_utilization(s: Subject) -> Hit | None:
    if not s.llm or not s.llm.engine:
        return None
    util = _engine(s, "gpu_memory_utilization")
    if s.llm_plan is not None:
        safe, minimum = s.llm_plan.safe_gpu_memory_utilization, s.llm_plan.minimum_gpu_memory_utilization
    else:
        try:
            gpu = accelerator(s.llm.accelerator_type, s.llm_gpu_memory_gib)
        except UnknownAccelerator:
            return None
        vllm, _ = accounting(ray_version=s.ray_version or None)
        safe = safe_gpu_memory_utilization(
            gpu,
            gpu_share=s.llm.gpu_fraction or 1.0,
            enforce_eager=bool(_engine(s, "enforce_eager")),
            tensor_parallel_size=_engine(s, "tensor_parallel_size") or 1,
            vllm=vllm,
        )
        minimum = None
    if util > safe.value:
        suggested, why = (
            safe.value,
            f"above the safe {safe.value:g} ({safe.source}): vLLM may OOM at start or at CUDA graph capture",
        )
    elif minimum is not None and util < minimum.value <= safe.value:
        suggested = minimum.value
        why = (
            f"below the {minimum.value:g} the model needs ({minimum.source}): "
            '"No available memory for the cache blocks"'
        )
    else:
        return None
    if s.llm_plan is not None and not _starts(s.llm_plan, gpu_memory_utilization=suggested):
        suggested = None  # vLLM would refuse the value too: say what is wrong, suggest nothing
    shared = f" on a {s.llm.gpu_fraction:g} share of a GPU" if s.llm.gpu_fraction else ""
    advice = f"Set it to {suggested:g}" if suggested is not None else "No utilisation fits: change the model's GPUs"
    message = f"gpu_memory_utilization {util:g}{shared} is {why}{_for(s)}. {advice} in the {_where(s)}."
    evidence = {
        "gpu_memory_utilization": util,
        "safe": safe.value,
        "minimum": minimum.value if minimum else None,
        "gpu_fraction": s.llm.gpu_fraction,
        "suggested": suggested,
    }
    return _hit("llm-gpu-memory-utilization", "major", evidence, None, message=message)


def _for(s: Subject) -> str:
    """Which vLLM the figures are for: its accounting differs between releases."""
    return f" (figures for {s.llm_plan.vllm})" if s.llm_plan is not None else ""


def _starts(plan, **changes) -> bool:
    """Whether vLLM would start with the suggested settings: the suggestion is planned before it is given."""
    return plan.replan(**changes).fits


def max_model_len(s: Subject) -> Hit | None:
    if not s.llm or not s.llm.engine:
        return None
    setting = s.llm.engine["max_model_len"]
    plan = s.llm_plan
    tokens = int(plan.kv_cache_tokens.value) if plan else None
    if setting.value is not None and (tokens is None or setting.value <= tokens):
        return None
    if setting.value is None:
        full = f" ({int(plan.max_model_len.value):,})" if plan else ""
        length = f"unset, so vLLM takes the model's max_position_embeddings{full}"
        severity = "warning" if tokens is None or plan.max_model_len.value <= tokens else "major"
    else:
        length, severity = f"{setting.value:,}", "major"
    if tokens is not None:
        fits = f"the KV cache holds {tokens:,} tokens at gpu_memory_utilization {plan.gpu_memory_utilization.value:g}"
        suggested = plan.suggestions()["max_model_len"]
        if suggested and not _starts(plan, max_model_len=suggested):
            suggested = None
        advice = (
            f"Set max_model_len to at most {suggested:,}, the longest prompt plus output you serve,"
            if suggested
            else "No max_model_len fits this cache: give the engine more memory or GPUs, and"
        )
    else:
        fits, suggested = "the KV cache it needs is not known (give the model's config.json)", None
        advice = "Set max_model_len to the longest prompt plus output you serve"
    message = (
        f"max_model_len is {length}; {fits}{_for(s)}. A length the cache cannot hold fails at start (vllm#2418), "
        "and an "
        f"unset one sizes the engine for the model's whole context (ray PR#58463). {advice} in the {_where(s)}."
    )
    evidence = {"max_model_len": setting.value, "kv_cache_tokens": tokens, "suggested": suggested}
    return _hit("llm-max-model-len", severity, evidence, None, message=message)


def health_check_short(s: Subject) -> Hit | None:
    if not s.llm or s.p99_ttft_s is None:
        return None
    timeout = s.llm.serve["health_check_timeout_s"]
    if timeout.value is None or timeout.value >= s.p99_ttft_s:
        return None
    suggested = math.ceil(s.p99_ttft_s * HEALTH_CHECK_MARGIN)
    message = (
        f"The health check times out after {timeout.value:g} s ({timeout.source}) and the measured p99 time to first "
        f"token is {s.p99_ttft_s:.1f} s: under load the check waits as long as a first token, fails, and Serve "
        f"restarts a working replica. {suggested} s is the p99 with half again as margin."
    )
    evidence = {"health_check_timeout_s": timeout.value, "p99_ttft_s": round(s.p99_ttft_s, 2), "suggested": suggested}
    return _hit("llm-health-check-short", "major", evidence, {"health_check_timeout_s": suggested}, message=message)


def target_of_one(s: Subject) -> Hit | None:
    if not s.llm:
        return None
    target = s.llm.serve.get("target_ongoing_requests")
    if target is None or target.value > 1:
        return None
    seqs, seqs_source = max_num_seqs(s)
    cap = s.llm.serve["max_ongoing_requests"].value or seqs
    suggested = max(2, min(cap, seqs) // 2)
    message = (
        f"Autoscaling targets {target.value:g} request per replica ({target.source}), but the engine batches up to "
        f"{seqs} sequences ({seqs_source}): every second concurrent request adds a replica, a GPU each, while the "
        f"ones running sit mostly idle. {suggested} (half the batch) scales on real load."
    )
    evidence = {"target_ongoing_requests": target.value, "max_num_seqs": seqs, "suggested": suggested}
    return _hit(
        "llm-target-one",
        "warning",
        evidence,
        {"autoscaling_config": {"target_ongoing_requests": suggested}},
        message=message,
    )
