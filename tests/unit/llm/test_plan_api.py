"""POST /api/v2/llm/plan/: a config.json and engine settings in, the KV cache and one GPU's memory out, and a
refusal naming the field for input the planner cannot use."""

from __future__ import annotations

import time

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.unit.llm.models import LLAMA3_8B, config

URL = "/api/v2/llm/plan/"
MEMORY_PARTS = {
    "weights",
    "activation_peak",
    "non_torch",
    "cuda_graphs",
    "kv_cache",
    "outside_budget",
    "total",
    "requested",
    "unused",
}


def plan(client, **body):
    return client.post(URL, {"config": config(LLAMA3_8B), "accelerator": "H100"} | body, format="json")


def refusal(response) -> tuple[str, str]:
    """The one field a 400 names, and its message."""
    assert response.status_code == 400, response.content
    ((field, messages),) = response.json().items()
    return field, " ".join(messages)


def test_llama3_8b_on_an_h100_has_every_field_of_the_contract(api_as):
    response = plan(api_as("viewer"))

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) >= {"vllm_version", "kv_cache_tokens", "max_concurrency", "fits", "memory", "problems"}
    assert body["fits"] is True and body["problems"] == []
    assert body["kv_cache_tokens"] > 100_000 and body["max_concurrency"] > 1
    assert set(body["memory"]) == MEMORY_PARTS
    assert all(isinstance(part["bytes"], int) and part["source"] for part in body["memory"].values())
    # 8.03 billion bfloat16 parameters on one GPU.
    assert body["memory"]["weights"]["bytes"] == 8_030_261_248 * 2
    assert set(body["suggestions"]) == {"max_model_len", "gpu_memory_utilization", "kv_cache_tokens", "engine_kwargs"}
    assert body["suggestions"]["engine_kwargs"]["max_model_len"] == 8192
    assert body["tradeoff"][-1]["max_model_len"] == 8192 and body["tradeoff"][-1]["fits"] is True
    assert body["tradeoff"][0]["max_concurrency"] > body["tradeoff"][-1]["max_concurrency"]


def test_any_signed_in_user_may_plan_with_a_session_or_a_token(people):
    # Planning reads no team's data: a user in no team plans like anyone else.
    session = APIClient()
    session.force_login(people["outsider"])
    assert plan(session).status_code == 200
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=people['viewer']).key}")
    assert plan(token).status_code == 200
    assert plan(APIClient()).status_code == 401


def test_the_v1_route_is_the_same_endpoint(api_as):
    response = api_as("viewer").post(
        "/api/v1/llm/plan/", {"config": config(LLAMA3_8B), "accelerator": "H100"}, format="json"
    )
    assert response.status_code == 200 and response.json()["fits"] is True


def test_a_config_without_its_layers_is_refused_naming_the_key(api_as):
    incomplete = {key: value for key, value in config(LLAMA3_8B).items() if key != "num_hidden_layers"}
    field, message = refusal(plan(api_as("viewer"), config=incomplete))
    assert field == "config" and "num_hidden_layers" in message


def test_no_config_at_all_is_refused(api_as):
    field, message = refusal(api_as("viewer").post(URL, {"accelerator": "H100"}, format="json"))
    assert field == "config" and "config.json" in message


def test_an_unknown_accelerator_needs_its_memory(api_as):
    field, message = refusal(plan(api_as("viewer"), accelerator="B300"))
    assert field == "accelerator" and "'B300'" in message and "gpu_memory_bytes" in message
    given = plan(api_as("viewer"), accelerator="B300", gpu_memory_bytes=180 * 2**30)
    assert given.status_code == 200 and given.json()["memory"]["total"]["bytes"] == 180 * 2**30


def test_a_max_model_len_above_the_models_context_is_refused(api_as):
    field, message = refusal(plan(api_as("viewer"), max_model_len=100_000))
    assert field == "max_model_len" and "8,192" in message


@pytest.mark.parametrize("value, words", [("high", "must be a number, got 'high'"), (1.5, "must be in (0, 1]")])
def test_gpu_memory_utilization_is_a_fraction(api_as, value, words):
    field, message = refusal(plan(api_as("viewer"), gpu_memory_utilization=value))
    assert field == "gpu_memory_utilization" and words in message


def test_a_deepseek_style_latent_attention_model_cannot_be_planned(api_as):
    field, message = refusal(plan(api_as("viewer"), config=config(LLAMA3_8B) | {"kv_lora_rank": 512}))
    assert field == "config" and "cannot be planned" in message and "kv_lora_rank" in message


def test_a_null_setting_is_vllms_default(api_as):
    response = plan(api_as("viewer"), tensor_parallel_size=None, max_num_seqs=None, gpu_memory_utilization=None)
    assert response.status_code == 200, response.content
    assert response.json()["figures"]["gpu_memory_utilization"]["value"] == 0.9


@pytest.mark.parametrize(
    "change",
    [
        {"num_hidden_layers": 10**9},  # the parser and the planner loop over the layers
        {"num_hidden_layers": 10**9, "model_type": "mistral", "sliding_window": 4096},
        {"rope_scaling": {"type": "linear", "factor": 1e300}},
        {"architectures": {"not": "a list"}},
        {"layer_types": 5},
    ],
)
def test_a_config_that_cannot_be_planned_is_refused_at_once(api_as, change):
    started = time.monotonic()
    field, _ = refusal(plan(api_as("viewer"), config=config(LLAMA3_8B) | change))
    assert field == "config" and time.monotonic() - started < 2


def test_a_body_that_is_no_object_is_refused(api_as):
    field, message = refusal(api_as("viewer").post(URL, [1, 2], format="json"))
    assert field == "detail" and "JSON object" in message
    nested = '{"config": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert api_as("viewer").post(URL, nested, content_type="application/json").status_code == 400


def test_a_form_body_is_not_taken(api_as):
    assert api_as("viewer").post(URL, {"accelerator": "H100"}).status_code == 415


def test_a_giant_body_is_refused_before_planning(api_as):
    # FLEETDECK_MAX_BODY_BYTES is 1 MiB by default; a config.json is a few kB.
    response = plan(api_as("viewer"), padding="x" * (2 << 20))
    assert response.status_code == 413, response.content
    assert "too large" in response.json()["detail"][0]


def test_the_schema_documents_the_request_and_the_answer(client):
    schema = client.get("/api/v2/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v2/llm/plan/"]["post"]
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    properties = schema["components"]["schemas"][answer]["properties"]
    assert {"kv_cache_tokens", "max_concurrency", "fits", "memory", "problems", "suggestions"} <= set(properties)
    assert "400" in operation["responses"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert "config" in schema["components"]["schemas"][body]["required"]
