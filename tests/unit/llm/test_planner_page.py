"""The "LLM capacity planner" page: the form, its answer (the memory bar, the trade-off, engine_kwargs), refusals
next to the field they name, and the models of the user's teams only."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client
from django.urls import reverse

from apps.clusters.models import Cluster
from apps.llm.views import memory_bar
from tests.llm_world import llm_deployment
from tests.unit.llm.models import LLAMA3_8B, QWEN25_32B, config

URL = "/llm/planner/"
SETTINGS = {
    "accelerator": "H100",
    "tensor_parallel_size": "1",
    "pipeline_parallel_size": "1",
    "gpu_memory_utilization": "0.9",
    "kv_cache_dtype": "auto",
}


@pytest.fixture
def viewer(client, people) -> Client:
    client.force_login(people["viewer"])
    return client


def post(client: Client, htmx: bool = False, **fields) -> str:
    data = {"config": json.dumps(config(LLAMA3_8B))} | SETTINGS | fields
    response = client.post(URL, data, **({"HTTP_HX_REQUEST": "true"} if htmx else {}))
    assert response.status_code == 200
    return response.content.decode()


def field_block(page: str, name: str) -> str:
    """The form field `name` with its label, help and errors (templates/partials/field.html)."""
    match = re.search(
        rf'<div class="field[^"]*">\s*<label[^>]*>[^<]*</label>\s*<[^>]*name="{name}".*?</div>\s*', page, re.S
    )
    assert match, f"no field {name}"
    start = match.start()
    end = page.find('<div class="field', match.end())
    return page[start : end if end != -1 else len(page)]


def test_the_page_explains_itself_before_anything_is_planned(viewer):
    page = viewer.get(URL).content.decode()
    assert "<h1>LLM capacity planner</h1>" in page
    assert "Paste a model's config.json" in page and 'id="memory-bar"' not in page
    assert f'href="{reverse("llm:planner")}"' in page  # the nav links it
    assert f'hx-post="{URL}"' in page and 'method="post"' in page


def test_only_signed_in_users_see_it(client):
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_a_plain_post_renders_the_page_with_the_bar_the_tradeoff_and_engine_kwargs(viewer):
    page = post(viewer)
    assert "<h1>LLM capacity planner</h1>" in page and "Fits" in page
    bar = re.search(r'<svg class="chart" id="memory-bar".*?</svg>', page, re.S).group(0)
    parts = dict(re.findall(r'<rect x="[\d.]+" y="0" width="([\d.]+)" height="40" fill="[^"]+" data-part="(\w+)"', bar))
    widths = {part: float(width) for width, part in parts.items()}
    assert {"weights", "activation_peak", "kv_cache", "unused"} <= set(widths)
    assert abs(sum(widths.values()) - 1000) < 0.1  # the whole GPU, nothing more
    assert widths["kv_cache"] > widths["weights"] > 0
    assert "Weights: 14.96 GiB" in bar  # each part's size and source on hover, and in the legend
    legend = re.search(r'<table class="grid compact" id="memory-parts">.*?</table>', page, re.S).group(0)
    assert "<td>Weights</td><td>14.96</td>" in legend and "8,030,261,248 parameters" in legend
    tradeoff = re.search(r'<table class="grid compact" id="tradeoff">.*?</table>', page, re.S).group(0)
    assert "<td>1,024</td>" in tradeoff and '8,192 <span class="chip">planned</span>' in tradeoff
    kwargs = re.search(r'<pre class="json" id="engine-kwargs">(.*?)</pre>', page, re.S).group(1)
    assert json.loads(kwargs.replace("&quot;", '"'))["max_model_len"] == 8192
    assert "llm_configs[i].engine_kwargs" in page
    assert re.search(r'id="kv-cache-tokens">[\d,]+<', page)


def test_htmx_gets_the_form_and_the_answer_alone(viewer):
    fragment = post(viewer, htmx=True)
    assert fragment.lstrip().startswith('<div id="planner">') and "<html" not in fragment
    assert 'id="memory-bar"' in fragment and 'id="tradeoff"' in fragment


def test_a_model_that_does_not_fit_says_why_and_draws_past_the_gpu(viewer):
    page = post(viewer, config=json.dumps(config(QWEN25_32B)), accelerator="L4")
    assert "Does not fit" in page and '<ul class="alert">' in page
    assert 'stroke="#c53030"' in page  # the GPU's end, before the parts' sum


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("max_model_len", "100000", "above the model&#x27;s context length 8,192"),
        ("gpu_memory_utilization", "1.5", "must be in (0, 1], got 1.5"),
        ("gpu_memory_utilization", "high", "Enter a number."),
        ("vllm_version", "abc", "not a version number"),
    ],
)
def test_a_refusal_shows_next_to_the_field_it_names(viewer, field, value, words):
    page = post(viewer, htmx=True, **{field: value})
    assert words in field_block(page, field) and "has-error" in field_block(page, field)
    assert 'id="memory-bar"' not in page


def test_a_config_that_cannot_be_planned_is_refused_on_the_config(viewer):
    page = post(viewer, config=json.dumps(config(LLAMA3_8B) | {"kv_lora_rank": 512}))
    assert "cannot be planned" in field_block(page, "config")
    assert "This is not JSON" in field_block(post(viewer, config="{nope"), "config")
    assert "or pick a model" in field_block(post(viewer, config=""), "config")


def test_another_accelerator_needs_its_memory(viewer):
    assert "Give the GPU memory" in field_block(post(viewer, accelerator="other"), "gpu_memory_gib")
    page = post(viewer, accelerator="other", gpu_memory_gib="96")
    assert "One GPU's memory: 96.00 GiB" in page


@pytest.fixture
def models(team, other_team):
    """A model with its config.json given in each team."""
    mine = llm_deployment(Cluster.objects.create(name="ours", team=team, dashboard_url="http://ray.test:8265"))
    theirs = llm_deployment(
        Cluster.objects.create(name="theirs", team=other_team, dashboard_url="http://ray.test:8265")
    )
    for deployment in (mine, theirs):
        deployment.llm_model_config = config(LLAMA3_8B)
        deployment.save()
    return mine, theirs


def test_a_user_picks_only_models_of_their_teams(viewer, models):
    mine, theirs = models
    page = viewer.get(URL).content.decode()
    assert f'<option value="{mine.pk}">ours/' in page
    assert f'value="{theirs.pk}"' not in page and "theirs/" not in page

    planned = post(viewer, config="", model=str(mine.pk))
    assert 'id="memory-bar"' in planned and "14.96 GiB" in planned

    refused = post(viewer, config="", model=str(theirs.pk))
    assert "Select a valid choice" in field_block(refused, "model") and 'id="memory-bar"' not in refused
    assert "theirs/" not in refused


def test_a_config_and_a_model_together_are_refused(viewer, models):
    page = post(viewer, model=str(models[0].pk))
    assert "not both" in field_block(page, "config")


def test_cuda_graphs_outside_the_budget_are_drawn_past_it():
    # Before vLLM 0.20 the CUDA graphs are not counted in gpu_memory_utilization's budget.
    gib = 2**30
    sizes = {"weights": 15, "activation_peak": 2, "non_torch": 1, "cuda_graphs": 1, "kv_cache": 54, "outside_budget": 1}
    memory = {name: {"bytes": size * gib, "source": name} for name, size in sizes.items()}
    memory["cuda_graphs"]["inside_budget"] = False
    memory |= {name: {"bytes": size * gib, "source": name} for name, size in {"total": 80, "requested": 72}.items()}
    memory["unused"] = {"bytes": 6 * gib, "source": "unused"}

    bar = memory_bar(memory)

    assert [s["name"] for s in bar["segments"]] == [
        "weights",
        "activation_peak",
        "non_torch",
        "kv_cache",
        "cuda_graphs",
        "outside_budget",
        "unused",
    ]
    kv = next(s for s in bar["segments"] if s["name"] == "kv_cache")
    assert kv["x"] + kv["width"] == bar["budget_x"] == 900 and bar["total_x"] is None
