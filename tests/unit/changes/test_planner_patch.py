"""The live config and the patches planned over it, against Serve status payloads captured from a
real Ray 2.60 cluster: pure, edited in a copy where a test needs a shape the captures do not
have."""

from __future__ import annotations

import pytest

from apps.changes.planner import (
    PlanError,
    live_config,
    plan_patch,
)
from apps.fleet.configs import config_hash
from integrations.ray.parsing import parse_serve_status
from tests.unit.changes.planner_helpers import (
    CURRENT,
    canonical,
    live,
    payload,
    planned_app,
    planned_entry,
    submitted_entry,
    target,
)


def test_live_config_reproduces_every_applications_submitted_config_sorted_by_name():
    raw = payload()
    config = live_config(parse_serve_status(raw))
    assert [app["name"] for app in config["applications"]] == ["demo", "echo2"]
    for app in config["applications"]:
        assert app == raw["applications"][app["name"]]["deployed_app_config"]


def test_live_config_has_no_target_capacity_when_the_cluster_sets_none():
    config = live_config(live())
    assert set(config) == {"applications"}


def test_live_config_carries_the_target_capacity_when_the_cluster_sets_one():
    raw = payload()
    raw["target_capacity"] = 50
    config = live_config(parse_serve_status(raw))
    assert config["target_capacity"] == 50.0


def test_live_config_is_a_copy_that_edits_do_not_leak_into_the_status():
    serve = live()
    config = live_config(serve)
    config["applications"][0]["deployments"][0]["max_ongoing_requests"] = 999
    assert serve.applications["demo"].deployed_app_config["deployments"][0]["max_ongoing_requests"] == 50


def test_live_config_refuses_an_application_deployed_from_python_and_names_it():
    raw = payload()
    raw["applications"]["echo2"]["deployed_app_config"] = None
    raw["applications"]["echo2"]["source"] = "imperative"
    with pytest.raises(PlanError) as excinfo:
        live_config(parse_serve_status(raw))
    message = str(excinfo.value)
    assert "echo2" in message
    assert "demo" not in message
    assert "serve.run" in message


# --- plan_patch: the basic shape of a plan --------------------------------------------------


def test_setting_max_ongoing_requests_on_one_deployment_changes_only_that_value():
    serve = live()
    plan = plan_patch(serve, target("demo", "Model"), {"max_ongoing_requests": 6}, CURRENT)

    assert plan.json_patch == [
        {"op": "replace", "path": "/applications/0/deployments/1/max_ongoing_requests", "value": 6}
    ]
    assert planned_entry(plan.new_config, "demo", "Model")["max_ongoing_requests"] == 6
    assert planned_entry(plan.base_config, "demo", "Model")["max_ongoing_requests"] == 8


def test_a_patch_leaves_the_other_application_and_the_other_deployment_byte_identical():
    plan = plan_patch(live(), target("demo", "Model"), {"max_ongoing_requests": 6}, CURRENT)
    assert canonical(planned_app(plan.new_config, "echo2")) == canonical(planned_app(plan.base_config, "echo2"))
    assert canonical(planned_entry(plan.new_config, "demo", "Echo")) == canonical(
        planned_entry(plan.base_config, "demo", "Echo")
    )


def test_a_patch_changes_the_hash_and_the_base_hash_is_the_live_configs():
    serve = live()
    plan = plan_patch(serve, target("demo", "Model"), {"max_ongoing_requests": 6}, CURRENT)
    assert plan.base_hash == config_hash(live_config(serve))
    assert plan.new_hash == config_hash(plan.new_config)
    assert plan.base_hash != plan.new_hash
    assert plan.changes_anything


def test_the_diff_shows_the_old_value_removed_and_the_new_one_added():
    plan = plan_patch(live(), target("demo", "Model"), {"max_ongoing_requests": 6}, CURRENT)
    diff = plan.diff
    assert diff[0] == "--- live"
    assert diff[1] == "+++ planned"
    removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert [line.replace(" ", "") for line in removed] == ['-"max_ongoing_requests":8,']
    assert [line.replace(" ", "") for line in added] == ['+"max_ongoing_requests":6,']


def test_a_patch_that_sets_what_already_runs_changes_nothing():
    plan = plan_patch(live(), target("demo", "Model"), {"max_ongoing_requests": 8}, CURRENT)
    assert plan.json_patch == []
    assert plan.base_hash == plan.new_hash
    assert not plan.changes_anything


def test_a_patch_does_not_modify_the_live_status_it_started_from():
    serve = live()
    before = canonical(serve.applications["demo"].deployed_app_config)
    plan_patch(serve, target("demo", "Model"), {"max_ongoing_requests": 6, "user_config": {"rev": 3}}, CURRENT)
    assert canonical(serve.applications["demo"].deployed_app_config) == before


