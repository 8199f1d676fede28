"""Fleet rollouts: selection across clusters, waves, and stopping at the first failure."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.changes import rollouts
from apps.changes.models import Change, ChangeState, Preset, Rollout
from apps.fleet import sync
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def clusters(team, use_replay):
    made = []
    for name, labels in (("eu-prod", {"env": "prod"}), ("us-prod", {"env": "prod"}), ("dev", {"env": "dev"})):
        cluster = ClusterFactory(name=name, team=team, dashboard_url=f"http://{name}.test:8265", labels=labels)
        sync.sync_cluster(cluster.pk)
        made.append(cluster)
    return made


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"])


def heavy():
    return Preset.objects.get(slug="heavy-gpu-model")


def test_a_rollout_plans_one_change_per_matching_cluster_with_a_canary_wave(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="fleet OOMs", preset=heavy()
    )

    changes = list(rollout.changes.order_by("wave", "cluster__name"))
    assert [(c.cluster.name, c.wave) for c in changes] == [("eu-prod", 0), ("us-prod", 1)]
    assert all(
        c.targets == [{"application": "demo", "deployment": "Model"}] and c.state == ChangeState.PLANNED
        for c in changes
    )
    assert [len(wave) for wave in rollout.waves] == [1, 1]


def test_the_canary_can_be_chosen(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy(), canary="us-prod"
    )
    assert rollout.changes.get(wave=0).cluster.name == "us-prod"


def test_the_next_wave_starts_only_after_the_canary_succeeded(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    rollouts.start(operator, rollout)
    canary, rest = rollout.changes.get(wave=0), rollout.changes.get(wave=1)
    assert Change.objects.get(pk=canary.pk).state == ChangeState.QUEUED
    rollouts.advance(rollout.pk)
    assert Change.objects.get(pk=rest.pk).state == ChangeState.PLANNED

    Change.objects.filter(pk=canary.pk).update(state=ChangeState.SUCCEEDED)
    rollouts.advance(rollout.pk)
    assert Change.objects.get(pk=rest.pk).state == ChangeState.QUEUED

    Change.objects.filter(pk=rest.pk).update(state=ChangeState.SUCCEEDED)
    rollouts.advance(rollout.pk)
    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.SUCCEEDED


def test_a_worker_killed_between_starting_and_applying_the_canary_never_skips_it(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    # What `start` commits before it applies wave 0; the kill lands between the two.
    Rollout.objects.filter(pk=rollout.pk).update(state=Rollout.State.RUNNING)

    rollouts.advance(rollout.pk)

    assert Change.objects.get(rollout=rollout, wave=0).state == ChangeState.QUEUED
    assert Change.objects.get(rollout=rollout, wave=1).state == ChangeState.PLANNED
    assert Rollout.objects.get(pk=rollout.pk).current_wave == 0


def test_a_worker_killed_between_moving_on_and_applying_a_wave_applies_it_on_the_next_tick(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    rollouts.start(operator, rollout)
    Change.objects.filter(rollout=rollout, wave=0).update(state=ChangeState.SUCCEEDED)
    # What `advance` commits before it applies wave 1; the kill lands between the two.
    Rollout.objects.filter(pk=rollout.pk).update(current_wave=1)

    rollouts.advance(rollout.pk)

    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.RUNNING
    assert Change.objects.get(rollout=rollout, wave=1).state == ChangeState.QUEUED


def test_a_change_another_tick_applied_first_does_not_stop_the_rollout(clusters, operator, monkeypatch):
    from apps.changes import protocol

    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    real_apply = protocol.request_apply

    def raced(actor, change):
        real_apply(actor, Change.objects.get(pk=change.pk))  # the other tick wins
        return real_apply(actor, change)

    monkeypatch.setattr(protocol, "request_apply", raced)
    rollouts.start(operator, rollout)

    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.RUNNING
    assert Change.objects.get(rollout=rollout, wave=0).state == ChangeState.QUEUED


def test_a_failed_canary_stops_the_rollout_and_cancels_the_rest(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    rollouts.start(operator, rollout)
    Change.objects.filter(rollout=rollout, wave=0).update(state=ChangeState.ROLLED_BACK)

    rollouts.advance(rollout.pk)

    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.FAILED and "eu-prod" in rollout.error and "rolled back" in rollout.error
    assert Change.objects.get(rollout=rollout, wave=1).state == ChangeState.CANCELLED


def test_nothing_matching_is_refused(clusters, operator):
    with pytest.raises(Exception, match="No deployment you may change"):
        rollouts.plan_rollout(operator, selection={"deployment": "Nope"}, reason="r", preset=heavy())


def test_unknown_filters_are_refused(clusters, operator):
    with pytest.raises(Exception, match="Unknown filter"):
        rollouts.plan_rollout(operator, selection={"colour": "red"}, reason="r", preset=heavy())


@pytest.mark.parametrize(
    "label, names",
    [
        ("env=prod", {"eu-prod", "us-prod"}),
        ("env", {"eu-prod", "us-prod", "dev"}),
        ("x__isnull=true", set()),
        ("env__contains=p", set()),
        ("regex=^(.+)+#$", set()),
    ],
)
def test_a_rollout_selects_clusters_by_one_literal_label_key_whatever_lookup_it_spells(
    clusters, operator, label, names
):
    with CaptureQueriesContext(connection) as queries:
        selected = rollouts.select_deployments(operator.user, {"label": label})
    assert {cluster.name for cluster in selected} == names
    assert not any("REGEXP" in query["sql"] for query in queries.captured_queries)


@pytest.mark.parametrize("label", ["Env=prod", "env name", "=prod"])
def test_a_rollout_whose_label_key_is_no_label_key_is_a_400_naming_the_label_and_plans_nothing(api_as, clusters, label):
    response = api_as("operator").post(
        "/api/v1/rollouts/",
        {"selection": {"label": label}, "preset": "heavy-gpu-model", "reason": "r"},
        format="json",
    )
    assert response.status_code == 400
    (message,) = response.json()["detail"]
    assert message.startswith("A label filter is key=value or key;") and "is not a label key" in message
    assert not Rollout.objects.exists()


def test_a_rollout_plan_that_fails_on_one_cluster_saves_nothing(clusters, operator):
    with pytest.raises(Exception, match="cannot be planned") as caught:
        rollouts.plan_rollout(
            operator, selection={"deployment": "Model"}, reason="r", options={"max_ongoing_requests": 8}
        )
    assert "nothing to change" in str(caught.value)
    assert not Rollout.objects.exists() and not Change.objects.exists()


def test_viewers_select_nothing(clusters, people):
    with pytest.raises(Exception, match="No deployment you may change"):
        rollouts.plan_rollout(Actor(user=people["viewer"]), selection={}, reason="r", preset=heavy())


def test_the_rollout_api_plans_and_starts(api_as, clusters):
    client = api_as("operator")
    created = client.post(
        "/api/v1/rollouts/",
        {
            "selection": {"label": "env=prod", "deployment": "Model"},
            "preset": "heavy-gpu-model",
            "reason": "fleet OOMs",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert [c["wave"] for c in sorted(body["changes"], key=lambda c: c["wave"])] == [0, 1]
    started = client.post(f"/api/v1/rollouts/{body['id']}/start/")
    assert started.status_code == 202 and started.json()["state"] == "running"
    assert client.post(f"/api/v1/rollouts/{body['id']}/start/").status_code == 409
    assert api_as("viewer").post(f"/api/v1/rollouts/{body['id']}/cancel/").status_code in (403, 404)


def test_the_rollout_page_shows_waves(client, people, clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    client.force_login(people["operator"])
    page = client.get(reverse("changes:rollout", args=[rollout.pk])).content.decode()
    assert (
        "Wave 1: canary" in page
        and "Wave 2: the rest" in page
        and "eu-prod" in page
        and "Start with the canary" in page
    )
    form = client.post(
        reverse("changes:rollout_create"),
        {"preset": heavy().pk, "label": "env=dev", "deployment": "Model", "reason": "dev too"},
    )
    assert form.status_code == 302


def test_a_rollout_across_teams_shows_each_viewer_only_their_teams_changes(
    clusters, people, other_team, api_as, client, use_replay
):
    from apps.accounts.models import Membership

    speech = ClusterFactory(
        name="speech-prod", team=other_team, dashboard_url="http://speech-prod.test:8265", labels={"env": "prod"}
    )
    sync.sync_cluster(speech.pk)
    Membership.objects.create(user=people["admin"], team=other_team, role="operator")
    both = Actor(user=people["admin"])
    rollout = rollouts.plan_rollout(
        both, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy(), canary="speech-prod"
    )
    rollouts.start(both, rollout)
    canary = rollout.changes.get(wave=0)
    Change.objects.filter(pk=canary.pk).update(state=ChangeState.ROLLED_BACK)
    rollouts.advance(rollout.pk)
    assert "speech-prod" in Rollout.objects.get(pk=rollout.pk).error

    seen = api_as("viewer").get(f"/api/v1/rollouts/{rollout.pk}/").json()
    assert sorted(c["cluster_name"] for c in seen["changes"]) == ["eu-prod", "us-prod"]
    assert (
        "speech" not in seen["error"]
        and seen["error"] == "The rollout stopped at a change on a cluster of another team."
    )
    assert [c["cluster_name"] for c in api_as("viewer").get("/api/v1/rollouts/").json()["results"][0]["changes"]] != []
    assert "speech-prod" not in str(api_as("viewer").get("/api/v1/rollouts/").json())
    [counted] = api_as("viewer").get("/api/v1/rollouts/?changes=counts").json()["results"]
    assert "changes" not in counted and counted["error"] == seen["error"]
    assert counted["change_counts"] == dict(Counter(c["state"] for c in seen["changes"]))
    [whole] = api_as("admin").get("/api/v1/rollouts/?changes=counts").json()["results"]
    assert whole["error"] == Rollout.objects.get(pk=rollout.pk).error and sum(whole["change_counts"].values()) == 3

    client.force_login(people["viewer"])
    page = client.get(reverse("changes:rollout", args=[rollout.pk])).content.decode()
    assert "speech-prod" not in page and "eu-prod" in page and "clusters of teams you are not in" in page
    assert "Wave 2: the rest" in page and "canary" not in page

    whole = api_as("admin").get(f"/api/v1/rollouts/{rollout.pk}/").json()
    assert len(whole["changes"]) == 3 and "speech-prod" in whole["error"]


def across_two_teams(people, other_team) -> Rollout:
    """A rollout over the prod clusters of two teams, planned by an admin who operates the second."""
    from apps.accounts.models import Membership

    speech = ClusterFactory(
        name="speech-prod", team=other_team, dashboard_url="http://speech-prod.test:8265", labels={"env": "prod"}
    )
    sync.sync_cluster(speech.pk)
    Membership.objects.create(user=people["admin"], team=other_team, role="operator")
    return rollouts.plan_rollout(
        Actor(user=people["admin"]),
        selection={"label": "env=prod", "deployment": "Model"},
        reason="r",
        preset=heavy(),
        canary="speech-prod",
    )


@pytest.mark.parametrize("action", ["start", "cancel"])
def test_a_rollout_is_run_only_by_who_operates_every_cluster_it_changes(
    clusters, people, other_team, api_as, use_replay, action
):
    rollout = across_two_teams(people, other_team)

    # The operator of one team sees the rollout, but not all of it, and may not run it.
    assert api_as("operator").post(f"/api/v1/rollouts/{rollout.pk}/{action}/").status_code == 403
    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.PLANNED
    assert set(Change.objects.filter(rollout=rollout).values_list("state", flat=True)) == {ChangeState.PLANNED}

    assert api_as("admin").post(f"/api/v1/rollouts/{rollout.pk}/{action}/").status_code in (200, 202)
    states = dict(Change.objects.filter(rollout=rollout).values_list("cluster__name", "state"))
    if action == "start":
        assert states["speech-prod"] == ChangeState.QUEUED
    else:
        assert set(states.values()) == {ChangeState.CANCELLED}


@pytest.mark.parametrize("action", ["start", "cancel"])
def test_the_rollout_page_and_the_api_let_the_same_people_run_a_rollout(
    clusters, people, other_team, api_as, client, use_replay, action
):
    rollout = across_two_teams(people, other_team)

    def page(who):
        client.force_login(people[who])
        return client.post(reverse("changes:rollout_action", args=[rollout.pk, action]))

    for who in ("viewer", "operator"):
        ui, api = page(who), api_as(who).post(f"/api/v1/rollouts/{rollout.pk}/{action}/")
        assert (ui.status_code, api.status_code) == (403, 403), who
        assert "to run this rollout" in ui.content.decode() and "to run this rollout" in api.json()["detail"][0]
        assert rollouts.may_run(people[who], rollout) is False
    assert page("outsider").status_code == 404
    assert api_as("outsider").post(f"/api/v1/rollouts/{rollout.pk}/{action}/").status_code == 404
    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.PLANNED

    assert rollouts.may_run(people["admin"], rollout)
    assert page("admin").status_code == 302
    assert Rollout.objects.get(pk=rollout.pk).state != Rollout.State.PLANNED


def test_the_rollout_form_and_the_api_let_the_same_people_plan(clusters, people, api_as, client):
    body = {"selection": {"label": "env=dev"}, "preset": "heavy-gpu-model", "reason": "r"}
    for who in ("viewer", "outsider"):
        client.force_login(people[who])
        ui, api = (
            client.get(reverse("changes:rollout_create")),
            api_as(who).post("/api/v1/rollouts/", body, format="json"),
        )
        assert (ui.status_code, api.status_code) == (403, 403), who
        assert "Only operators and admins run rollouts." in ui.content.decode() and api.json()["detail"] == [
            "Only operators and admins run rollouts."
        ]
    client.force_login(people["operator"])
    assert client.get(reverse("changes:rollout_create")).status_code == 200
    assert api_as("operator").post("/api/v1/rollouts/", body, format="json").status_code == 201


def test_a_tick_never_queues_a_change_of_a_rollout_cancelled_meanwhile(clusters, operator):
    rollout = rollouts.plan_rollout(
        operator, selection={"label": "env=prod", "deployment": "Model"}, reason="r", preset=heavy()
    )
    # The tick read the rollout running; `cancel` has marked it cancelled and not yet cancelled its changes.
    Rollout.objects.filter(pk=rollout.pk).update(state=Rollout.State.CANCELLED)

    rollouts._apply_wave(Actor(), rollout, 0)
    rollouts._cancel_planned(rollout)

    assert set(Change.objects.filter(rollout=rollout).values_list("state", flat=True)) == {ChangeState.CANCELLED}
