"""A null in a change is sent as null, never as a removal, wherever the options come from (the
planner page, a preset, a wizard's patch), and a change is verified only when Ray's effective
config holds every key it sets, nulls included."""

from __future__ import annotations

import copy
import re

import pytest
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.changes.planner import not_taken, plan_patch
from apps.changes.serve_options import autoscaling_defaults
from apps.changes.validation import validate_options
from apps.fleet import sync
from apps.remediation import diagnosis
from integrations.ray.parsing import parse_serve_status
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory
from tests.fake_ray import FakeRay, serving

MODEL = [{"application": "demo", "deployment": "Model"}]


def model_entry(config: dict) -> dict:
    app = next(app for app in config["applications"] if app["name"] == "demo")
    return next(entry for entry in app["deployments"] if entry["name"] == "Model")


@pytest.fixture
def replayed_cluster(db, team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    sync.sync_cluster(cluster.pk)
    return cluster


def plan_on_page(client, cluster, options_text: str):
    return client.post(
        reverse("changes:plan", args=[cluster.pk]),
        {"targets": ["demo/Model"], "options_text": options_text, "reason": "null test"},
    )


# --- the planner page ------------------------------------------------------------------------


def test_autoscaling_config_null_in_the_planner_turns_autoscaling_off_and_the_diff_says_null(
    client, people, replayed_cluster
):
    client.force_login(people["operator"])
    response = plan_on_page(client, replayed_cluster, "autoscaling_config: null\nnum_replicas: 2\n")

    change = Change.objects.get()
    assert response.status_code == 302
    entry = model_entry(change.new_config)
    assert entry["autoscaling_config"] is None and entry["num_replicas"] == 2
    assert change.warnings == ["demo/Model: autoscaling_config set to null: autoscaling off, num_replicas fixed at 2."]
    detail = client.get(reverse("changes:detail", args=[change.pk])).content.decode()
    assert re.search(r'class="diff-add">\+\s+&quot;autoscaling_config&quot;: null,', detail)
    assert re.search(r'class="diff-add">\+\s+&quot;num_replicas&quot;: 2,', detail)


def test_autoscaling_config_null_without_num_replicas_is_refused_saying_why(client, people, replayed_cluster):
    client.force_login(people["operator"])
    page = plan_on_page(client, replayed_cluster, "autoscaling_config: null\n").content.decode()

    assert "Add num_replicas to say how many replicas it keeps" in page
    assert not Change.objects.exists()


def test_a_user_config_key_set_to_null_in_the_planner_is_sent_as_null(client, people, replayed_cluster):
    client.force_login(people["operator"])
    plan_on_page(client, replayed_cluster, "user_config:\n  max_prompt_tokens: null\n")

    change = Change.objects.get()
    assert model_entry(change.new_config)["user_config"] == {"alloc_mb": 0, "hold_s": 0.05, "max_prompt_tokens": None}
    assert change.json_patch == [
        {"op": "add", "path": "/applications/0/deployments/1/user_config/max_prompt_tokens", "value": None}
    ]
    assert change.warnings == ["demo/Model: user_config.max_prompt_tokens set to null (sent as null, not removed)."]


def test_the_planner_page_says_what_null_does(client, people, replayed_cluster):
    client.force_login(people["operator"])
    page = client.get(reverse("changes:plan", args=[replayed_cluster.pk])).content.decode()
    assert "null is sent as null, never as a removal" in page


# --- presets ---------------------------------------------------------------------------------


def test_a_preset_with_a_null_plans_the_null(api_as, replayed_cluster):
    created = api_as("operator").post(
        "/api/v1/presets/",
        {"name": "No prompt cap", "team": "vision", "options": {"user_config": {"max_prompt_tokens": None}}},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["options"] == {"user_config": {"max_prompt_tokens": None}}

    planned = api_as("operator").post(
        "/api/v1/changes/",
        {"cluster": replayed_cluster.pk, "targets": MODEL, "preset": created.json()["slug"], "reason": "uncap"},
        format="json",
    )
    assert planned.status_code == 201, planned.content
    assert model_entry(Change.objects.get().new_config)["user_config"]["max_prompt_tokens"] is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_queued_requests": None}, "max_queued_requests: Serve refuses null here"),
        ({"num_replicas": None}, "num_replicas: Serve runs its default replica count in place of a null"),
        ({"ray_actor_options": {"num_cpus": None}}, "ray_actor_options.num_cpus: Serve runs 1 CPU in place of a null"),
        ({"autoscaling_config": {"min_replicas": None}}, "autoscaling_config.min_replicas: Serve refuses null here"),
        (
            {"ray_actor_options": {"runtime_env": {"env_vars": {"A": None}}}},
            "ray_actor_options.runtime_env: Serve takes no null",
        ),
    ],
)
def test_a_preset_with_a_null_serve_would_not_keep_is_refused_naming_the_option(api_as, options, message):
    response = api_as("operator").post(
        "/api/v1/presets/", {"name": "Bad null", "team": "vision", "options": options}, format="json"
    )
    assert response.status_code == 400
    assert message in str(response.json())
    # Explained once, in words about null, not again as pydantic's type error.
    assert "valid integer" not in str(response.json())