def test_a_patch_on_a_deployment_without_a_submitted_entry_adds_one():
    raw = payload()
    raw["applications"]["demo"]["deployed_app_config"]["deployments"] = [
        entry for entry in raw["applications"]["demo"]["deployed_app_config"]["deployments"] if entry["name"] != "Echo"
    ]
    plan = plan_patch(parse_serve_status(raw), target("demo", "Echo"), {"max_ongoing_requests": 20}, CURRENT)
    assert planned_entry(plan.new_config, "demo", "Echo") == {"name": "Echo", "max_ongoing_requests": 20}


def test_a_patch_over_several_targets_changes_each_of_them():
    targets = target("demo", "Echo") + target("echo2", "Echo")
    plan = plan_patch(live(), targets, {"max_queued_requests": 10}, CURRENT)
    assert planned_entry(plan.new_config, "demo", "Echo")["max_queued_requests"] == 10
    assert planned_entry(plan.new_config, "echo2", "Echo")["max_queued_requests"] == 10
    assert "max_queued_requests" not in planned_entry(plan.base_config, "echo2", "Echo")


# --- plan_patch: merging wholesale-replaced options -----------------------------------------


def test_a_ray_actor_options_patch_keeps_the_submitted_num_cpus_and_runtime_env():
    plan = plan_patch(live(), target("demo", "Model"), {"ray_actor_options": {"num_gpus": 1}}, CURRENT)
    assert planned_entry(plan.new_config, "demo", "Model")["ray_actor_options"] == {
        "runtime_env": {"env_vars": {"RECYCLE_GENERATION": "1"}},
        "num_cpus": 0.2,
        "num_gpus": 1,
    }


def test_a_ray_actor_options_patch_without_submitted_options_starts_from_the_effective_num_cpus_only():
    raw = payload()
    del submitted_entry(raw, "demo", "Echo")["ray_actor_options"]
    effective = raw["applications"]["demo"]["deployments"]["Echo"]["deployment_config"]["ray_actor_options"]
    assert effective["num_cpus"] == 0.1 and "runtime_env" in effective  # what the captured payload says

    plan = plan_patch(parse_serve_status(raw), target("demo", "Echo"), {"ray_actor_options": {"num_gpus": 1}}, CURRENT)
    options = planned_entry(plan.new_config, "demo", "Echo")["ray_actor_options"]
    assert options == {"num_cpus": 0.1, "num_gpus": 1}
    assert "runtime_env" not in options


def test_an_autoscaling_patch_keeps_the_submitted_bounds_and_target_without_adding_serves_defaults():
    plan = plan_patch(live(), target("demo", "Model"), {"autoscaling_config": {"min_replicas": 2}}, CURRENT)
    autoscaling = planned_entry(plan.new_config, "demo", "Model")["autoscaling_config"]
    assert autoscaling == {"min_replicas": 2, "max_replicas": 2, "target_ongoing_requests": 4}
    assert "policy" not in autoscaling
    assert "metrics_interval_s" not in autoscaling
    assert plan.json_patch == [
        {"op": "replace", "path": "/applications/0/deployments/1/autoscaling_config/min_replicas", "value": 2}
    ]


def test_an_autoscaling_patch_from_the_effective_config_drops_serves_defaults_and_keeps_the_rest():
    raw = payload()
    del submitted_entry(raw, "demo", "Model")["autoscaling_config"]
    plan = plan_patch(
        parse_serve_status(raw), target("demo", "Model"), {"autoscaling_config": {"min_replicas": 2}}, CURRENT
    )
    autoscaling = planned_entry(plan.new_config, "demo", "Model")["autoscaling_config"]
    assert autoscaling == {"min_replicas": 2, "max_replicas": 2, "target_ongoing_requests": 4.0}
    for default_key in (
        "policy",
        "metrics_interval_s",
        "look_back_period_s",
        "downscale_delay_s",
        "upscale_delay_s",
        "aggregation_function",
        "smoothing_factor",
        "initial_replicas",
    ):
        assert default_key not in autoscaling


def test_an_effective_min_replicas_equal_to_serves_default_is_not_copied_down():
    raw = payload()
    del submitted_entry(raw, "demo", "Model")["autoscaling_config"]
    plan = plan_patch(
        parse_serve_status(raw), target("demo", "Model"), {"autoscaling_config": {"max_replicas": 3}}, CURRENT
    )
    autoscaling = planned_entry(plan.new_config, "demo", "Model")["autoscaling_config"]
    assert autoscaling == {"max_replicas": 3, "target_ongoing_requests": 4.0}


def test_a_user_config_patch_merges_keys_into_the_submitted_user_config():
    plan = plan_patch(live(), target("demo", "Model"), {"user_config": {"rev": 2, "hold_s": 0.1}}, CURRENT)
    assert planned_entry(plan.new_config, "demo", "Model")["user_config"] == {"alloc_mb": 0, "hold_s": 0.1, "rev": 2}


