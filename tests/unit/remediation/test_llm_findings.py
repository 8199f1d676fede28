"""The serve.llm rules on configs in the shape of the installed ray.serve.llm schema, planned for published model
shapes, and their findings stored by a recompute after a sync."""

from __future__ import annotations

import pytest

from apps.clusters.models import Cluster
from apps.llm.deployment_plan import plan_llm_model
from apps.llm.recognise import recognise_app_config
from apps.remediation import findings, rules
from apps.remediation.models import Finding
from tests.llm_world import SERVER, llm_config, llm_deployment, openai_app
from tests.unit.llm.models import LLAMA3_8B, shape

# serve.llm's defaults as the running deployment reports them (DEFAULT_DEPLOYMENT_OPTIONS).
SERVE_LLM_RUNNING = {
    "max_ongoing_requests": 1_000_000_000,
    "health_check_timeout_s": 10,
    "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1_000_000_000},
}


def subject(config: dict | None = None, running: dict | None = None, *, planned: bool = True, **facts):
    running = SERVE_LLM_RUNNING if running is None else running
    app = recognise_app_config(openai_app(config or llm_config()), running={SERVER: {"deployment_config": running}})
    (model,) = app.models
    plan = plan_llm_model(model, shape(LLAMA3_8B)) if planned else None
    return rules.Subject(
        cluster_name="c",
        ray_version="2.60.0",
        application="llm",
        deployment=SERVER,
        effective=running,
        submitted={},
        llm=model,
        llm_plan=plan,
        **facts,
    )


def hits(s: rules.Subject) -> dict[str, rules.Hit]:
    return {hit.rule: hit for hit in rules.evaluate(s)}


def test_serve_llms_unbounded_default_is_capped_at_max_num_seqs():
    hit = hits(subject(llm_config(max_num_seqs=128)))["llm-ongoing-unbounded"]

    assert hit.patch == {"max_ongoing_requests": 128, "autoscaling_config": {"target_ongoing_requests": 64}}
    assert "1,000,000,000 (the running deployment)" in hit.message and "ray#54070" in hit.message


def test_unset_max_num_seqs_is_vllms_default_for_the_gpu():
    # An H100 (80 GB, not an A100) gets 1024 sequences from vLLM's OpenAI-server defaults.
    hit = hits(subject())["llm-ongoing-unbounded"]
    assert hit.patch["max_ongoing_requests"] == 1024 and hit.evidence["max_num_seqs"] == 1024


def test_a_cap_near_max_num_seqs_is_fine_and_gpu_rules_for_plain_models_stay_quiet():
    found = hits(subject(llm_config(max_num_seqs=64), {"max_ongoing_requests": 64, "health_check_timeout_s": 10}))
    assert "llm-ongoing-unbounded" not in found
    assert "gpu-concurrency" not in found and "heavy-autoscaling" not in found


def test_gpu_memory_utilization_above_the_safe_value_names_where_to_change_it():
    # Ray 2.60 runs vLLM 0.29, which counts CUDA graphs inside the budget: only the CUDA context lies outside.
    hit = hits(subject(llm_config(gpu_memory_utilization=0.995)))["llm-gpu-memory-utilization"]

    assert hit.patch is None
    assert hit.evidence["safe"] == 0.99 and hit.evidence["suggested"] == 0.99
    assert "Set it to 0.99 in the engine_kwargs of the LLMConfig" in hit.message
    assert "figures for vLLM 0.29.0" in hit.message
    assert "not a deployment option" in hit.message


def test_gpu_memory_utilization_on_a_shared_gpu_is_judged_against_the_share():
    config = llm_config(gpu_memory_utilization=0.6) | {"placement_group_config": {"bundles": [{"GPU": 0.5}]}}
    hit = hits(subject(config, planned=False))["llm-gpu-memory-utilization"]
    assert hit.evidence["gpu_fraction"] == 0.5 and hit.evidence["safe"] == 0.49
    assert "on a 0.5 share of a GPU" in hit.message


def test_gpu_memory_utilization_too_low_for_the_weights():
    hit = hits(subject(llm_config(gpu_memory_utilization=0.15)))["llm-gpu-memory-utilization"]
    assert hit.evidence["minimum"] == 0.24 and "No available memory for the cache blocks" in hit.message


def test_max_model_len_larger_than_the_kv_cache():
    # Llama-3-8B on one H100 at 0.9 holds 437,856 tokens with the estimated activation, on Ray 2.60's vLLM 0.29.
    hit = hits(subject(llm_config(max_model_len=1_000_000)))["llm-max-model-len"]
    assert hit.severity == "major" and hit.evidence["kv_cache_tokens"] == 437_856
    # The suggestion is the model's own context (8,192), which the cache holds: planned again, it starts.
    assert "Set max_model_len to at most 8,192" in hit.message and "vllm#2418" in hit.message
    assert "figures for vLLM 0.29.0" in hit.message


def test_unset_max_model_len_is_a_warning_even_without_a_plan():
    config = llm_config()
    del config["engine_kwargs"]["max_model_len"]
    hit = hits(subject(config, planned=False))["llm-max-model-len"]
    assert hit.severity == "warning" and hit.evidence["kv_cache_tokens"] is None
    assert "give the model's config.json" in hit.message


def test_health_check_timeout_below_the_measured_p99_ttft():
    hit = hits(subject(p99_ttft_s=14.2))["llm-health-check-short"]
    assert hit.patch == {"health_check_timeout_s": 22}
    assert "llm-health-check-short" not in hits(subject(p99_ttft_s=9.0))


def test_target_of_one_on_a_batching_engine():
    running = SERVE_LLM_RUNNING | {
        "max_ongoing_requests": 64,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1},
    }
    hit = hits(subject(llm_config(max_num_seqs=64), running))["llm-target-one"]
    assert hit.patch == {"autoscaling_config": {"target_ongoing_requests": 32}}


@pytest.fixture
def cluster(db, team):
    return Cluster.objects.create(
        name="llm-prod", team=team, dashboard_url="http://ray.test:8265", ray_version="2.60.0"
    )


def test_recompute_stores_llm_findings_with_their_patches(cluster):
    dep = llm_deployment(cluster, openai_app(llm_config(max_num_seqs=256, gpu_memory_utilization=0.995)))

    findings.recompute(cluster.pk)

    stored = {f.rule: f for f in Finding.objects.filter(deployment=dep)}
    assert stored["llm-ongoing-unbounded"].patch == {
        "max_ongoing_requests": 256,
        "autoscaling_config": {"target_ongoing_requests": 128},
    }
    # Without the model's config.json the rule still judges against the accelerator's safe value.
    assert stored["llm-gpu-memory-utilization"].patch is None
    assert "gpu-concurrency" not in stored


def test_a_wizard_on_an_llm_deployment_shows_its_gpu_memory_and_kv_cache_plan(cluster, people):
    from django.test import Client
    from django.urls import reverse

    from apps.remediation.models import Wizard

    dep = llm_deployment(cluster, openai_app(llm_config(max_num_seqs=256)))
    findings.recompute(cluster.pk)
    finding = Finding.objects.get(deployment=dep, rule="llm-ongoing-unbounded")
    client = Client()
    client.force_login(people["operator"])

    assert client.post(reverse("remediation:wizard_start"), {"finding": finding.pk}).status_code == 302
    page = client.get(reverse("remediation:wizard", args=[Wizard.objects.get(finding=finding).pk]))

    assert b"GPU memory and KV cache, per GPU" in page.content
    assert b"config.json is needed to plan GPU memory" in page.content
