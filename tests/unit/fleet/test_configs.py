"""Pure functions over Serve config payloads, on effective configs captured from Ray 2.60."""

from __future__ import annotations

import copy

import pytest

from apps.fleet.configs import application_revision, config_hash, key_settings, submitted_deployment, unified_diff
from tests.conftest import ray_fixture


@pytest.fixture
def demo():
    return ray_fixture("serve_applications_two_apps.json")["applications"]["demo"]


def effective(demo, name: str) -> dict:
    return demo["deployments"][name]["deployment_config"]


# --- config_hash -----------------------------------------------------------------------------


def test_config_hash_does_not_depend_on_key_order():
    one = {"name": "Echo", "ray_actor_options": {"num_cpus": 0.1, "num_gpus": 0}, "max_ongoing_requests": 5}
    other = {"max_ongoing_requests": 5, "ray_actor_options": {"num_gpus": 0, "num_cpus": 0.1}, "name": "Echo"}
    assert config_hash(one) == config_hash(other)


def test_config_hash_changes_when_a_value_changes(demo):
    changed = copy.deepcopy(effective(demo, "Echo"))
    changed["max_ongoing_requests"] = 51
    assert config_hash(changed) != config_hash(effective(demo, "Echo"))


def test_config_hash_is_a_sha256_hex_digest(demo):
    digest = config_hash(effective(demo, "Model"))
    assert len(digest) == 64
    assert set(digest) <= set("0123456789abcdef")


def test_config_hash_keeps_list_order_significant():
    assert config_hash({"deployments": ["a", "b"]}) != config_hash({"deployments": ["b", "a"]})


# --- key_settings ----------------------------------------------------------------------------


def test_key_settings_of_an_autoscaling_deployment(demo):
    assert key_settings(effective(demo, "Model")) == {
        "max_ongoing_requests": 8,
        "max_queued_requests": 100,
        "autoscaling_min_replicas": 1,
        "autoscaling_max_replicas": 2,
        "autoscaling_target_ongoing_requests": 4.0,
        "num_cpus": 0.2,
        "num_gpus": None,
    }


def test_key_settings_of_a_fixed_replica_deployment_has_no_autoscaling(demo):
    assert key_settings(effective(demo, "Echo")) == {
        "max_ongoing_requests": 50,
        "max_queued_requests": -1,
        "autoscaling_min_replicas": None,
        "autoscaling_max_replicas": None,
        "autoscaling_target_ongoing_requests": None,
        "num_cpus": 0.1,
        "num_gpus": None,
    }


def test_key_settings_keep_their_types(demo):
    settings = key_settings(effective(demo, "Model"))
    assert type(settings["max_ongoing_requests"]) is int
    assert type(settings["autoscaling_max_replicas"]) is int
    assert type(settings["autoscaling_target_ongoing_requests"]) is float
    assert type(settings["num_cpus"]) is float


def test_key_settings_read_num_gpus_when_present(demo):
    config = copy.deepcopy(effective(demo, "Model"))
    config["ray_actor_options"]["num_gpus"] = 1
    assert key_settings(config)["num_gpus"] == 1.0


def test_key_settings_of_an_empty_config_are_all_none():
    assert set(key_settings({}).values()) == {None}


# --- submitted_deployment / application_revision ---------------------------------------------


def test_submitted_deployment_finds_the_deployment_by_name(demo):
    submitted = submitted_deployment(demo["deployed_app_config"], "Model")
    assert submitted["name"] == "Model"
    assert submitted["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4}
    assert "num_replicas" not in submitted


def test_submitted_deployment_of_an_unknown_name_is_empty(demo):
    assert submitted_deployment(demo["deployed_app_config"], "Missing") == {}


def test_submitted_deployment_without_an_app_config_is_empty():
    assert submitted_deployment(None, "Model") == {}
    assert submitted_deployment({"name": "demo"}, "Model") == {}


def test_application_revision_stores_the_submitted_config_and_effective_configs_sorted(demo):
    effective_configs = {name: dep["deployment_config"] for name, dep in demo["deployments"].items()}
    assert list(effective_configs) == ["Model", "Echo"]  # Ray's order
    revision = application_revision(demo["deployed_app_config"], effective_configs)
    assert revision["submitted"] == demo["deployed_app_config"]
    assert list(revision["effective"]) == ["Echo", "Model"]
    assert revision["effective"]["Model"] == effective(demo, "Model")


def test_application_revision_without_a_submitted_config_stores_an_empty_one():
    assert application_revision(None, {}) == {"submitted": {}, "effective": {}}


def test_application_revision_hash_does_not_depend_on_deployment_order(demo):
    forward = {"Echo": effective(demo, "Echo"), "Model": effective(demo, "Model")}
    backward = {"Model": effective(demo, "Model"), "Echo": effective(demo, "Echo")}
    submitted = demo["deployed_app_config"]
    assert config_hash(application_revision(submitted, forward)) == config_hash(
        application_revision(submitted, backward)
    )


# --- unified_diff ----------------------------------------------------------------------------


def test_unified_diff_shows_a_changed_max_ongoing_requests_as_minus_and_plus_lines(demo):
    before = effective(demo, "Echo")
    after = copy.deepcopy(before)
    after["max_ongoing_requests"] = 5
    diff = unified_diff(before, after)
    assert diff[:2] == ["--- before", "+++ after"]
    changed = [line for line in diff[2:] if line[:1] in "+-"]
    assert changed == ['-  "max_ongoing_requests": 50,', '+  "max_ongoing_requests": 5,']


def test_unified_diff_uses_the_given_labels(demo):
    before = effective(demo, "Echo")
    after = {**before, "max_ongoing_requests": 5}
    diff = unified_diff(before, after, old_label="revision 1", new_label="revision 2")
    assert diff[:2] == ["--- revision 1", "+++ revision 2"]


def test_unified_diff_of_equal_configs_is_empty(demo):
    assert unified_diff(effective(demo, "Echo"), copy.deepcopy(effective(demo, "Echo"))) == []
