"""Presets and change planning through the API and the pages, against replayed Ray payloads."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.changes.models import Change, ChangeState, Preset
from apps.clusters.models import Cluster
from apps.fleet import sync
from tests.factories import ClusterFactory
from tests.yaml_aliases import alias_bomb, written_out

pytestmark = pytest.mark.django_db
MODEL = [{"application": "demo", "deployment": "Model"}]


@pytest.fixture
def cluster(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    sync.sync_cluster(cluster.pk)
    return cluster


def plan(client, cluster, **body):
    payload = {"cluster": cluster.pk, "targets": MODEL, "reason": "tune for bursts"} | body
    return client.post("/api/v1/changes/", payload, format="json")


def test_builtin_presets_are_installed_and_read_only(api_as):
    slugs = {p["slug"] for p in api_as("viewer").get("/api/v1/presets/").json()["results"]}
    assert {"heavy-gpu-model", "vision-gpu", "light-cpu"} <= slugs
    heavy = Preset.objects.get(slug="heavy-gpu-model")
    assert api_as("admin").patch(f"/api/v1/presets/{heavy.pk}/", {"name": "x"}, format="json").status_code == 400
    assert api_as("admin").delete(f"/api/v1/presets/{heavy.pk}/").status_code == 400


def test_operators_create_clone_edit_and_delete_team_presets(api_as):
    client = api_as("operator")
    created = client.post(
        "/api/v1/presets/",
        {"name": "Chatty", "team": "vision", "description": "d", "options": {"max_ongoing_requests": 3}},
        format="json",
    )
    assert created.status_code == 201, created.content
    preset_id = created.json()["id"]
    assert (
        client.patch(
            f"/api/v1/presets/{preset_id}/", {"options": {"max_ongoing_requests": 4}}, format="json"
        ).status_code
        == 200
    )
    assert Preset.objects.get(pk=preset_id).options == {"max_ongoing_requests": 4}
    heavy = Preset.objects.get(slug="heavy-gpu-model")
    clone = client.post(f"/api/v1/presets/{heavy.pk}/clone/", {"team": "vision"}, format="json")
    assert clone.status_code == 201 and clone.json()["options"] == heavy.options and not clone.json()["builtin"]
    assert client.delete(f"/api/v1/presets/{preset_id}/").status_code == 204
    assert {"preset.create", "preset.update", "preset.delete"} <= set(
        AuditEvent.objects.values_list("action", flat=True)
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_ongoing_requests": 0}, "greater than 0"),
        ({"max_ongoing_requests": "lots"}, "max_ongoing_requests"),
        ({"max_concurrent_queries": 2}, "max_ongoing_requests"),
        ({"autoscaling_config": {"max_ongoing_requests": 2}}, "ignores"),
        ({"bogus": 1}, "drop it silently"),
        ({"num_replicas": 2, "autoscaling_config": {"min_replicas": 1}}, "exclude each other"),
        ({"max_ongoing_requests": 1, "autoscaling_config": {"target_ongoing_requests": 4}}, "never scales up"),
    ],
)
def test_presets_with_bad_or_conflicting_options_are_refused(api_as, options, message):
    response = api_as("operator").post(
        "/api/v1/presets/", {"name": "Bad", "team": "vision", "options": options}, format="json"
    )
    assert response.status_code == 400
    assert message in str(response.json())
    assert not Preset.objects.filter(name="Bad").exists()


def test_viewers_cannot_create_presets(api_as):
    response = api_as("viewer").post(
        "/api/v1/presets/", {"name": "P", "team": "vision", "options": {"max_ongoing_requests": 2}}, format="json"
    )
    assert response.status_code == 403


def test_planning_shows_a_json_patch_and_pushes_nothing(api_as, cluster, use_replay):
    response = plan(api_as("operator"), cluster, preset="heavy-gpu-model")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "planned" and body["preset"] == "heavy-gpu-model"
    paths = {op["path"] for op in body["json_patch"]}
    assert "/applications/0/deployments/1/max_ongoing_requests" in paths
    assert all(path.startswith("/applications/0/deployments/1/") for path in paths)
    assert all(request.method == "GET" for request in use_replay.requests)
    assert body["steps"][0]["state"] == "planned"


def test_options_as_yaml_text_are_parsed(api_as, cluster):
    response = plan(api_as("operator"), cluster, options_text="max_queued_requests: 10\n")
    assert response.status_code == 201, response.content
    assert response.json()["patch"] == {"max_queued_requests": 10}


def test_options_text_with_yaml_aliases_is_refused_on_its_field_and_nothing_is_saved(api_as, cluster):
    response = plan(api_as("operator"), cluster, options_text=f"max_queued_requests: 10\nuser_config: {alias_bomb()}")
    assert response.status_code == 400
    assert "anchors and aliases (&name / *name) are not accepted" in str(response.json()["options_text"])
    assert not Change.objects.exists()


def test_the_same_options_written_out_without_aliases_are_planned(api_as, cluster):
    response = plan(api_as("operator"), cluster, options_text=f"max_queued_requests: 10\nuser_config: {written_out()}")
    assert response.status_code == 201, response.content
    assert response.json()["patch"]["user_config"] == json.loads(written_out())


def preset_form(client, people, team, options_text: str):
    client.force_login(people["operator"])
    form = {"name": "Chatty", "team": team.pk, "options_text": options_text}
    return client.post(reverse("changes:preset_create"), form)


def test_the_preset_form_refuses_yaml_aliases_on_the_options_field_and_saves_nothing(client, people, team):
    page = preset_form(client, people, team, f"user_config: {alias_bomb()}").content.decode()
    assert "anchors and aliases (&amp;name / *name) are not accepted" in page
    assert not Preset.objects.filter(name="Chatty").exists()


def test_the_preset_form_saves_the_same_options_written_out_without_aliases(client, people, team):
    response = preset_form(client, people, team, f"user_config: {written_out()}")
    assert response.status_code == 302
    assert Preset.objects.get(name="Chatty").options == {"user_config": json.loads(written_out())}


@pytest.mark.parametrize(
    "body, message",
    [
        ({"options_text": "max_ongoing_requests: [unclosed"}, "Invalid YAML/JSON"),
        ({"options_text": "- a list"}, "must be a mapping"),
        ({"options": {"max_ongoing_requests": -1}}, "greater than 0"),
        ({"options": {"max_ongoing_requests": 8}}, "nothing to change"),
        (
            {"options": {"max_ongoing_requests": 2}, "targets": [{"application": "demo", "deployment": "Nope"}]},
            "No deployment 'Nope'",
        ),
        (
            {"options": {"max_ongoing_requests": 2}, "targets": [{"application": "nope", "deployment": "Model"}]},
            "No application 'nope'",
        ),
        ({"options": {"max_ongoing_requests": 2}, "reason": " "}, "reason"),
        ({}, "Give a preset or the options to change"),
    ],
)
def test_bad_plans_get_a_specific_error_and_nothing_is_saved(api_as, cluster, body, message):
    response = plan(api_as("operator"), cluster, **body)
    assert response.status_code == 400
    assert message in str(response.json())
    assert not Change.objects.exists()


def test_viewers_may_look_but_not_plan(api_as, cluster):
    assert plan(api_as("viewer"), cluster, preset="heavy-gpu-model").status_code == 403
    assert plan(api_as("outsider"), cluster, preset="heavy-gpu-model").status_code == 400


def test_a_rayservice_owned_cluster_is_never_pushed_through_the_dashboard(api_as, cluster, use_replay):
    from apps.accounts.audit import Actor
    from apps.changes import protocol

    Cluster.objects.filter(pk=cluster.pk).update(serve_config_owner=Cluster.ConfigOwner.RAYSERVICE)
    change_id = plan(api_as("operator"), cluster, options={"max_queued_requests": 10}).json()["id"]
    change = Change.objects.get(pk=change_id)
    protocol.request_apply(Actor(), change)

    protocol.run(change_id)

    change.refresh_from_db()
    assert change.state == ChangeState.FAILED and "RayService" in change.error
    assert all(request.method == "GET" for request in use_replay.requests)


def test_cancel_only_a_planned_change(api_as, cluster):
    change_id = plan(api_as("operator"), cluster, options={"max_queued_requests": 10}).json()["id"]
    assert api_as("operator").post(f"/api/v1/changes/{change_id}/cancel/").json()["state"] == "cancelled"
    assert api_as("operator").post(f"/api/v1/changes/{change_id}/apply/").status_code == 409


def test_a_broker_that_refuses_the_message_leaves_the_change_queued_for_the_reconciler(
    api_as, client, people, cluster, monkeypatch, settings, django_capture_on_commit_callbacks
):
    from kombu.exceptions import OperationalError

    from apps.changes import protocol
    from controlplane.celery import app

    def refused(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    change_id = plan(api_as("operator"), cluster, options={"max_queued_requests": 10}).json()["id"]
    monkeypatch.setattr(app, "send_task", refused)
    with django_capture_on_commit_callbacks(execute=True):
        applied = api_as("operator").post(f"/api/v1/changes/{change_id}/apply/")
    assert applied.status_code == 202 and applied.json()["state"] == "queued"

    # The page says why it waits, then the reconciler sends it again with the broker back.
    Change.objects.filter(pk=change_id).update(heartbeat_at=timezone.now() - timedelta(seconds=25))
    client.force_login(people["viewer"])
    page = client.get(reverse("changes:detail", args=[change_id])).content.decode()
    assert "Waiting for a worker" in page and "25 s ago" in page
    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, args, **options: sent.append((name, args)))
    settings.FLEETDECK_CHANGE_STALE_S = 5
    assert protocol.stale_changes() == [change_id]
    protocol.reconcile(change_id)
    protocol.reconcile(change_id)
    change = Change.objects.get(pk=change_id)
    assert sent == [("changes.run", [change_id])] and change.state == ChangeState.QUEUED
    assert (
        change.steps.last().message
        == "Reconciler: no worker took this change up within 5 s; sent to the workers again."
    )
    assert "Waiting for a worker" not in client.get(reverse("changes:detail", args=[change_id])).content.decode()


def test_restore_plans_a_past_revision(api_as, cluster, use_replay):
    from apps.fleet.models import ConfigRevision
    from tests.conftest import ray_fixture

    revision = ConfigRevision.objects.get(application__name="demo")
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployed_app_config"]["deployments"][1]["max_ongoing_requests"] = 3
    use_replay.routes["/api/serve/applications/"] = payload

    response = api_as("operator").post(
        "/api/v1/changes/restore/", {"revision": revision.pk, "reason": "undo"}, format="json"
    )

    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "restore"
    assert response.json()["json_patch"] == [
        {"op": "replace", "path": "/applications/0/deployments/1/max_ongoing_requests", "value": 8}
    ]


def test_the_plan_page_plans_and_the_change_page_shows_the_diff(client, people, cluster):
    client.force_login(people["operator"])
    page = client.get(reverse("changes:plan", args=[cluster.pk]) + "?target=demo/Model").content.decode()
    assert 'value="demo/Model"' in page and "Heavy GPU model" in page

    response = client.post(
        reverse("changes:plan", args=[cluster.pk]),
        {"targets": ["demo/Model"], "options_text": "max_queued_requests: 10", "reason": "bound the queue"},
    )
    change = Change.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("changes:detail", args=[change.pk])
    detail = client.get(reverse("changes:detail", args=[change.pk])).content.decode()
    assert re.search(r'class="diff-del">-\s+&quot;max_queued_requests&quot;: 100,', detail)
    assert re.search(r'class="diff-add">\+\s+&quot;max_queued_requests&quot;: 10,', detail)
    assert ">Apply</button>" in detail


def test_the_plan_page_explains_refusals(client, people, cluster):
    client.force_login(people["operator"])
    page = client.post(
        reverse("changes:plan", args=[cluster.pk]),
        {"targets": ["demo/Model"], "options_text": "max_ongoing_requests: 1", "reason": "x"},
    ).content.decode()
    assert "never scales up" in page
    assert not Change.objects.exists()


def test_viewers_see_changes_without_buttons(client, people, cluster, api_as):
    change_id = plan(api_as("operator"), cluster, options={"max_queued_requests": 10}).json()["id"]
    client.force_login(people["viewer"])
    detail = client.get(reverse("changes:detail", args=[change_id])).content.decode()
    assert "Planned" in detail and ">Apply</button>" not in detail
    assert client.get(reverse("changes:plan", args=[cluster.pk])).status_code == 403


def test_the_presets_page_lists_builtins_with_their_reasons(client, people):
    client.force_login(people["viewer"])
    page = client.get(reverse("changes:presets")).content.decode()
    assert "Heavy GPU model" in page and "OOM-2" in page and "target_ongoing_requests: 1" in page


def test_admins_mark_a_cluster_as_rayservice_owned(api_as, cluster):
    response = api_as("admin").patch(
        f"/api/v1/clusters/{cluster.pk}/", {"serve_config_owner": "rayservice"}, format="json"
    )
    assert response.status_code == 200 and response.json()["serve_config_owner"] == "rayservice"
    assert (
        api_as("admin")
        .patch(f"/api/v1/clusters/{cluster.pk}/", {"serve_config_owner": "nonsense"}, format="json")
        .status_code
        == 400
    )


def test_a_revision_page_offers_a_restore_that_plans_a_change(client, people, cluster, use_replay):
    from apps.fleet.models import ConfigRevision
    from tests.conftest import ray_fixture

    revision = ConfigRevision.objects.get(application__name="demo")
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployed_app_config"]["deployments"][1]["max_ongoing_requests"] = 3
    use_replay.routes["/api/serve/applications/"] = payload
    client.force_login(people["operator"])
    assert "Plan restoring this revision" in client.get(reverse("fleet:revision", args=[revision.pk])).content.decode()

    response = client.post(reverse("changes:restore_revision", args=[revision.pk]), {"reason": "back to known good"})

    change = Change.objects.get()
    assert response["Location"] == reverse("changes:detail", args=[change.pk])
    assert change.kind == "restore" and change.reason == "back to known good"


NOT_BOTH = "Give a preset or options, not both."
NEITHER = "Give a preset or the options to change (e.g. max_ongoing_requests: 4): there is nothing to apply."


@pytest.mark.parametrize(
    "choice, message",
    [
        pytest.param({}, NEITHER, id="neither"),
        pytest.param({"preset": "heavy-gpu-model", "options": {"max_ongoing_requests": 2}}, NOT_BOTH, id="both"),
    ],
)
def test_a_change_or_rollout_takes_a_preset_or_options_everywhere_with_one_message(
    client, people, api_as, cluster, choice, message
):
    from django.core.exceptions import ValidationError

    from apps.accounts.audit import Actor
    from apps.changes import protocol, rollouts
    from apps.changes.models import Rollout

    api = api_as("operator")
    assert plan(api, cluster, **choice).json() == {"options": [message]}
    rollout = api.post(
        "/api/v1/rollouts/", {"selection": {"deployment": "Model"}, "reason": "r", **choice}, format="json"
    )
    assert rollout.status_code == 400 and rollout.json() == {"options": [message]}

    client.force_login(people["operator"])
    form = {"reason": "r", "deployment": "Model", "targets": ["demo/Model"]}
    if choice:
        form |= {"preset": Preset.objects.get(slug="heavy-gpu-model").pk, "options_text": "max_ongoing_requests: 2"}
    for page in (reverse("changes:plan", args=[cluster.pk]), reverse("changes:rollout_create")):
        response = client.post(page, form)
        assert response.status_code == 200 and message in response.content.decode(), page

    preset = Preset.objects.get(slug="heavy-gpu-model") if choice else None
    options = choice.get("options")
    with pytest.raises(ValidationError, match=re.escape(message)):
        protocol.plan_change(
            Actor(user=people["operator"]), cluster, targets=MODEL, reason="r", preset=preset, options=options
        )
    with pytest.raises(ValidationError, match=re.escape(message)):
        rollouts.plan_rollout(
            Actor(user=people["operator"]),
            selection={"deployment": "Model"},
            reason="r",
            preset=preset,
            options=options,
        )
    assert not Change.objects.exists() and not Rollout.objects.exists()