def test_a_null_inside_a_dict_option_is_sent_as_null_and_said_so():
    plan = plan_patch(live(), target("demo", "Model"), {"user_config": {"hold_s": None}}, CURRENT)
    assert planned_entry(plan.new_config, "demo", "Model")["user_config"] == {"alloc_mb": 0, "hold_s": None}
    assert plan.json_patch == [
        {"op": "replace", "path": "/applications/0/deployments/1/user_config/hold_s", "value": None}
    ]
    assert plan.warnings == ["demo/Model: user_config.hold_s set to null (sent as null, not removed)."]


def test_a_null_for_a_top_level_option_is_sent_as_null_never_as_a_removal():
    plan = plan_patch(live(), target("echo2", "Echo"), {"user_config": None}, CURRENT)
    assert planned_entry(plan.new_config, "echo2", "Echo")["user_config"] is None
    assert plan.json_patch == [{"op": "replace", "path": "/applications/1/deployments/0/user_config", "value": None}]


# --- plan_patch: num_replicas versus autoscaling --------------------------------------------


def test_turning_on_autoscaling_removes_num_replicas_with_a_warning():
    plan = plan_patch(
        live(), target("demo", "Echo"), {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}, CURRENT
    )
    entry = planned_entry(plan.new_config, "demo", "Echo")
    assert "num_replicas" not in entry
    assert entry["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
    assert len(plan.warnings) == 1
    assert plan.warnings[0].startswith("demo/Echo: num_replicas (1) removed")


def test_a_fixed_num_replicas_sets_autoscaling_to_null_with_a_warning():
    # A null, not a removal: without the key Serve would keep autoscaling the code sets.
    plan = plan_patch(live(), target("demo", "Model"), {"num_replicas": 3}, CURRENT)
    entry = planned_entry(plan.new_config, "demo", "Model")
    assert entry["num_replicas"] == 3
    assert entry["autoscaling_config"] is None
    assert plan.warnings == ["demo/Model: autoscaling_config set to null: autoscaling off, num_replicas fixed at 3."]


# --- plan_patch: conflicts and unknown targets ----------------------------------------------


def test_max_ongoing_requests_below_the_carried_over_target_is_refused_with_both_numbers():
    with pytest.raises(PlanError) as excinfo:
        plan_patch(live(), target("demo", "Model"), {"max_ongoing_requests": 2}, CURRENT)
    message = str(excinfo.value)
    assert message.startswith("demo/Model: ")
    assert "max_ongoing_requests (2)" in message
    assert "target_ongoing_requests (4)" in message
    assert "never scales up" in message


def test_a_target_above_the_submitted_max_ongoing_requests_is_refused():
    with pytest.raises(PlanError, match=r"max_ongoing_requests \(8\) is below .*target_ongoing_requests \(10\)"):
        plan_patch(live(), target("demo", "Model"), {"autoscaling_config": {"target_ongoing_requests": 10}}, CURRENT)


def test_max_ongoing_requests_below_a_target_the_code_set_is_refused_too():
    # BUG: the conflict check only sees the submitted entry, not the effective autoscaling the
    # deployment runs with (set by its decorator), so this plan goes through.
    raw = payload()
    del submitted_entry(raw, "demo", "Model")["autoscaling_config"]
    assert (
        raw["applications"]["demo"]["deployments"]["Model"]["deployment_config"]["autoscaling_config"][
            "target_ongoing_requests"
        ]
        == 4.0
    )
    with pytest.raises(PlanError, match="target_ongoing_requests"):
        plan_patch(parse_serve_status(raw), target("demo", "Model"), {"max_ongoing_requests": 2}, CURRENT)


def test_a_target_above_the_effective_default_max_ongoing_requests_is_refused_too():
    # BUG: echo2/Echo runs with Serve's default max_ongoing_requests of 5 (not in its submitted
    # entry); a target of 10 can never be reached, yet the plan goes through.
    serve = live()
    assert serve.applications["echo2"].deployments["Echo"].deployment_config["max_ongoing_requests"] == 5
    with pytest.raises(PlanError, match="target_ongoing_requests"):
        plan_patch(
            serve,
            target("echo2", "Echo"),
            {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 10}},
            CURRENT,
        )


def test_an_unknown_application_is_refused_listing_the_ones_that_exist():
    with pytest.raises(PlanError) as excinfo:
        plan_patch(live(), target("nope", "Model"), {"max_ongoing_requests": 6}, CURRENT)
    assert str(excinfo.value) == "No application 'nope' on this cluster (it has: demo, echo2)."


def test_an_unknown_deployment_is_refused_listing_the_ones_that_exist():
    with pytest.raises(PlanError) as excinfo:
        plan_patch(live(), target("echo2", "Model"), {"max_ongoing_requests": 6}, CURRENT)
    assert str(excinfo.value) == "No deployment 'Model' in application 'echo2' (it has: Echo)."
