"""The planner's option names by Ray version: the names before 2.10, and legacy fields already
submitted."""

from __future__ import annotations

import copy

import pytest

from apps.changes import serve_options
from apps.changes.planner import (
    expected_deployments,
    not_taken,
    plan_patch,
)
from integrations.ray.parsing import parse_serve_status
from tests.unit.changes.planner_helpers import (
    CURRENT,
    OLD_RAY,
    live,
    payload,
    planned_entry,
    submitted_entry,
    target,
)


def test_a_plan_for_ray_before_2_10_uses_the_old_option_names():
    options = {"max_ongoing_requests": 4, "autoscaling_config": {"target_ongoing_requests": 2}}
    plan = plan_patch(live(), target("demo", "Model"), options, OLD_RAY)
    entry = planned_entry(plan.new_config, "demo", "Model")
    assert entry["max_concurrent_queries"] == 4
    assert "max_ongoing_requests" not in entry
    assert entry["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_num_ongoing_requests_per_replica": 2,
    }


def test_a_plan_for_current_ray_keeps_the_new_option_names():
    options = {"max_ongoing_requests": 4, "autoscaling_config": {"target_ongoing_requests": 2}}
    plan = plan_patch(live(), target("demo", "Model"), options, CURRENT)
    entry = planned_entry(plan.new_config, "demo", "Model")
    assert entry["max_ongoing_requests"] == 4
    assert "max_concurrent_queries" not in entry
    assert entry["autoscaling_config"]["target_ongoing_requests"] == 2
    assert "target_num_ongoing_requests_per_replica" not in entry["autoscaling_config"]


@pytest.mark.parametrize(
    "version, expected",
    [
        ("2.60.0", (2, 60)),
        ("2.9.3", (2, 9)),
        ("2.10", (2, 10)),
        ("3.0.0rc1", (3, 0)),
        ("nightly", (99, 0)),
        ("", (99, 0)),
        (None, (99, 0)),
    ],
)
def test_parse_version_reads_major_and_minor_and_treats_unknown_as_current(version, expected):
    assert serve_options.parse_version(version) == expected


def test_for_version_renames_both_fields_before_2_10_and_leaves_the_input_alone():
    options = {"max_ongoing_requests": 3, "autoscaling_config": {"target_ongoing_requests": 1, "max_replicas": 4}}
    original = copy.deepcopy(options)
    mapped = serve_options.for_version(options, "2.9.3")
    assert mapped == {
        "max_concurrent_queries": 3,
        "autoscaling_config": {"target_num_ongoing_requests_per_replica": 1, "max_replicas": 4},
    }
    assert options == original


@pytest.mark.parametrize("version", ["2.10.0", "2.60.0", "unknown"])
def test_for_version_keeps_the_new_names_from_2_10_on(version):
    options = {"max_ongoing_requests": 3, "autoscaling_config": {"target_ongoing_requests": 1}}
    assert serve_options.for_version(options, version) == options


def test_a_legacy_field_already_submitted_is_warned_about_and_left_in_place():
    raw = payload("serve_applications_after_unknown_fields.json")
    # Serve 2.60 dropped the legacy field from what it reports, so put it back as an older push would have.
    submitted_entry(raw, "echo2", "Echo")["max_concurrent_queries"] = 5
    plan = plan_patch(parse_serve_status(raw), target("echo2", "Echo"), {"max_ongoing_requests": 3}, CURRENT)

    entry = planned_entry(plan.new_config, "echo2", "Echo")
    assert entry["max_concurrent_queries"] == 5
    assert entry["max_ongoing_requests"] == 3
    assert len(plan.warnings) == 1
    warning = plan.warnings[0]
    assert warning.startswith("echo2/Echo: max_concurrent_queries")
    assert "Ray 2.10" in warning
    assert "'max_ongoing_requests'" in warning
    assert "left as is" in warning


def test_the_fix_of_a_legacy_field_removes_it_and_sets_its_new_name():
    from apps.changes.validation import validate_options

    raw = payload("serve_applications_after_unknown_fields.json")
    submitted_entry(raw, "echo2", "Echo")["max_concurrent_queries"] = 5
    # The ignored-settings finding's patch: a null for the name Serve ignores, the value under its real name.
    fix = validate_options({"max_concurrent_queries": None, "max_ongoing_requests": 5})
    plan = plan_patch(parse_serve_status(raw), target("echo2", "Echo"), fix, CURRENT)
    entry = planned_entry(plan.new_config, "echo2", "Echo")
    assert "max_concurrent_queries" not in entry and entry["max_ongoing_requests"] == 5
    assert any("max_concurrent_queries removed: Serve does not know it" in w for w in plan.warnings)
    # A null for an option Serve knows is still refused where Serve would not keep it, never a removal.
    with pytest.raises(Exception, match="never as a removal"):
        validate_options({"max_ongoing_requests": None})


def test_a_null_for_an_ignored_name_inside_autoscaling_removes_it_there():
    plan = plan_patch(
        live(),
        target("demo", "Model"),
        {"autoscaling_config": {"max_ongoing_requests": None, "max_replicas": 3}},
        CURRENT,
    )
    auto = planned_entry(plan.new_config, "demo", "Model")["autoscaling_config"]
    assert "max_ongoing_requests" not in auto and auto["max_replicas"] == 3


def test_a_legacy_field_left_in_place_is_not_expected_back_so_the_change_can_verify():
    raw = payload("serve_applications_after_unknown_fields.json")
    submitted_entry(raw, "echo2", "Echo")["max_concurrent_queries"] = 5
    serve = parse_serve_status(raw)
    plan = plan_patch(serve, target("echo2", "Echo"), {"max_ongoing_requests": 3}, CURRENT)
    expected = expected_deployments(plan.new_config, target("echo2", "Echo"), "patch")
    assert (
        "max_concurrent_queries" not in expected[("echo2", "Echo")]
        and expected[("echo2", "Echo")]["max_ongoing_requests"] == 3
    )
    # Ray then reports what it runs, without the legacy name: that holds what was asked.
    running = {**serve.applications["echo2"].deployments["Echo"].deployment_config, "max_ongoing_requests": 3}
    assert not_taken(expected[("echo2", "Echo")], running) == []
