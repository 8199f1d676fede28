"""The clusters API: roles, registration with its connection test, bad input, secrets, audit."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster, ClusterEvent
from apps.core import secrets
from apps.fleet import sync
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/clusters/"


def register(client, **overrides):
    body = {
        "name": "vision-prod",
        "team": "vision",
        "dashboard_url": "http://ray.test:8265/",
        "labels": {"env": "prod"},
    }
    body.update(overrides)
    return client.post(URL, body, format="json")


@pytest.fixture
def cluster(team, use_replay):
    return ClusterFactory(name="vision-prod", team=team)


# To an outsider the team does not exist: 400, as for a made-up slug, not a 403 that confirms it.
@pytest.mark.parametrize(
    "who, status", [("admin", 201), ("root", 201), ("operator", 403), ("viewer", 403), ("outsider", 400)]
)
def test_only_team_admins_register_clusters(api_as, use_replay, who, status):
    response = register(api_as(who))
    assert response.status_code == status, response.content
    assert Cluster.objects.exists() == (status == 201)


def test_registration_tests_the_connection_and_reports_what_it_found(api_as, use_replay):
    response = register(api_as("admin"), token="s3cret-token")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["ray_version"] == "2.60.0"
    assert body["session_name"].startswith("session_")
    assert body["auth_mode"] == "disabled" and body["dashboard_auth_enabled"] is False
    assert body["dashboard_url"] == "http://ray.test:8265"
    assert body["has_token"] is True and "token" not in body
    assert body["sync_pending"] is True
    paths = [request.url.path for request in use_replay.requests]
    assert paths == ["/api/version", "/api/authentication_mode", "/api/serve/applications/"]
    assert all(request.headers["authorization"] == "Bearer s3cret-token" for request in use_replay.requests)


def test_the_token_is_encrypted_at_rest_and_never_returned(api_as, use_replay):
    register(api_as("admin"), token="s3cret-token")
    cluster = Cluster.objects.get()

    assert "s3cret-token" not in cluster.token_ciphertext
    assert secrets.decrypt(cluster.token_ciphertext) == "s3cret-token"
    for response in (api_as("admin").get(URL), api_as("viewer").get(f"{URL}{cluster.pk}/")):
        assert "s3cret" not in response.content.decode()
    audit = AuditEvent.objects.get(action="cluster.register")
    assert "s3cret" not in str(audit.changes)


def test_registration_is_audited_with_who_and_where(api_as, use_replay):
    register(api_as("admin"), HTTP_X_FORWARDED_FOR="203.0.113.9")
    event = AuditEvent.objects.get(action="cluster.register")
    assert event.actor_name == "admin" and event.via == "api"
    assert event.object_repr == "vision-prod"
    assert event.team.slug == "vision"
    assert ClusterEvent.objects.filter(kind=ClusterEvent.Kind.REGISTERED).count() == 1


@pytest.mark.parametrize(
    "url, message",
    [
        ("ftp://ray.test:8265", "http:// or https://"),
        ("http://admin:pw@ray.test:8265", "credentials"),
        ("http://ray.test:8265/?x=1", "query string"),
        ("not a url", "http:// or https://"),
        ("http://ray.test:99999", "invalid port"),
    ],
)
def test_malformed_urls_are_refused_with_a_reason_and_nothing_is_saved(api_as, use_replay, url, message):
    response = register(api_as("admin"), dashboard_url=url)
    assert response.status_code == 400
    assert message in str(response.json()["dashboard_url"])
    assert not Cluster.objects.exists() and not AuditEvent.objects.filter(action="cluster.register").exists()
    assert use_replay.requests == []


@pytest.mark.parametrize(
    "route, message",
    [
        (httpx.ConnectError("refused"), "Cannot reach the Ray dashboard"),
        (httpx.ReadTimeout("slow"), "did not answer /api/version in time"),
        (httpx.Response(200, html="<html><body>Welcome to nginx</body></html>"), "did not answer JSON"),
        (httpx.Response(500, text="Internal Server Error"), "HTTP 500"),
        (httpx.Response(200, json={"hello": "world"}), "does not look like a Ray dashboard"),
    ],
)
def test_a_dashboard_that_fails_its_connection_test_is_not_registered(api_as, use_replay, route, message):
    use_replay.routes["/api/version"] = route

    response = register(api_as("admin"))

    assert response.status_code == 400
    assert message in str(response.json()["dashboard_url"])
    assert not Cluster.objects.exists()


def test_a_refused_token_is_reported_on_the_token_field(api_as, use_replay):
    use_replay.routes["/api/version"] = httpx.Response(401, text="Unauthorized")
    response = register(api_as("admin"), token="wrong")
    assert response.status_code == 400
    assert "token" in response.json()
    assert "token authentication" in str(response.json()["token"])


def test_bad_labels_and_names_are_refused(api_as, use_replay):
    assert register(api_as("admin"), labels={"Env": "prod"}).status_code == 400
    assert register(api_as("admin"), labels=["env=prod"]).status_code == 400
    assert register(api_as("admin"), name="Vision_Prod").status_code == 400
    assert not Cluster.objects.exists()


def test_a_duplicate_name_is_refused(api_as, use_replay, cluster):
    response = register(api_as("admin"))
    assert response.status_code == 400 and "name" in response.json()


def test_an_oversized_body_is_refused(api_as, use_replay, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    # Valid in every field: only its size (an unknown key, which the API otherwise ignores) is wrong.
    response = register(api_as("admin"), padding="x" * 4096)
    assert response.status_code == 413, response.content
    assert "too large" in response.json()["detail"][0] and not Cluster.objects.exists()
    assert register(api_as("admin"), padding="x" * 1024).status_code == 201


def test_a_broker_that_refuses_the_message_delays_the_first_sync_and_fails_nothing(
    api_as, use_replay, monkeypatch, django_capture_on_commit_callbacks
):
    from kombu.exceptions import OperationalError

    from controlplane.celery import app

    def refused(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", refused)
    with django_capture_on_commit_callbacks(execute=True):
        response = register(api_as("admin"))
    assert response.status_code == 201, response.content
    cluster = Cluster.objects.get()
    assert sync.claim_due_clusters() == [cluster.pk]  # the tick's pass: next one in a full interval
    assert sync.claim_due_clusters() == []

    with django_capture_on_commit_callbacks(execute=True):
        assert api_as("operator").post(f"{URL}{cluster.pk}/sync/").status_code == 202
    # The sync asked for and refused is due at once, not at the next interval.
    assert sync.claim_due_clusters() == [cluster.pk]


def test_viewers_read_clusters_of_their_team_and_outsiders_see_nothing(api_as, cluster, other_team):
    ClusterFactory(name="speech-prod", team=other_team, dashboard_url="http://speech.test:8265")

    assert [c["name"] for c in api_as("viewer").get(URL).json()["results"]] == ["vision-prod"]
    assert api_as("outsider").get(URL).json()["results"] == []
    assert api_as("outsider").get(f"{URL}{cluster.pk}/").status_code == 404
    assert len(api_as("root").get(URL).json()["results"]) == 2


@pytest.mark.parametrize("who, status", [("admin", 200), ("operator", 403), ("viewer", 403)])
def test_only_admins_change_a_cluster(api_as, cluster, who, status):
    response = api_as(who).patch(f"{URL}{cluster.pk}/", {"labels": {"tier": "gold"}}, format="json")
    assert response.status_code == status
    cluster.refresh_from_db()
    assert (cluster.labels == {"tier": "gold"}) == (status == 200)


def test_changing_the_url_runs_the_connection_test_again(api_as, cluster, use_replay):
    use_replay.routes["/api/version"] = httpx.ConnectError("refused")
    response = api_as("admin").patch(f"{URL}{cluster.pk}/", {"dashboard_url": "http://ray2.test:8265"}, format="json")
    assert response.status_code == 400
    cluster.refresh_from_db()
    assert cluster.dashboard_url == "http://ray.test:8265"


def test_the_name_cannot_be_changed(api_as, cluster):
    api_as("admin").patch(f"{URL}{cluster.pk}/", {"name": "renamed"}, format="json")
    cluster.refresh_from_db()
    assert cluster.name == "vision-prod"


@pytest.mark.parametrize("who, status", [("admin", 204), ("operator", 403), ("viewer", 403), ("outsider", 404)])
def test_only_admins_delete_a_cluster(api_as, cluster, who, status):
    assert api_as(who).delete(f"{URL}{cluster.pk}/").status_code == status
    assert Cluster.objects.exists() == (status != 204)
    assert AuditEvent.objects.filter(action="cluster.delete").exists() == (status == 204)


@pytest.mark.parametrize("who, status", [("admin", 202), ("operator", 202), ("viewer", 403)])
def test_operators_queue_a_sync_and_get_202(api_as, cluster, who, status):
    response = api_as(who).post(f"{URL}{cluster.pk}/sync/")
    assert response.status_code == status
    if status == 202:
        assert response.json()["sync_pending"] is True
        assert AuditEvent.objects.filter(action="cluster.sync_requested").count() == 1


def test_events_are_listed_newest_first(api_as, cluster):
    ClusterEvent.objects.create(cluster=cluster, kind=ClusterEvent.Kind.REGISTERED)
    ClusterEvent.objects.create(cluster=cluster, kind=ClusterEvent.Kind.SESSION_CHANGED, message="new session")
    kinds = [e["kind"] for e in api_as("viewer").get(f"{URL}{cluster.pk}/events/").json()["results"]]
    assert kinds == ["session_changed", "registered"]


def test_clusters_filter_by_team_label_and_health(api_as, team, other_team):
    ClusterFactory(name="a", team=team, labels={"env": "prod"}, reachability="ok")
    ClusterFactory(name="b", team=team, labels={"env": "dev"}, dashboard_url="http://b.test:8265")
    ClusterFactory(name="c", team=other_team, labels={"env": "prod"})
    root = api_as("root")

    def names(query):
        return [c["name"] for c in root.get(URL + query).json()["results"]]

    assert names("?label=env=prod") == ["a", "c"]
    assert names("?label=env") == ["a", "b", "c"]
    assert names("?team=vision") == ["a", "b"]
    assert names("?reachability=ok") == ["a"]
    assert names("?q=b.test") == ["b"]


@pytest.fixture
def labelled(team):
    ClusterFactory(name="a", team=team, labels={"env": "prod"})
    ClusterFactory(name="b", team=team, labels={"env": "dev"}, dashboard_url="http://b.test:8265")
    odd = {"x__isnull": "true", "regex": "prod", "2024": "q"}
    ClusterFactory(name="odd", team=team, labels=odd, dashboard_url="http://odd.test:8265")


def labelled_names(api_as, selector: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = api_as("viewer").get(URL, {"label": selector})
    assert response.status_code == 200, response.content
    assert not any("REGEXP" in query["sql"] for query in queries.captured_queries)
    return [c["name"] for c in response.json()["results"]]


@pytest.mark.parametrize(
    "selector, names",
    [
        ("env=prod", ["a"]),
        ("env", ["a", "b"]),
        ("x__isnull=true", ["odd"]),
        ("x__isnull", ["odd"]),
        ("env__contains=p", []),
        ("regex=prod", ["odd"]),
        ("regex=^(.+)+#$", []),
        ("2024=q", ["odd"]),
    ],
)
def test_a_label_filter_matches_its_key_literally_whatever_lookup_the_key_spells(api_as, labelled, selector, names):
    assert labelled_names(api_as, selector) == names


@pytest.mark.parametrize("selector", ["Env=prod", "=prod", "-env", "env name=x", "env'=x", "a" * 64])
def test_a_label_filter_whose_key_is_no_label_key_is_a_400_naming_the_parameter(api_as, labelled, selector):
    response = api_as("viewer").get(URL, {"label": selector})
    assert response.status_code == 400
    (message,) = response.json()["label"]
    assert "is not a label key: lowercase letters, digits" in message


def test_the_cluster_list_is_paginated_and_costs_constant_queries(api_as, team):
    ClusterFactory.create_batch(60, team=team)
    client = api_as("admin")
    with CaptureQueriesContext(connection) as queries:
        body = client.get(URL).json()
    assert body["count"] == 60 and len(body["results"]) == 50 and body["next"]
    assert len(queries.captured_queries) <= 6


def test_inventory_endpoints_list_what_a_sync_saw(api_as, cluster):
    sync.sync_cluster(cluster.pk)
    viewer = api_as("viewer")

    apps = viewer.get(f"/api/v1/applications/?cluster={cluster.pk}").json()["results"]
    assert [a["name"] for a in apps] == ["demo", "echo2"]
    deps = viewer.get(f"/api/v1/deployments/?cluster={cluster.pk}").json()["results"]
    assert {(d["application_name"], d["name"]) for d in deps} == {
        ("demo", "Echo"),
        ("demo", "Model"),
        ("echo2", "Echo"),
    }
    model = next(d for d in deps if d["name"] == "Model")
    assert model["max_ongoing_requests"] == 8 and model["replica_states"] == {"RUNNING": 1}
    revisions = viewer.get(f"/api/v1/config-revisions/?cluster={cluster.pk}").json()["results"]
    assert len(revisions) == 2
    diff = viewer.get(f"/api/v1/config-revisions/{revisions[0]['id']}/diff/").json()
    assert diff["from_revision"] is None and diff["diff"][0].startswith("--- nothing")
    assert api_as("outsider").get("/api/v1/deployments/").json()["results"] == []


def test_the_config_revision_diff_shows_what_changed(api_as, cluster, use_replay):
    from tests.conftest import ray_fixture

    sync.sync_cluster(cluster.pk)
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployments"]["Model"]["deployment_config"]["max_ongoing_requests"] = 2
    use_replay.routes["/api/serve/applications/"] = payload
    sync.sync_cluster(cluster.pk)
    viewer = api_as("viewer")
    newest = viewer.get(f"/api/v1/config-revisions/?cluster={cluster.pk}").json()["results"][0]

    diff = viewer.get(f"/api/v1/config-revisions/{newest['id']}/diff/").json()["diff"]

    assert any(line.strip() == '-      "max_ongoing_requests": 8,' for line in diff)
    assert any(line.strip() == '+      "max_ongoing_requests": 2,' for line in diff)


def test_the_api_refuses_anonymous_requests_and_accepts_tokens(client, people):
    from rest_framework.authtoken.models import Token

    assert client.get(URL).status_code in (401, 403)
    token = Token.objects.create(user=people["viewer"])
    assert client.get(URL, HTTP_AUTHORIZATION=f"Token {token.key}").status_code == 200


def test_the_openapi_schema_documents_every_endpoint(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/api/v1/clusters/",
        "/api/v1/clusters/{id}/",
        "/api/v1/clusters/{id}/sync/",
        "/api/v1/applications/",
        "/api/v1/deployments/",
        "/api/v1/config-revisions/",
        "/api/v1/config-revisions/{id}/diff/",
        "/api/v1/audit-events/",
    ):
        assert path in paths, path
    assert client.get("/api/docs/").status_code == 200


def test_metrics_and_serve_urls_are_validated_like_the_dashboard_url(api_as, use_replay):
    response = register(api_as("admin"), metrics_url="http://u:p@ray.test:8080/metrics")
    assert response.status_code == 400 and "credentials" in str(response.json()["metrics_url"])
    ok = register(api_as("admin"), metrics_url="http://ray.test:8080/metrics", serve_url="http://ray.test:8000/")
    assert ok.status_code == 201, ok.content
    assert (ok.json()["metrics_url"], ok.json()["serve_url"]) == (
        "http://ray.test:8080/metrics",
        "http://ray.test:8000",
    )