@pytest.mark.parametrize(
    "options",
    [
        {"user_config": None},
        {"user_config": {"limits": {"max_prompt_tokens": None}}},
        {"autoscaling_config": {"initial_replicas": None, "min_replicas": 1, "max_replicas": 2}},
        {"ray_actor_options": {"num_gpus": None}},
        {"autoscaling_config": None, "num_replicas": 2},
    ],
)
def test_nulls_serve_keeps_are_valid(options):
    assert validate_options(options) == options


# --- the wizard's patch path -----------------------------------------------------------------


def ray_runs(effective: dict, base_entry: dict, new_entry: dict) -> dict:
    """The effective config Ray 2.60 reports after taking the options that changed between the two
    entries (application_state.override_deployment_info, schema._deployment_info_to_schema): each
    replaces the running value wholesale; autoscaling hides num_replicas, a null autoscaling_config
    is left out and num_replicas shown instead."""
    after = copy.deepcopy(effective)
    for key, value in new_entry.items():
        if key == "name" or base_entry.get(key, ...) == value:
            continue
        if key == "autoscaling_config" and value is None:
            after.pop("autoscaling_config", None)
            after["num_replicas"] = new_entry.get("num_replicas", 1)
        elif key == "autoscaling_config":
            after["autoscaling_config"] = {**autoscaling_defaults(), **value}
            after.pop("num_replicas", None)
        else:
            after[key] = copy.deepcopy(value)
    return after


@pytest.mark.parametrize(
    "patch",
    [
        {"autoscaling_config": None, "num_replicas": 2},
        {"num_replicas": 3},
        {"user_config": {"max_prompt_tokens": None}},
    ],
)
def test_the_wizards_view_of_a_patch_with_a_null_is_what_ray_runs_after_it(patch):
    serve = parse_serve_status(ray_fixture("serve_applications_two_apps.json"))
    before = serve.applications["demo"].deployments["Model"].deployment_config
    plan = plan_patch(serve, MODEL, patch, "2.60.0")
    after = ray_runs(before, model_entry(plan.base_config), model_entry(plan.new_config))

    assert diagnosis.with_patch(diagnosis.settings_of(before), patch) == diagnosis.settings_of(after)
    # Once applied, the wizard sees the step as in place rather than the deployment as changed under it.
    assert diagnosis.with_patch(diagnosis.settings_of(after), patch) == diagnosis.settings_of(after)


# --- verification ----------------------------------------------------------------------------


def test_a_null_is_not_taken_for_a_key_ray_does_not_report():
    assert not_taken({"user_config": {"max_prompt_tokens": None}}, {"user_config": {}}) == [
        "user_config.max_prompt_tokens"
    ]
    assert not_taken({"user_config": {"max_prompt_tokens": None}}, {"user_config": {"max_prompt_tokens": None}}) == []
    # Ray leaves autoscaling_config out of the effective config while autoscaling is off.
    assert not_taken({"autoscaling_config": None, "num_replicas": 2}, {"num_replicas": 2}) == []
    assert not_taken({"autoscaling_config": None}, {"autoscaling_config": {"min_replicas": 1}}) == [
        "autoscaling_config"
    ]


def test_user_config_is_held_only_key_for_key_since_serve_hands_it_over_verbatim():
    assert not_taken({"user_config": {"a": 1}}, {"user_config": {"a": 1, "stale": 2}}) == ["user_config.stale"]
    # Elsewhere Serve fills in what was not sent.
    assert (
        not_taken(
            {"autoscaling_config": {"min_replicas": 1}},
            {"autoscaling_config": {"min_replicas": 1, "upscale_delay_s": 30.0}},
        )
        == []
    )


