"""Which config changes start new replicas: Serve reconfigures most deployment options in place,
and only those it does not (and the application's code or runtime_env) double memory in a rollout."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from apps.changes.serve_options import IN_PLACE_OPTIONS, replaces_replicas

REFERENCE_APP = Path(__file__).resolve().parents[3] / "deploy" / "reference_app"


def config(name: str) -> dict:
    return json.loads((REFERENCE_APP / f"{name}.json").read_text())


def test_the_readme_storys_misbehaving_config_starts_no_new_replica():
    # max_ongoing_requests, the queue, autoscaling to a fixed count and user_config: all in place.
    assert not replaces_replicas(config("reference"), config("misbehaving"), "reference")
    assert not replaces_replicas(config("misbehaving"), config("reference"), "reference")


@pytest.mark.parametrize(
    "where, key, value",
    [
        ("deployment", "ray_actor_options", {"num_cpus": 0.5}),
        ("deployment", "max_replicas_per_node", 1),
        ("deployment", "placement_group_bundles", [{"CPU": 1}]),
        ("application", "runtime_env", {"env_vars": {"RECYCLE": "1"}}),
        ("application", "import_path", "reference_app:other"),
        ("application", "args", {"model": "b"}),
    ],
)
def test_what_serve_cannot_apply_in_place_replaces_the_replicas(where, key, value):
    before = config("reference")
    after = copy.deepcopy(before)
    app = after["applications"][0]
    (app if where == "application" else app["deployments"][0])[key] = value
    assert replaces_replicas(before, after, "reference")


def test_a_route_or_another_application_changes_nothing_here_and_the_unknown_counts_as_replaced():
    before = config("reference")
    moved = copy.deepcopy(before)
    moved["applications"][0]["route_prefix"] = "/v2"
    moved["applications"].append({"name": "other", "import_path": "x:y", "deployments": []})
    assert not replaces_replicas(before, moved, "reference")
    assert replaces_replicas(before, moved, "other")  # new: every replica of it is new
    assert replaces_replicas(None, before, "reference") and replaces_replicas(before, {}, "reference")


def test_the_in_place_options_are_those_the_installed_ray_reconfigures():
    from ray.serve._private.config import DeploymentConfig, DeploymentOptionUpdateType

    update_types = {
        name: (field.json_schema_extra or {}).get("update_type")
        for name, field in DeploymentConfig.model_fields.items()
    }
    in_place = {name for name, kind in update_types.items() if kind and kind != DeploymentOptionUpdateType.HeavyWeight}
    assert in_place == IN_PLACE_OPTIONS
