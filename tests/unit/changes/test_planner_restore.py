"""Restores, dropped applications, and the deployments a change expects to see redeployed."""

from __future__ import annotations

from apps.changes.planner import (
    dropped_applications,
    expected_deployments,
    live_config,
    plan_patch,
    plan_restore,
)
from tests.unit.changes.planner_helpers import (
    CURRENT,
    live,
    payload,
    planned_app,
    planned_entry,
    target,
)


def test_restore_puts_back_an_older_application_config_and_leaves_the_others():
    older = payload("serve_applications_after_unknown_fields.json")["applications"]["echo2"]["deployed_app_config"]
    plan = plan_restore(live(), {"echo2": older})
    assert planned_app(plan.new_config, "echo2") == older
    assert planned_app(plan.new_config, "demo") == planned_app(plan.base_config, "demo")
    assert plan.changes_anything
    assert plan.warnings == []


def test_restore_re_adds_an_application_that_was_removed_in_name_order():
    serve = live("serve_applications_after_put_without_demo.json")
    assert list(serve.applications) == ["echo2"]
    demo = payload()["applications"]["demo"]["deployed_app_config"]
    plan = plan_restore(serve, {"demo": demo})
    assert [app["name"] for app in plan.new_config["applications"]] == ["demo", "echo2"]
    assert planned_app(plan.new_config, "demo") == demo


def test_restore_never_drops_an_application_it_does_not_name():
    older = payload("serve_applications_after_unknown_fields.json")["applications"]["demo"]["deployed_app_config"]
    plan = plan_restore(live(), {"demo": older})
    assert dropped_applications(plan.base_config, plan.new_config, named=set()) == []
    assert {app["name"] for app in plan.new_config["applications"]} == {"demo", "echo2"}


def test_restoring_what_already_runs_changes_nothing():
    serve = live()
    plan = plan_restore(serve, {"demo": serve.applications["demo"].deployed_app_config})
    assert not plan.changes_anything
    assert plan.json_patch == []


def test_dropped_applications_finds_those_missing_from_the_new_config():
    base = live_config(live())
    new = {"applications": [app for app in base["applications"] if app["name"] != "demo"]}
    assert dropped_applications(base, new, named=set()) == ["demo"]
    assert dropped_applications(base, new, named={"demo"}) == []
    assert dropped_applications(base, {"applications": []}, named=set()) == ["demo", "echo2"]
    assert dropped_applications(base, base, named=set()) == []


# --- expected_deployments -------------------------------------------------------------------


def test_a_patch_expects_only_its_target_deployments():
    plan = plan_patch(live(), target("demo", "Model"), {"max_ongoing_requests": 6}, CURRENT)
    expected = expected_deployments(plan.new_config, target("demo", "Model"), "patch")
    assert list(expected) == [("demo", "Model")]
    model = planned_entry(plan.new_config, "demo", "Model")
    assert expected[("demo", "Model")] == {k: v for k, v in model.items() if k != "name"}
    assert "name" not in expected[("demo", "Model")]


def test_a_restore_expects_every_deployment_of_the_named_applications():
    config = live_config(live())
    expected = expected_deployments(config, ["demo"], "restore")
    assert sorted(expected) == [("demo", "Echo"), ("demo", "Model")]
    assert expected[("demo", "Echo")] == {
        "num_replicas": 1,
        "max_ongoing_requests": 50,
        "ray_actor_options": {"num_cpus": 0.1},
    }


def test_a_restore_of_every_application_expects_every_deployment():
    config = live_config(live())
    expected = expected_deployments(config, ["demo", "echo2"], "restore")
    assert sorted(expected) == [("demo", "Echo"), ("demo", "Model"), ("echo2", "Echo")]