class ServeLikeRay(FakeRay):
    """Where the shared fake merges dicts, Ray 2.60 replaces user_config wholesale and leaves a null
    autoscaling_config out, showing num_replicas instead. With `honours_nulls` off it plays a Serve
    that does not take them: nulls inside user_config are dropped and a null autoscaling_config
    leaves autoscaling on."""

    def __init__(self, honours_nulls: bool):
        super().__init__()
        self.honours_nulls = honours_nulls
        model = self.serve["applications"]["demo"]
        model["deployed_app_config"]["deployments"][1]["user_config"]["max_prompt_tokens"] = 512
        model["deployments"]["Model"]["deployment_config"]["user_config"]["max_prompt_tokens"] = 512

    def apply(self, config: dict) -> None:
        before = copy.deepcopy(self.serve)
        super().apply(config)
        with self.lock:
            for app in config["applications"]:
                for entry in app.get("deployments", []):
                    effective = self.serve["applications"][app["name"]]["deployments"][entry["name"]][
                        "deployment_config"
                    ]
                    if isinstance(entry.get("user_config"), dict):
                        effective["user_config"] = {
                            k: v for k, v in entry["user_config"].items() if self.honours_nulls or v is not None
                        }
                    if isinstance(entry.get("autoscaling_config"), dict):
                        effective.pop("num_replicas", None)
                    elif "autoscaling_config" in entry and self.honours_nulls:
                        effective.pop("autoscaling_config", None)
                        effective["num_replicas"] = entry.get("num_replicas", 1)
                    elif "autoscaling_config" in entry:
                        was = before["applications"][app["name"]]["deployments"][entry["name"]]["deployment_config"]
                        effective["autoscaling_config"] = was.get("autoscaling_config")
                        effective.pop("num_replicas", None)

    def model(self) -> dict:
        return self.serve["applications"]["demo"]["deployments"]["Model"]["deployment_config"]


@pytest.fixture
def quick_verification(settings):
    settings.FLEETDECK_RAY_TIMEOUT_S = 1.0
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 1.5
    settings.FLEETDECK_CHANGE_POLL_S = 0.1


def change_on(fake: FakeRay, team, options: dict) -> Change:
    cluster = ClusterFactory(name="nulls", team=team, dashboard_url=fake.url)
    assert sync.sync_cluster(cluster.pk).ok
    operator = Actor.system(via="cli")
    change = protocol.plan_change(operator, cluster, targets=MODEL, options=options, reason="null test")
    protocol.request_apply(operator, change)
    protocol.run(change.pk)
    change.refresh_from_db()
    return change


@pytest.mark.django_db
def test_a_user_config_null_ray_holds_is_verified(team, quick_verification):
    with serving(ServeLikeRay(honours_nulls=True)) as fake:
        change = change_on(fake, team, {"user_config": {"max_prompt_tokens": None}})
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert fake.model()["user_config"] == {"alloc_mb": 0, "hold_s": 0.05, "max_prompt_tokens": None}


@pytest.mark.django_db
def test_autoscaling_off_that_ray_holds_is_verified(team, quick_verification):
    with serving(ServeLikeRay(honours_nulls=True)) as fake:
        change = change_on(fake, team, {"autoscaling_config": None, "num_replicas": 2})
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert "autoscaling_config" not in fake.model() and fake.model()["num_replicas"] == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options, key",
    [
        ({"user_config": {"max_prompt_tokens": None}}, "user_config.max_prompt_tokens"),
        ({"autoscaling_config": None, "num_replicas": 2}, "autoscaling_config"),
    ],
)
def test_a_null_ray_did_not_honour_is_never_verified_and_rolls_back_naming_the_key(
    team, quick_verification, options, key
):
    with serving(ServeLikeRay(honours_nulls=False)) as fake:
        change = change_on(fake, team, options)
    assert change.state == ChangeState.ROLLED_BACK, change.error
    # PostgreSQL's jsonb keeps keys in its own order, so the missing ones may be listed in any order.
    missing = change.error.split("demo/Model: effective config does not hold ", 1)[1].split(" yet", 1)[0].split(", ")
    assert key in missing, change.error
    assert "effective configs hold the new values" not in "\n".join(step.message for step in change.steps.all())
    assert fake.model()["user_config"]["max_prompt_tokens"] == 512
    assert fake.model()["autoscaling_config"]["max_replicas"] == 2
