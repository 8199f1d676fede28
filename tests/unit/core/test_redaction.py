"""Placeholders for secrets: what they hide, what they still tell, and putting the values back."""

from __future__ import annotations

import copy

import pytest

from apps.core.redaction import (
    PlaceholderUnmatched,
    placeholder,
    redact_anywhere,
    redact_config,
    redact_headers,
    redact_patch,
    redact_quoted_input,
    restore_placeholders,
    secret_values,
)
from apps.maintenance.execution import GENERATION_VAR
from tests.conftest import ray_fixture

CONFIG = {
    "applications": [
        {
            "name": "chat",
            "import_path": "ray.serve.llm:build_openai_app",
            "runtime_env": {"pip": ["vllm"], "env_vars": {"HF_TOKEN": "hf_abc"}},
            "args": {
                "llm_configs": [
                    {
                        "runtime_env": {"env_vars": {"WANDB_API_KEY": "wandb_abc"}},
                        "engine_kwargs": {"hf_token": "hf_def", "max_num_seqs": 8},
                    }
                ]
            },
            "deployments": [
                {
                    "name": "LLMServer",
                    "max_ongoing_requests": 8,
                    "ray_actor_options": {"runtime_env": {"env_vars": {"AWS_KEY": "aws_abc", GENERATION_VAR: "3"}}},
                }
            ],
        }
    ]
}


def test_a_placeholder_hides_the_value_yet_tells_a_changed_one_and_depends_on_the_secret_key(settings):
    token = placeholder("hf_abc")
    assert token.startswith("<redacted:") and "hf_abc" not in token
    assert placeholder("hf_abc") == token != placeholder("hf_abd")
    assert placeholder(token) == token
    settings.SECRET_KEY = "another key"
    assert placeholder("hf_abc") != token


def test_every_secret_of_a_serve_config_is_redacted_but_the_recycle_generation_and_the_rest_stay():
    original = copy.deepcopy(CONFIG)
    (app,) = redact_config(CONFIG)["applications"]

    assert app["runtime_env"] == {"pip": ["vllm"], "env_vars": {"HF_TOKEN": placeholder("hf_abc")}}
    llm = app["args"]["llm_configs"][0]
    assert llm["runtime_env"]["env_vars"] == {"WANDB_API_KEY": placeholder("wandb_abc")}
    assert llm["engine_kwargs"] == {"hf_token": placeholder("hf_def"), "max_num_seqs": 8}
    (deployment,) = app["deployments"]
    assert deployment["max_ongoing_requests"] == 8
    assert deployment["ray_actor_options"]["runtime_env"]["env_vars"] == {
        "AWS_KEY": placeholder("aws_abc"),
        GENERATION_VAR: "3",
    }
    assert original == CONFIG


def test_a_config_without_secrets_comes_back_as_it_is_without_a_copy():
    echo = ray_fixture("serve_applications_two_apps.json")["applications"]["echo2"]
    effective = echo["deployments"]["Echo"]["deployment_config"]
    effective["ray_actor_options"].pop("runtime_env")
    assert redact_config(effective) is effective
    app = {"name": "echo2", "import_path": "m:app", "deployments": [{"name": "Echo", "user_config": {"a": 1}}]}
    assert redact_config(app) is app


def test_a_config_revision_is_redacted_in_its_submitted_and_effective_configs():
    revision = {
        "submitted": CONFIG["applications"][0],
        "effective": {"LLMServer": {"ray_actor_options": {"runtime_env": {"env_vars": {"HF_TOKEN": "hf_abc"}}}}},
    }
    redacted = redact_config(revision)
    assert "hf_abc" not in str(redacted) and "aws_abc" not in str(redacted)
    assert redacted["effective"]["LLMServer"]["ray_actor_options"]["runtime_env"]["env_vars"]["HF_TOKEN"] == (
        placeholder("hf_abc")
    )


def test_a_json_patch_redacts_every_value_that_lands_on_or_holds_a_secret():
    operations = [
        {"op": "replace", "path": "/applications/0/runtime_env/env_vars/HF_TOKEN", "value": "hf_new"},
        {"op": "add", "path": "/applications/0/runtime_env/env_vars", "value": {"A": "a_abc"}},
        {"op": "add", "path": "/applications/1", "value": CONFIG["applications"][0]},
        {"op": "replace", "path": f"/applications/0/runtime_env/env_vars/{GENERATION_VAR}", "value": "4"},
        {"op": "replace", "path": "/applications/0/deployments/0/max_ongoing_requests", "value": 4},
        {"op": "remove", "path": "/applications/0/runtime_env/env_vars/OLD"},
    ]
    redacted = redact_patch(operations)
    assert [op.get("value") for op in redacted[:2]] == [placeholder("hf_new"), {"A": placeholder("a_abc")}]
    assert "hf_abc" not in str(redacted[2]) and "aws_abc" not in str(redacted[2])
    assert redacted[3:] == operations[3:]


def test_request_headers_keep_only_the_values_that_say_how_a_body_is_encoded():
    assert redact_headers({"Content-Type": "application/json", "Authorization": "Bearer x", "X-Team": "a"}) == {
        "Content-Type": "application/json",
        "Authorization": placeholder("Bearer x"),
        "X-Team": placeholder("a"),
    }
    assert redact_anywhere({"request": {"headers": {"cookie": "c"}}, "runtime_env": {"env_vars": {"K": "v"}}}) == {
        "request": {"headers": {"cookie": placeholder("c")}},
        "runtime_env": {"env_vars": {"K": placeholder("v")}},
    }


def test_placeholders_sent_back_get_the_values_they_stand_for_wherever_the_secret_now_sits():
    known = secret_values(CONFIG)
    copied = {"name": "copy", "runtime_env": {"env_vars": {"HF_TOKEN": placeholder("hf_abc"), "NEW": "typed"}}}
    assert restore_placeholders(copied, known) == {
        "name": "copy",
        "runtime_env": {"env_vars": {"HF_TOKEN": "hf_abc", "NEW": "typed"}},
    }
    untouched = {"max_ongoing_requests": 2}
    assert restore_placeholders(untouched, known) is untouched


@pytest.mark.parametrize(
    "sent, where",
    [
        ({"runtime_env": {"env_vars": {"HF_TOKEN": placeholder("guessed")}}}, "runtime_env.env_vars.HF_TOKEN"),
        ({"runtime_env": {"env_vars": {"AWS_KEY": placeholder("hf_abc")}}}, "runtime_env.env_vars.AWS_KEY"),
        ({"deployments": [{"user_config": {"k": placeholder("hf_abc")}}]}, "deployments[0].user_config.k"),
    ],
)
def test_a_placeholder_that_stands_for_no_value_of_its_kind_is_refused_by_where_it_is(sent, where):
    with pytest.raises(PlaceholderUnmatched) as refused:
        restore_placeholders(sent, secret_values(CONFIG))
    assert str(refused.value) == (
        f"{where} holds a redacted placeholder that matches no current value: type the value again."
    )


def test_a_validation_error_from_ray_keeps_its_path_and_reason_but_not_the_input_it_quotes():
    said = ray_fixture("put_invalid_working_dir_plain_local_path.json")["body"]
    assert "input_value={'env_vars'" in said
    redacted = redact_quoted_input(said)
    assert "env_vars" not in redacted and "PYTHONPATH" not in redacted
    assert (
        "applications.1.runtime_env\n  Value error, runtime_envs in the Serve config support only remote URIs"
        in redacted
    )
    assert "[type=value_error, input_value=<redacted>, input_type=dict]" in redacted
