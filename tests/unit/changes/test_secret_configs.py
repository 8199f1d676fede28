"""Secrets in Serve configs through the push protocol: readers get placeholders, Ray gets the real
values, and what is sent back with placeholders (an application's config, a deployment's options,
a preset) gets the values they stand for, or is refused when they stand for none. Drifts recorded
with the values are redone with placeholders."""

from __future__ import annotations

import copy
import html

import pytest
import yaml
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState, Preset
from apps.core.redaction import placeholder, redact_config
from apps.fleet import sync
from apps.fleet.configs import unified_diff
from apps.fleet.models import Application, Deployment
from tests.factories import ClusterFactory
from tests.unit.changes.test_app_lifecycle import RayTakesPuts

pytestmark = pytest.mark.django_db
HF_TOKEN = "hf_live_secret_123"
AWS_KEY = "aws_live_secret_456"


class RayWithSecrets(RayTakesPuts):
    """Both applications read a token from their env vars; demo's Model has a cloud key of its own."""

    def __init__(self):
        super().__init__()
        for app in self.payload["applications"].values():
            app["deployed_app_config"]["runtime_env"]["env_vars"]["HF_TOKEN"] = HF_TOKEN
            for deployment in app["deployments"].values():
                deployment["deployment_config"]["ray_actor_options"]["runtime_env"]["env_vars"]["HF_TOKEN"] = HF_TOKEN
        demo = self.payload["applications"]["demo"]
        demo["deployed_app_config"]["deployments"][1]["ray_actor_options"]["runtime_env"]["env_vars"][
            "AWS_SECRET_ACCESS_KEY"
        ] = AWS_KEY
        demo["deployments"]["Model"]["deployment_config"]["ray_actor_options"]["runtime_env"]["env_vars"][
            "AWS_SECRET_ACCESS_KEY"
        ] = AWS_KEY

    def apply(self, config: dict) -> None:
        # Ray runs the options sent for the deployments already there, as their effective config shows.
        super().apply(config)
        for app in config["applications"]:
            running = self.payload["applications"][app["name"]]["deployments"]
            for entry in app.get("deployments", []):
                if entry["name"] in running:
                    running[entry["name"]]["deployment_config"].update(
                        {key: value for key, value in entry.items() if key != "name"}
                    )


