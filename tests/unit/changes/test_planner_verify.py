"""Whether a pushed change is done: verify over the status Ray reports, and not_taken over the
values."""

from __future__ import annotations

from apps.changes.planner import (
    expected_deployments,
    live_config,
    not_taken,
    plan_patch,
    verify,
)
from tests.unit.changes.planner_helpers import (
    CURRENT,
    before_push,
    deploy_times,
    live,
    target,
)


def test_verify_is_done_when_everything_runs_and_holds_the_expected_values():
    serve = live()
    expected = expected_deployments(live_config(serve), ["demo", "echo2"], "restore")
    verdict = verify(serve, expected, before_push(serve))
    assert verdict.done
    assert verdict.failure == ""
    assert verdict.waiting_for == []


def test_verify_fails_on_a_deploy_failed_application_that_redeployed_with_its_message():
    before = live()
    after = live("serve_applications_deploy_failed_bad_import.json")
    assert after.applications["echo2"].status == "DEPLOY_FAILED"
    assert after.applications["echo2"].last_deployed_time_s != before.applications["echo2"].last_deployed_time_s
    expected = expected_deployments(live_config(after), ["echo2"], "restore")

    verdict = verify(after, expected, deploy_times(before))
    assert not verdict.done
    assert verdict.failure.startswith("echo2 is DEPLOY_FAILED: ")
    assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in verdict.failure
    assert verdict.failure.endswith(after.applications["echo2"].message.strip()[-200:])


def test_verify_keeps_waiting_on_a_deploy_failed_application_that_has_not_redeployed_yet():
    after = live("serve_applications_deploy_failed_bad_import.json")
    expected = expected_deployments(live_config(after), ["echo2"], "restore")
    verdict = verify(after, expected, deploy_times(after))
    assert not verdict.done
    assert verdict.failure == ""
    assert "echo2: Ray has not applied the push yet" in verdict.waiting_for


def test_verify_waits_until_ray_has_applied_the_push_even_if_values_already_match():
    # A delete-only patch leaves nothing to compare: only Ray's new deploy stamp proves the push.
    serve = live()
    expected = expected_deployments(live_config(serve), ["demo"], "restore")
    verdict = verify(serve, expected, {"demo": deploy_times(serve)["demo"]})
    assert not verdict.done
    assert verdict.waiting_for == ["demo: Ray has not applied the push yet"]


def test_verify_waits_for_values_not_yet_taken_and_names_their_paths():
    serve = live()
    plan = plan_patch(
        serve, target("demo", "Model"), {"max_ongoing_requests": 6, "autoscaling_config": {"max_replicas": 3}}, CURRENT
    )
    expected = expected_deployments(plan.new_config, target("demo", "Model"), "patch")
    verdict = verify(serve, expected, before_push(serve))
    assert not verdict.done
    assert verdict.failure == ""
    assert verdict.waiting_for == [
        "demo/Model: effective config does not hold max_ongoing_requests, autoscaling_config.max_replicas yet"
    ]


def test_verify_waits_during_a_rollout():
    serve = live("serve_applications_mid_rollout.json")
    assert serve.applications["demo"].status == "DEPLOYING"
    expected = expected_deployments(live_config(serve), ["demo"], "restore")
    verdict = verify(serve, expected, {"demo": 0.0})
    assert not verdict.done
    assert verdict.failure == ""
    assert "demo: DEPLOYING" in verdict.waiting_for
    assert "demo/Echo: UPDATING" in verdict.waiting_for
    assert not any(line.startswith("demo/Model") for line in verdict.waiting_for)


def test_verify_waits_for_an_application_not_listed_yet():
    serve = live("serve_applications_after_put_without_demo.json")
    expected = expected_deployments(live_config(live()), ["demo"], "restore")
    verdict = verify(serve, expected, {})
    assert not verdict.done
    assert "demo: not listed yet" in verdict.waiting_for
    assert "demo/Model: not listed yet" in verdict.waiting_for


def test_verify_is_not_done_for_a_null_the_cluster_has_not_redeployed():
    serve = live()
    plan = plan_patch(serve, target("demo", "Model"), {"user_config": {"hold_s": None}}, CURRENT)
    assert plan.changes_anything
    assert "hold_s" in serve.applications["demo"].deployments["Model"].deployment_config["user_config"]
    expected = expected_deployments(plan.new_config, target("demo", "Model"), "patch")
    verdict = verify(serve, expected, deploy_times(serve))
    assert not verdict.done


# --- not_taken ------------------------------------------------------------------------------


def test_not_taken_treats_equal_numbers_of_different_types_as_taken():
    assert (
        not_taken(
            {"target_ongoing_requests": 1, "max_ongoing_requests": 4},
            {"target_ongoing_requests": 1.0, "max_ongoing_requests": 4},
        )
        == []
    )


def test_not_taken_looks_inside_nested_dicts_and_ignores_extra_effective_keys():
    wanted = {"ray_actor_options": {"num_cpus": 0.2, "runtime_env": {"env_vars": {"RECYCLE_GENERATION": "1"}}}}
    effective = {
        "ray_actor_options": {
            "num_cpus": 0.2,
            "runtime_env": {"env_vars": {"PYTHONPATH": "/opt", "RECYCLE_GENERATION": "1"}},
        }
    }
    assert not_taken(wanted, effective) == []


def test_not_taken_names_the_dotted_path_of_each_missing_or_different_value():
    wanted = {
        "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
        "user_config": {"a": {"b": 1}},
        "max_queued_requests": 10,
    }
    effective = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 2.0}, "user_config": {"a": {"b": 2}}}
    assert not_taken(wanted, effective) == ["autoscaling_config.min_replicas", "user_config.a.b", "max_queued_requests"]


def test_not_taken_reports_a_dict_whose_effective_value_is_not_a_dict():
    assert not_taken({"user_config": {"greeting": "hi"}}, {"user_config": None}) == ["user_config"]
