"""The web UI: pages, htmx fragments, forms, empty and error states, roles."""

from __future__ import annotations

import httpx
import pytest
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster, Reachability
from apps.fleet import sync
from apps.fleet.models import ConfigRevision
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def login(client, people):
    def as_(who: str):
        client.force_login(people[who])
        return client

    return as_


@pytest.fixture
def synced(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team, labels={"env": "prod"})
    sync.sync_cluster(cluster.pk)
    cluster.refresh_from_db()
    return cluster


def test_pages_require_login(client):
    response = client.get(reverse("fleet:overview"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_logging_in_and_out_is_audited(client, people):
    response = client.post(reverse("login"), {"username": "viewer", "password": "pw"})
    assert response.status_code == 302
    client.post(reverse("logout"))
    client.post(reverse("login"), {"username": "viewer", "password": "wrong"})
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["auth.login", "auth.logout", "auth.login_failed"]


def test_an_empty_fleet_invites_an_admin_to_register_a_cluster(login):
    page = login("admin").get(reverse("fleet:overview")).content.decode()
    assert "No clusters yet" in page and reverse("clusters:create") in page


def test_an_empty_fleet_tells_a_viewer_whom_to_ask(login):
    page = login("viewer").get(reverse("fleet:overview")).content.decode()
    assert "Ask a team admin" in page and reverse("clusters:create") not in page


def test_the_fleet_page_lists_clusters_with_counts_and_filters(login, synced, other_team):
    ClusterFactory(name="speech-dev", team=other_team, dashboard_url="http://s.test", labels={"env": "dev"})
    client = login("root")

    page = client.get(reverse("fleet:overview")).content.decode()
    assert "vision-prod" in page and "speech-dev" in page and "env=prod" in page

    filtered = client.get(reverse("fleet:overview") + "?label=env=dev").content.decode()
    assert "speech-dev" in filtered and "vision-prod" not in filtered
    nothing = client.get(reverse("fleet:overview") + "?q=zzz").content.decode()
    assert "No cluster matches these filters" in nothing


def test_the_fleet_rows_are_served_as_an_htmx_fragment(login, synced):
    response = login("viewer").get(reverse("fleet:overview"), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert "<html" not in body and "vision-prod" in body and "<tr>" in body


def test_the_polled_fleet_fragment_keeps_the_filters_it_was_asked_with(login, synced):
    body = login("viewer").get(reverse("fleet:overview") + "?label=env%3Dprod", HTTP_HX_REQUEST="true").content.decode()
    assert body.lstrip().startswith("<tbody")
    assert 'hx-get="/?label=env%3Dprod"' in body


def test_the_fleet_rows_explain_a_label_filter_they_cannot_apply_and_list_nothing(login, synced):
    response = login("viewer").get(reverse("fleet:overview") + "?label=Env%3Dprod", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert "&#x27;Env&#x27; is not a label key: lowercase letters" in body and "vision-prod" not in body


def test_the_cluster_page_shows_applications_and_key_settings(login, synced):
    page = login("viewer").get(reverse("fleet:cluster", args=[synced.pk])).content.decode()
    for text in ("demo", "echo2", "/demo", "Model", "HEALTHY", "1 running", "1 / 2 / 4", "unbounded", "2.60.0"):
        assert text in page, text
    assert "Sync now" not in page and "Delete" not in page


def test_operators_see_sync_and_admins_see_edit(login, synced):
    assert "Sync now" in login("operator").get(reverse("fleet:cluster", args=[synced.pk])).content.decode()
    page = login("admin").get(reverse("fleet:cluster", args=[synced.pk])).content.decode()
    assert "Edit" in page and "Delete" in page


def test_the_cluster_status_fragment_polls_itself(login, synced):
    body = login("viewer").get(reverse("fleet:cluster_status", args=[synced.pk])).content.decode()
    assert 'hx-trigger="every' in body and "<html" not in body and "demo" in body


def test_an_unreachable_cluster_shows_the_reason(login, synced):
    Cluster.objects.filter(pk=synced.pk).update(
        reachability=Reachability.UNREACHABLE, last_error="Cannot reach the Ray dashboard: refused."
    )
    page = login("viewer").get(reverse("fleet:cluster", args=[synced.pk])).content.decode()
    assert "The last sync failed" in page and "Cannot reach the Ray dashboard" in page


def test_outsiders_get_404_for_other_teams_clusters(login, synced):
    assert login("outsider").get(reverse("fleet:cluster", args=[synced.pk])).status_code == 404


def test_the_deployment_page_shows_effective_and_submitted_configs(login, synced):
    model = synced.applications.get(name="demo").deployments.get(name="Model")
    page = login("viewer").get(reverse("fleet:deployment", args=[model.pk])).content.decode()
    assert "Effective config" in page and "graceful_shutdown_timeout_s" in page and "alloc_mb" in page


def test_config_history_lists_revisions_and_shows_a_diff(login, synced, use_replay):
    from tests.conftest import ray_fixture

    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployments"]["Model"]["deployment_config"]["max_ongoing_requests"] = 2
    use_replay.routes["/api/serve/applications/"] = payload
    sync.sync_cluster(synced.pk)
    demo = synced.applications.get(name="demo")
    client = login("viewer")

    history = client.get(reverse("fleet:history", args=[demo.pk])).content.decode()
    assert history.count("/revisions/") == 2
    newest = ConfigRevision.objects.filter(application=demo).first()
    diff = client.get(reverse("fleet:revision", args=[newest.pk])).content.decode()
    assert 'class="diff-del">-      &quot;max_ongoing_requests&quot;: 8,' in diff
    assert 'class="diff-add">+      &quot;max_ongoing_requests&quot;: 2,' in diff


def test_registering_through_the_form_saves_and_redirects(login, use_replay, team):
    response = login("admin").post(
        reverse("clusters:create"),
        {
            "name": "vision-prod",
            "team": str(team.pk),
            "dashboard_url": "http://ray.test:8265",
            "labels": "env=prod, region=eu",
        },
    )
    cluster = Cluster.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("fleet:cluster", args=[cluster.pk])
    assert cluster.labels == {"env": "prod", "region": "eu"}


def test_a_failed_connection_test_keeps_the_form_with_the_reason(login, use_replay, team):
    use_replay.routes["/api/version"] = httpx.ConnectError("refused")
    response = login("admin").post(
        reverse("clusters:create"),
        {"name": "vision-prod", "team": str(team.pk), "dashboard_url": "http://ray.test:8265", "labels": ""},
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "Connection test failed: Cannot reach the Ray dashboard" in page
    assert 'value="vision-prod"' in page
    assert not Cluster.objects.exists()


def test_the_form_explains_bad_input(login, use_replay, team):
    page = (
        login("admin")
        .post(
            reverse("clusters:create"),
            {"name": "Bad Name", "team": str(team.pk), "dashboard_url": "http://u:p@ray.test", "labels": "oops"},
        )
        .content.decode()
    )
    assert "lowercase letters" in page
    assert "Do not put credentials in the URL" in page
    assert "needs the form key=value" in page


def test_viewers_cannot_open_the_register_form(login):
    assert login("viewer").get(reverse("clusters:create")).status_code == 403


def test_admins_edit_labels_and_keep_the_token(login, synced):
    from apps.core import secrets

    Cluster.objects.filter(pk=synced.pk).update(token_ciphertext=secrets.encrypt("keep-me"))
    response = login("admin").post(
        reverse("clusters:edit", args=[synced.pk]),
        {"team": str(synced.team.pk), "dashboard_url": synced.dashboard_url, "labels": "env=staging", "token": ""},
    )
    assert response.status_code == 302
    synced.refresh_from_db()
    assert synced.labels == {"env": "staging"}
    assert secrets.decrypt(synced.token_ciphertext) == "keep-me"


def test_the_form_shows_and_saves_the_prometheus_source(login, synced):
    client = login("admin")
    page = client.get(reverse("clusters:edit", args=[synced.pk])).content.decode()
    assert 'name="prometheus_url"' in page and 'name="prometheus_selector"' in page
    assert "PromQL label matcher" in page
    form = {
        "team": str(synced.team.pk),
        "dashboard_url": synced.dashboard_url,
        "labels": "env=prod",
        "prometheus_url": "http://prom.test:9090/",
        "prometheus_selector": 'cluster="vision-prod"',
    }
    assert client.post(reverse("clusters:edit", args=[synced.pk]), form).status_code == 302
    synced.refresh_from_db()
    assert (synced.prometheus_url, synced.prometheus_selector) == ("http://prom.test:9090", 'cluster="vision-prod"')
    assert (
        'value="cluster=&quot;vision-prod&quot;"'
        in client.get(reverse("clusters:edit", args=[synced.pk])).content.decode()
    )


def test_the_form_refuses_a_selector_the_api_refuses(login, api_as, synced):
    form = {"team": str(synced.team.pk), "dashboard_url": synced.dashboard_url, "prometheus_selector": '{cluster="x"}'}
    page = login("admin").post(reverse("clusters:edit", args=[synced.pk]), form).content.decode()
    api = api_as("admin").patch(
        f"/api/v1/clusters/{synced.pk}/", {"prometheus_selector": '{cluster="x"}'}, format="json"
    )
    assert api.status_code == 400
    assert "without braces" in page and "without braces" in str(api.json()["prometheus_selector"])


def test_the_form_the_api_and_the_services_take_the_same_cluster_fields(people):
    import inspect

    from apps.clusters import services
    from apps.clusters.api import ClusterSerializer
    from apps.clusters.forms import ClusterForm
    from apps.clusters.models import EDITABLE_FIELDS, UPDATABLE_FIELDS

    form = [name for name in ClusterForm(user=people["admin"]).fields if name != "clear_token"]
    writable = [name for name, field in ClusterSerializer().fields.items() if not field.read_only]
    assert form == writable == list(EDITABLE_FIELDS)
    assert set(inspect.signature(services.register_cluster).parameters) - {"actor"} == set(EDITABLE_FIELDS)
    assert set(inspect.signature(services.update_cluster).parameters) - {"actor", "cluster"} == set(UPDATABLE_FIELDS)


def test_deleting_asks_first_then_deletes(login, synced):
    client = login("admin")
    assert "Delete vision-prod?" in client.get(reverse("clusters:delete", args=[synced.pk])).content.decode()
    assert client.post(reverse("clusters:delete", args=[synced.pk])).status_code == 302
    assert not Cluster.objects.exists()


def test_sync_now_from_htmx_returns_the_status_fragment(login, synced):
    response = login("operator").post(reverse("clusters:sync", args=[synced.pk]), HTTP_HX_REQUEST="true", follow=True)
    body = response.content.decode()
    assert 'id="cluster-status"' in body and "syncing" in body


def test_viewers_cannot_sync(login, synced):
    assert login("viewer").post(reverse("clusters:sync", args=[synced.pk])).status_code == 403


def test_health_endpoint_answers(client):
    assert client.get("/healthz").json()["status"] == "ok"