@pytest.fixture
def ray(use_replay, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 5
    settings.FLEETDECK_CHANGE_POLL_S = 0.01
    fake = RayWithSecrets()
    use_replay.routes["/api/serve/applications/"] = fake
    return fake


@pytest.fixture
def cluster(team, ray):
    cluster = ClusterFactory(name="vision-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    return cluster


def pushed_app(config: dict, name: str) -> dict:
    return next(app for app in config["applications"] if app["name"] == name)


def run(change_id: int, people) -> Change:
    protocol.request_apply(Actor(user=people["operator"], via="test"), Change.objects.get(pk=change_id))
    protocol.run(change_id)
    return Change.objects.get(pk=change_id)


def test_options_copied_from_a_redacted_deployment_push_the_real_values_they_stand_for(api_as, cluster, ray, people):
    model = Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")
    read = api_as("viewer").get(f"/api/v1/deployments/{model.pk}/")
    assert AWS_KEY not in read.content.decode() and HF_TOKEN not in read.content.decode()
    actor_options = read.json()["submitted_config"]["ray_actor_options"]
    assert actor_options["runtime_env"]["env_vars"]["AWS_SECRET_ACCESS_KEY"].startswith("<redacted:")

    planned = api_as("operator").post(
        "/api/v1/changes/",
        {
            "cluster": cluster.pk,
            "targets": [{"application": "demo", "deployment": "Model"}],
            "options": {"ray_actor_options": {**actor_options, "num_cpus": 0.3}},
            "reason": "more CPU",
        },
        format="json",
    )
    assert planned.status_code == 201, planned.content
    assert AWS_KEY not in planned.content.decode()
    change = run(planned.json()["id"], people)

    assert change.state == ChangeState.SUCCEEDED, change.error
    (pushed,) = ray.pushes
    assert pushed_app(pushed, "demo")["deployments"][1]["ray_actor_options"] == {
        "num_cpus": 0.3,
        "runtime_env": {"env_vars": {"RECYCLE_GENERATION": "1", "AWS_SECRET_ACCESS_KEY": AWS_KEY}},
    }
    assert pushed_app(pushed, "echo2")["runtime_env"]["env_vars"]["HF_TOKEN"] == HF_TOKEN


def test_an_application_config_read_through_the_api_and_sent_back_deploys_with_the_real_secrets(
    api_as, cluster, ray, people
):
    echo2 = Application.objects.get(cluster=cluster, name="echo2")
    read = api_as("viewer").get(f"/api/v1/applications/{echo2.pk}/")
    assert HF_TOKEN not in read.content.decode()
    sent_back = {**read.json()["deployed_app_config"], "name": "echo3", "route_prefix": "/echo3"}
    assert sent_back["runtime_env"]["env_vars"]["HF_TOKEN"].startswith("<redacted:")

    planned = api_as("operator").post(
        "/api/v1/changes/create-application/",
        {"cluster": cluster.pk, "application": sent_back, "reason": "a second echo"},
        format="json",
    )
    assert planned.status_code == 201, planned.content
    assert HF_TOKEN not in planned.content.decode()
    change = run(planned.json()["id"], people)

    assert change.state == ChangeState.SUCCEEDED, change.error
    (pushed,) = ray.pushes
    assert pushed_app(pushed, "echo3")["runtime_env"]["env_vars"] == {
        "PYTHONPATH": "/opt/demo-app",
        "HF_TOKEN": HF_TOKEN,
    }


def test_a_placeholder_that_stands_for_no_current_value_is_refused_and_nothing_is_planned(api_as, cluster, ray):
    app = {
        "name": "echo3",
        "route_prefix": "/echo3",
        "import_path": "demo_app:echo_only",
        "runtime_env": {"env_vars": {"HF_TOKEN": "<redacted:0123abcd>"}},
    }
    refused = api_as("operator").post(
        "/api/v1/changes/create-application/",
        {"cluster": cluster.pk, "application": app, "reason": "typed from a screenshot"},
        format="json",
    )

    assert refused.status_code == 400
    assert refused.json() == {
        "detail": [
            "runtime_env.env_vars.HF_TOKEN holds a redacted placeholder that matches no current value: "
            "type the value again."
        ]
    }
    assert not Change.objects.exists() and not ray.pushes


def test_a_preset_edited_from_its_redacted_form_keeps_its_secret_and_refuses_an_unknown_placeholder(
    api_as, client, people
):
    options = {"ray_actor_options": {"runtime_env": {"env_vars": {"HF_TOKEN": HF_TOKEN}}}}
    created = api_as("operator").post(
        "/api/v1/presets/", {"name": "Tokened", "team": "vision", "options": options}, format="json"
    )
    assert created.status_code == 201 and HF_TOKEN not in created.content.decode()
    preset = Preset.objects.get(pk=created.json()["id"])
    client.force_login(people["operator"])
    form = client.get(reverse("changes:preset_edit", args=[preset.pk])).content.decode()
    assert HF_TOKEN not in form and html.escape(placeholder(HF_TOKEN)) in form

    edited = {**redact_config(options), "max_ongoing_requests": 3}
    saved = client.post(
        reverse("changes:preset_edit", args=[preset.pk]),
        {"name": "Tokened", "team": preset.team_id, "description": "", "options_text": yaml.safe_dump(edited)},
    )

    assert saved.status_code == 302
    preset.refresh_from_db()
    options = {**options, "max_ongoing_requests": 3}
    assert preset.options == options
    guessed = {"ray_actor_options": {"runtime_env": {"env_vars": {"HF_TOKEN": placeholder("hf_guess")}}}}
    refused = api_as("operator").patch(f"/api/v1/presets/{preset.pk}/", {"options": guessed}, format="json")
    assert refused.status_code == 400 and "type the value again" in refused.content.decode()
    assert Preset.objects.get(pk=preset.pk).options == options


@pytest.mark.django_db(transaction=True)
def test_the_migration_redoes_the_drifts_recorded_with_secrets_with_placeholders():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    base = {"applications": [{"name": "a", "runtime_env": {"env_vars": {"HF_TOKEN": HF_TOKEN}}, "x": list(range(9))}]}
    live = copy.deepcopy(base)
    live["applications"][0]["runtime_env"]["env_vars"]["HF_TOKEN"] = "hf_live_secret_rotated"
    live["applications"][0]["x"].append(9)
    cluster = ClusterFactory()
    drifts = {
        "recorded": unified_diff(base, live, old_label="planned against", new_label="live now"),
        "unreadable": ["--- planned against", "+++ live now", "@@ -1,1 +1,1 @@", f'-  "{HF_TOKEN}"'],
    }
    for reason, drift in drifts.items():
        Change.objects.create(
            cluster=cluster, reason=reason, base_hash="", base_config=base, new_config=base, new_hash="", drift=drift
        )
    MigrationExecutor(connection).migrate([("changes", "0005_list_count_indexes")])

    MigrationExecutor(connection).migrate([("changes", "0006_redacted_drift")])

    redone = Change.objects.get(reason="recorded").drift
    assert redone == unified_diff(
        redact_config(base), redact_config(live), old_label="planned against", new_label="live now"
    )
    assert any("HF_TOKEN" in line for line in redone) and "live_secret" not in str(redone)
    assert "live_secret" not in str(Change.objects.get(reason="unreadable").drift)
