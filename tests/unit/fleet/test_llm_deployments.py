"""LLM deployments on the cluster and deployment pages and in the API: the model, parallelism, accelerator and
engine settings with their sources, and the memory plan once what it needs is known (given by an operator)."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster
from tests.factories import ClusterFactory
from tests.llm_world import MODEL_ID, SERVER, llama_config, llm_config, llm_deployment, openai_app
from tests.unit.fleet.test_query_counts import add_to_cluster


@pytest.fixture
def cluster(db, team):
    return Cluster.objects.create(
        name="llm-prod", team=team, dashboard_url="http://ray.test:8265", ray_version="2.60.0"
    )


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_api_describes_the_llm_deployment_and_asks_for_the_model_config(cluster, api_as):
    dep = llm_deployment(cluster)

    body = api_as("viewer").get(f"/api/v1/deployments/{dep.pk}/").json()

    llm = body["llm"]
    assert (llm["model_id"], llm["tensor_parallel_size"], llm["pipeline_parallel_size"]) == (MODEL_ID, 1, 1)
    assert llm["accelerator_type"] == "H100"
    assert llm["engine"]["max_model_len"] == {"value": 8192, "source": "engine_kwargs"}
    assert llm["serve"]["max_ongoing_requests"] == {"value": 1_000_000_000, "source": "the running deployment"}
    assert llm["plan"] is None
    assert llm["plan_needs"] == [
        "The model's config.json is needed to plan GPU memory and the KV cache (layers, KV heads, head dimension, "
        f"dtype): Fleetdeck does not download it. Paste the config.json of {MODEL_ID} below."
    ]
    ingress = next(d for d in api_as("viewer").get("/api/v1/deployments/").json()["results"] if d["name"] != SERVER)
    assert ingress["llm"] is None


def test_given_the_model_config_the_plan_has_every_figure_with_its_source(cluster, api_as):
    dep = llm_deployment(cluster)

    response = api_as("operator").post(
        f"/api/v1/deployments/{dep.pk}/llm-inputs/", {"model_config": llama_config()}, format="json"
    )

    assert response.status_code == 200, response.content
    plan = response.json()["llm"]["plan"]
    figures = plan["figures"]
    assert figures["kv_bytes_per_token"]["value"] == 131_072
    assert figures["weights"]["value"] == 16_060_522_496
    assert figures["max_model_len"] == {"value": 8192, "unit": "tokens", "source": "engine_kwargs max_model_len"}
    assert all(f["source"] for f in figures.values())
    assert figures["kv_cache_tokens"]["value"] > 8192 and not plan["problems"]
    event = AuditEvent.objects.get(action="deployment.llm_plan_inputs")
    assert event.changes == {"gpu_memory_gib": None, "model_config_given": True}


def test_an_unknown_accelerator_asks_for_the_memory_and_the_given_size_is_stored(cluster, api_as):
    dep = llm_deployment(cluster, openai_app(llm_config() | {"accelerator_type": "MI300X"}))
    api = api_as("operator")
    api.post(f"/api/v1/deployments/{dep.pk}/llm-inputs/", {"model_config": llama_config()}, format="json")

    (need,) = api.get(f"/api/v1/deployments/{dep.pk}/").json()["llm"]["plan_needs"]
    assert need.startswith("Fleetdeck does not know the memory of accelerator type 'MI300X': give the GPU memory")

    body = api.post(
        f"/api/v1/deployments/{dep.pk}/llm-inputs/",
        {"gpu_memory_gib": 192, "model_config": llama_config()},
        format="json",
    ).json()
    assert body["llm_gpu_memory_gib"] == 192
    requested = body["llm"]["plan"]["figures"]["requested_per_gpu"]
    assert requested["value"] == pytest.approx(0.9 * 192 * 2**30)
    assert "192.00 GiB, as given" in requested["source"]


def test_a_model_config_that_cannot_be_read_is_refused_and_nothing_is_stored(cluster, api_as):
    dep = llm_deployment(cluster)
    broken = {k: v for k, v in llama_config().items() if k != "num_hidden_layers"}

    response = api_as("operator").post(
        f"/api/v1/deployments/{dep.pk}/llm-inputs/", {"model_config": broken}, format="json"
    )

    assert response.status_code == 400
    assert "The model config cannot be read" in response.json()["detail"][0]
    assert "num_hidden_layers" in response.json()["detail"][0]
    dep.refresh_from_db()
    assert dep.llm_model_config is None and not AuditEvent.objects.filter(action="deployment.llm_plan_inputs")


def test_the_deployment_page_shows_the_plan_and_takes_the_inputs(cluster, people):
    dep = llm_deployment(cluster)
    operator = client_of(people["operator"])
    url = reverse("fleet:deployment", args=[dep.pk])

    page = operator.get(url).content.decode()
    assert f"LLM: {MODEL_ID}" in page and "Paste the config.json of" in page
    assert 'name="gpu_memory_gib"' in page

    answer = operator.post(reverse("fleet:llm_inputs", args=[dep.pk]), {"model_config": json.dumps(llama_config())})
    assert answer.status_code == 302
    page = operator.get(url).content.decode()
    assert "kv_cache_tokens" in page and "engine_kwargs max_model_len" in page

    answer = operator.post(reverse("fleet:llm_inputs", args=[dep.pk]), {"model_config": "{not json"}, follow=True)
    assert "The model config is not JSON" in answer.content.decode()
    viewer_page = client_of(people["viewer"]).get(url).content.decode()
    assert 'name="gpu_memory_gib"' not in viewer_page


def test_the_cluster_page_names_the_model_and_its_settings(cluster, people):
    llm_deployment(cluster, openai_app(llm_config(tensor_parallel_size=2, max_num_seqs=64)))

    page = client_of(people["viewer"]).get(reverse("fleet:cluster_status", args=[cluster.pk])).content.decode()

    assert f"<strong>{MODEL_ID}</strong> in {SERVER}" in page
    assert "TP 2 × PP 1 · H100 · gpu_memory_utilization 0.9 · max_model_len 8192 · max_num_seqs 64" in page


def test_listing_llm_deployments_costs_the_same_queries_for_one_application_or_five(cluster, api_as):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            body = api_as("viewer").get("/api/v1/deployments/").json()
        assert all(d["llm"] for d in body["results"] if d["name"] == SERVER)
        return len(queries)

    llm_deployment(cluster, openai_app() | {"name": "llm-0"})
    one = count()
    for n in range(1, 5):
        llm_deployment(cluster, openai_app() | {"name": f"llm-{n}"})
    assert count() == one


def test_a_list_row_describes_each_deployment_as_its_detail_does(cluster, api_as):
    """A list reads configs only for the rows that could be LLM deployments, and two rows of one
    application each read them."""
    llm_deployment(cluster, openai_app(llm_config(tensor_parallel_size=2)))
    other = ClusterFactory(team=cluster.team, name="plain")
    add_to_cluster(other, None, 2)
    api = api_as("viewer")
    rows = api.get("/api/v1/deployments/").json()["results"]
    assert any(row["llm"] for row in rows) and any(row["llm"] is None for row in rows)
    for row in rows:
        assert row["llm"] == api.get(f"/api/v1/deployments/{row['id']}/").json()["llm"], row["name"]
