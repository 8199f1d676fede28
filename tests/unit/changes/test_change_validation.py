"""Deployment options as an operator types them, checked before anything reaches a cluster.

Every config Ray 2.60 refused with a deployment-option error (tests/fixtures/ray/put_invalid_*.json)
must be refused here first, from the very deployment entry Ray was sent."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError

from apps.changes.builtin_presets import BUILTIN_PRESETS
from apps.changes.validation import MAX_PATCH_CHARS, parse_options_text, validate_options
from tests.conftest import FIXTURES, ray_fixture
from tests.yaml_aliases import alias_bomb

# put_invalid_* fixtures whose Ray error points into a deployment, and the field it is about.
DEPLOYMENT_OPTION_FIXTURES = {
    "put_invalid_negative_max_ongoing_requests.json": "max_ongoing_requests",
    "put_invalid_zero_max_ongoing_requests.json": "max_ongoing_requests",
    "put_invalid_string_max_ongoing_requests.json": "max_ongoing_requests",
    "put_invalid_zero_max_queued_requests.json": "max_queued_requests",
    "put_invalid_negative_num_cpus.json": "num_cpus",
    "put_invalid_num_replicas_with_autoscaling.json": "num_replicas",
}
DEPLOYMENT_PATH = re.compile(r"^applications\.(\d+)\.deployments\.(\d+)", re.MULTILINE)


def messages_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> list[str]:
    return excinfo.value.messages


def refused(options) -> list[str]:
    with pytest.raises(ValidationError) as excinfo:
        validate_options(options)
    return messages_of(excinfo)


def offending_options(fixture: str) -> dict:
    """The options of the deployment entry Ray complained about, as Fleetdeck would send them."""
    envelope = ray_fixture(fixture)
    match = DEPLOYMENT_PATH.search(envelope["body"])
    assert match, f"{fixture}: Ray's error does not point into a deployment"
    app_index, dep_index = int(match.group(1)), int(match.group(2))
    entry = envelope["request"]["body"]["applications"][app_index]["deployments"][dep_index]
    return {key: value for key, value in entry.items() if key != "name"}


# --- parse_options_text ---------------------------------------------------------------------


def test_yaml_options_are_parsed_into_a_mapping():
    text = "max_ongoing_requests: 2\nautoscaling_config:\n  min_replicas: 2\n  target_ongoing_requests: 1.5\n"
    assert parse_options_text(text) == {
        "max_ongoing_requests": 2,
        "autoscaling_config": {"min_replicas": 2, "target_ongoing_requests": 1.5},
    }


def test_json_options_are_parsed_into_a_mapping():
    text = '{"max_queued_requests": 16, "user_config": {"sizes": [1, 2]}, "ray_actor_options": {"num_gpus": 0.5}}'
    assert parse_options_text(text) == {
        "max_queued_requests": 16,
        "user_config": {"sizes": [1, 2]},
        "ray_actor_options": {"num_gpus": 0.5},
    }


def test_broken_yaml_is_refused_with_the_line_where_it_breaks():
    with pytest.raises(ValidationError) as excinfo:
        parse_options_text("max_ongoing_requests: 2\n  bad: [\n")
    (message,) = messages_of(excinfo)
    assert message.startswith("Invalid YAML/JSON at line 2, column 6: ")
    assert message.endswith(".")


def test_broken_json_is_refused_with_the_line_where_it_breaks():
    with pytest.raises(ValidationError) as excinfo:
        parse_options_text('{\n  "max_ongoing_requests": 2,\n  "max_queued_requests": \n')
    (message,) = messages_of(excinfo)
    assert re.match(r"Invalid YAML/JSON at line \d+, column \d+: ", message)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            f"user_config: {alias_bomb()}",
            "Invalid YAML/JSON at line 1, column 19: YAML anchors and aliases (&name / *name) are not accepted: "
            "write the values out.",
        ),
        ("max_ongoing_requests: &two 2", "Invalid YAML/JSON at line 1, column 23: YAML anchors and aliases"),
        ("user_config: " + "[" * 5000, "Invalid YAML/JSON at line 1, column 113: Nested more than 100 levels deep."),
        ("user_config: {n: " + "9" * 5000 + "}", "Invalid YAML/JSON: Exceeds the limit (4300 digits)"),
        ("user_config: {released: 2024-13-45}", "Invalid YAML/JSON: month must be in 1..12."),
    ],
    ids=["aliases", "anchor", "nesting", "long-integer", "impossible-date"],
)
def test_yaml_that_would_expand_or_crash_the_parser_is_refused_with_what_to_write_instead(text, message):
    with pytest.raises(ValidationError) as excinfo:
        parse_options_text(text)
    (refusal,) = messages_of(excinfo)
    assert refusal.startswith(message)


def test_a_tab_indented_line_is_refused_naming_its_line():
    with pytest.raises(ValidationError) as excinfo:
        parse_options_text("max_ongoing_requests: 2\n\tmax_queued_requests: 4\n")
    (message,) = messages_of(excinfo)
    assert message.startswith("Invalid YAML/JSON at line 2")


@pytest.mark.parametrize(
    "text",
    ["- max_ongoing_requests: 2\n- max_queued_requests: 4\n", "[1, 2]", "3", "just words", "null", "", "   \n"],
)
def test_anything_but_a_mapping_is_refused_with_an_example(text):
    with pytest.raises(ValidationError) as excinfo:
        parse_options_text(text)
    (message,) = messages_of(excinfo)
    assert message == "The options must be a mapping of option: value, e.g. 'max_ongoing_requests: 2'."


def test_text_longer_than_the_limit_is_refused_before_parsing():
    text = "max_ongoing_requests: 2\n" + "#" * MAX_PATCH_CHARS
    with pytest.raises(ValidationError) as excinfo:
        parse_options_text(text)
    (message,) = messages_of(excinfo)
    assert message == f"The options are longer than {MAX_PATCH_CHARS} characters."


def test_text_exactly_at_the_limit_is_accepted():
    head = "max_ongoing_requests: 2\n"
    text = head + "#" * (MAX_PATCH_CHARS - len(head))
    assert len(text) == MAX_PATCH_CHARS
    assert parse_options_text(text) == {"max_ongoing_requests": 2}


# --- validate_options against what Ray refused ----------------------------------------------


def test_every_put_invalid_fixture_about_a_deployment_option_is_covered_here():
    about_a_deployment = {
        path.name
        for path in FIXTURES.glob("put_invalid_*.json")
        if DEPLOYMENT_PATH.search(ray_fixture(path.name)["body"])
    }
    assert about_a_deployment == set(DEPLOYMENT_OPTION_FIXTURES)


@pytest.mark.parametrize("fixture, field", sorted(DEPLOYMENT_OPTION_FIXTURES.items()))
def test_options_ray_refused_are_refused_before_any_push_naming_the_field(fixture, field):
    envelope = ray_fixture(fixture)
    assert envelope["status"] == 400  # Ray itself refused these
    messages = refused(offending_options(fixture))
    assert any(field in message for message in messages), messages


@pytest.mark.parametrize("value", [-1, 0, "lots"])
def test_a_max_ongoing_requests_that_is_not_a_positive_integer_is_refused(value):
    messages = refused({"max_ongoing_requests": value})
    assert len(messages) == 1
    assert messages[0].startswith("max_ongoing_requests: ")


def test_a_zero_max_queued_requests_is_refused_explaining_the_allowed_values():
    messages = refused({"max_queued_requests": 0})
    assert len(messages) == 1
    assert "max_queued_requests must be -1 (no limit) or a positive integer" in messages[0]


def test_a_schema_error_about_the_whole_deployment_does_not_start_with_an_empty_path():
    # BUG: pydantic reports model-level errors with an empty `loc`, so the message reads
    # ": Value error, max_queued_requests must be ..." with a dangling colon.
    (message,) = refused({"max_queued_requests": 0})
    assert not message.startswith(":"), message


def test_a_negative_num_cpus_is_refused_with_its_path():
    messages = refused({"ray_actor_options": {"num_cpus": -1}})
    assert len(messages) == 1
    assert messages[0].startswith("ray_actor_options.num_cpus: ")


def test_num_replicas_with_autoscaling_is_refused_saying_they_exclude_each_other():
    messages = refused({"num_replicas": 2, "autoscaling_config": {"min_replicas": 1, "max_replicas": 2}})
    assert any("num_replicas and autoscaling_config exclude each other" in message for message in messages)


def test_max_ongoing_requests_below_the_autoscaling_target_is_refused():
    messages = refused({"max_ongoing_requests": 2, "autoscaling_config": {"target_ongoing_requests": 4}})
    assert messages == [
        "max_ongoing_requests (2) is below autoscaling_config.target_ongoing_requests (4): replicas can never "
        "reach the load the autoscaler waits for, so it never scales up."
    ]


def test_min_replicas_above_max_replicas_is_refused():
    messages = refused({"autoscaling_config": {"min_replicas": 5, "max_replicas": 2}})
    assert "autoscaling_config.min_replicas (5) is above max_replicas (2)." in messages


# --- names Serve would drop silently --------------------------------------------------------


def test_an_unknown_option_is_refused_because_serve_would_drop_it():
    assert refused({"max_ongoing_request": 4}) == [
        "max_ongoing_request: not a Serve deployment option; Serve would drop it silently."
    ]


def test_the_legacy_max_concurrent_queries_is_refused_pointing_to_max_ongoing_requests():
    (message,) = refused({"max_concurrent_queries": 4})
    assert message.startswith("max_concurrent_queries: ")
    assert "'max_ongoing_requests'" in message
    assert "Ray 2.10" in message


def test_the_legacy_autoscaling_target_name_is_refused_pointing_to_target_ongoing_requests():
    (message,) = refused({"autoscaling_config": {"target_num_ongoing_requests_per_replica": 2}})
    assert message.startswith("autoscaling_config.target_num_ongoing_requests_per_replica: ")
    assert "'target_ongoing_requests'" in message


def test_max_ongoing_requests_inside_autoscaling_config_is_refused_saying_serve_ignores_it_there():
    (message,) = refused({"autoscaling_config": {"max_ongoing_requests": 3}})
    assert message == (
        "autoscaling_config.max_ongoing_requests: Serve ignores 'max_ongoing_requests' inside "
        "autoscaling_config; set it on the deployment."
    )


def test_an_unknown_autoscaling_option_is_refused_with_its_path():
    (message,) = refused({"autoscaling_config": {"target_latency_ms": 100}})
    assert (
        message == "autoscaling_config.target_latency_ms: not a Serve deployment option; Serve would drop it silently."
    )


def test_name_is_refused_because_targets_choose_the_deployments():
    assert refused({"name": "Model", "max_ongoing_requests": 2}) == [
        "'name' is not an option: the targets say which deployments change."
    ]


@pytest.mark.parametrize("options", [{}, None, [], "max_ongoing_requests: 2", [("max_ongoing_requests", 2)]])
def test_an_empty_mapping_or_anything_but_a_mapping_is_refused(options):
    assert refused(options) == ["Give at least one deployment option as a mapping."]


def test_every_problem_is_reported_not_only_the_first():
    messages = refused(
        {"bogus": 1, "max_ongoing_requests": 0, "autoscaling_config": {"min_replicas": 3, "max_replicas": 1}}
    )
    assert any(message.startswith("bogus: ") for message in messages)
    assert any(message.startswith("max_ongoing_requests: ") for message in messages)
    assert any("min_replicas (3) is above max_replicas (1)" in message for message in messages)


def test_valid_options_are_returned_unchanged():
    options = {
        "max_ongoing_requests": 4,
        "max_queued_requests": -1,
        "user_config": {"hold_s": 0.1},
        "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 1},
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2},
    }
    assert validate_options(options) is options


# --- built-in presets -----------------------------------------------------------------------

PRESETS = {preset["slug"]: preset for preset in BUILTIN_PRESETS}


def test_there_are_four_built_in_presets_with_distinct_slugs():
    assert sorted(PRESETS) == ["heavy-gpu-model", "light-cpu", "vision-gpu", "vllm-engine"]
    assert len(BUILTIN_PRESETS) == 4


@pytest.mark.parametrize("slug", sorted(PRESETS))
def test_each_built_in_preset_passes_validation(slug):
    options = PRESETS[slug]["options"]
    assert validate_options(options) == options


@pytest.mark.parametrize("slug", sorted(PRESETS))
def test_each_built_in_preset_has_a_name_a_description_and_remedies(slug):
    preset = PRESETS[slug]
    assert preset["name"].strip()
    assert len(preset["description"].strip()) > 40
    assert preset["remedies"]
    assert all(re.fullmatch(r"R\d+", remedy) for remedy in preset["remedies"])


@pytest.mark.parametrize("slug", sorted(PRESETS))
def test_each_built_in_preset_bounds_its_queue(slug):
    assert PRESETS[slug]["options"]["max_queued_requests"] > 0


def test_the_vllm_preset_passes_the_llm_rules_it_follows():
    from apps.remediation import llm_rules

    options = PRESETS["vllm-engine"]["options"]
    assert options["max_ongoing_requests"] == llm_rules.FALLBACK_MAX_NUM_SEQS
    assert options["autoscaling_config"]["target_ongoing_requests"] == options["max_ongoing_requests"] // 2
    assert options["health_check_timeout_s"] > 10  # serve.llm's default, below slow first tokens


def test_the_heavy_model_preset_caps_concurrency_and_scales_on_the_queue():
    options = PRESETS["heavy-gpu-model"]["options"]
    autoscaling = options["autoscaling_config"]
    assert options["max_ongoing_requests"] <= 2
    assert autoscaling["target_ongoing_requests"] == pytest.approx(1)
    assert autoscaling["min_replicas"] >= 2
    assert autoscaling["max_replicas"] >= autoscaling["min_replicas"]
    assert autoscaling["upscale_delay_s"] <= 10
    assert autoscaling["downscale_delay_s"] >= 60
    assert options["max_queued_requests"] > 0
