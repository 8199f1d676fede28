"""One team's admin against another team's cluster, through the API as an attacker would try it.

Real HTTP servers on loopback stand in for Ray dashboards, and for the attacker's own server: each
records every request and header it receives, so "nothing was sent" is checked where it counts."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from apps.accounts.models import AuditEvent, Membership, Role
from apps.clusters.models import Cluster, DashboardEndpoint, EgressRule
from apps.core import secrets
from apps.kubernetes.models import KubeConnection, KubeLink
from integrations import egress

pytestmark = pytest.mark.django_db

URL = "/api/v2/clusters/"
SERVE = {"applications": {}, "controller_info": {}, "proxy_location": "HeadOnly", "http_options": {}}


class Dashboard:
    """A loopback server answering the three reads of a connection test like Ray 2.60, or with
    `page` (an internal service's answer) on every path. Keeps what it was sent."""

    def __init__(self, page: bytes | None = None):
        self.requests: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                kind, body = "text/html", page
                if page is None:
                    kind, body = "application/json", json.dumps(outer.answer(self.path)).encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str) -> dict:
        if path.startswith("/api/version"):
            return {"ray_version": "2.60.0", "ray_commit": "abc", "version": "4", "session_name": "session_x"}
        if path.startswith("/api/authentication_mode"):
            return {"authentication_mode": "disabled"}
        return SERVE

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}"

    @property
    def authorizations(self) -> list[str]:
        return [headers.get("authorization", "") for _, headers in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[callable]:
    started: list[Dashboard] = []

    def start(page: bytes | None = None) -> Dashboard:
        started.append(Dashboard(page))
        return started[-1]

    yield start
    for server in started:
        server.close()


@pytest.fixture
def rival(other_team, django_user_model, api_as):
    """The admin of the other team, Speech, signed in to the API."""
    user = django_user_model.objects.create_user(username="speech-admin", password="pw")
    Membership.objects.create(user=user, team=other_team, role=Role.ADMIN)
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


def register(client, team: str, name: str, url: str, **extra):
    return client.post(URL, {"name": name, "team": team, "dashboard_url": url, **extra}, format="json")


# --- a dashboard belongs to one team ----------------------------------------------------------


@pytest.mark.parametrize("spelling", ["127.0.0.1", "localhost", "127.0.0.1:{port}/"])
def test_a_dashboard_another_team_registered_is_refused_with_a_409_naming_nothing_of_theirs(
    api_as, rival, servers, spelling
):
    theirs = servers()
    assert register(rival, "speech", "speech-prod", theirs.url()).status_code == 201
    seen = len(theirs.requests)

    host = spelling.format(port=theirs.port) if "{port}" in spelling else f"{spelling}:{theirs.port}"
    response = register(api_as("admin"), "vision", "stolen", f"http://{host}")

    assert response.status_code == 409, response.content
    text = response.content.decode()
    assert "already registered" in text and "administrator" in text
    assert "speech" not in text.lower() and "Speech" not in text
    assert list(Cluster.objects.values_list("name", flat=True)) == ["speech-prod"]
    assert len(theirs.requests) == seen, "the attacker's registration reached the other team's dashboard"
    assert not AuditEvent.objects.filter(action="cluster.register", team__slug="vision").exists()


def test_an_ip_literal_for_a_name_another_team_registered_is_refused(api_as, rival, servers):
    theirs = servers()
    assert register(rival, "speech", "speech-prod", theirs.url("localhost")).status_code == 201
    assert register(api_as("admin"), "vision", "stolen", theirs.url()).status_code == 409


def test_the_legitimate_registration_of_an_unclaimed_dashboard_still_works(api_as, rival, servers):
    theirs, ours = servers(), servers()
    assert register(rival, "speech", "speech-prod", theirs.url()).status_code == 201
    response = register(api_as("admin"), "vision", "vision-prod", ours.url())
    assert response.status_code == 201, response.content
    assert DashboardEndpoint.objects.filter(cluster__name="vision-prod", address=f"127.0.0.1:{ours.port}").exists()


def test_one_dashboard_twice_in_one_team_is_refused_naming_the_teams_own_cluster(api_as, servers):
    ours = servers()
    assert register(api_as("admin"), "vision", "vision-prod", ours.url()).status_code == 201
    response = register(api_as("admin"), "vision", "vision-again", ours.url("localhost"))
    assert response.status_code == 409
    assert "already registered as cluster 'vision-prod'" in response.content.decode()


def test_moving_a_clusters_url_onto_another_teams_dashboard_is_refused(api_as, rival, servers):
    theirs, ours = servers(), servers()
    assert register(rival, "speech", "speech-prod", theirs.url()).status_code == 201
    mine = register(api_as("admin"), "vision", "vision-prod", ours.url()).json()
    seen = len(theirs.requests)

    response = api_as("admin").patch(f"{URL}{mine['id']}/", {"dashboard_url": theirs.url()}, format="json")

    assert response.status_code == 409 and "speech" not in response.content.decode().lower()
    assert Cluster.objects.get(pk=mine["id"]).dashboard_url == ours.url()
    assert len(theirs.requests) == seen


def test_a_deleted_cluster_releases_its_dashboard(api_as, rival, servers):
    theirs = servers()
    registered = register(rival, "speech", "speech-prod", theirs.url()).json()
    assert rival.delete(f"{URL}{registered['id']}/").status_code == 204
    assert register(api_as("admin"), "vision", "vision-prod", theirs.url()).status_code == 201


# --- the stored token never follows a URL -----------------------------------------------------


def test_a_new_url_origin_needs_the_token_again_and_the_stored_one_is_never_sent_there(api_as, servers):
    dashboard, attacker = servers(), servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url(), token="b-secret-token")
    assert created.status_code == 201 and dashboard.authorizations == ["Bearer b-secret-token"] * 3

    response = api_as("admin").patch(f"{URL}{created.json()['id']}/", {"dashboard_url": attacker.url()}, format="json")

    assert response.status_code == 400
    assert "give its token again" in str(response.json()["token"])
    assert attacker.requests == []
    cluster = Cluster.objects.get()
    assert cluster.dashboard_url == dashboard.url() and secrets.decrypt(cluster.token_ciphertext) == "b-secret-token"


def test_a_new_url_with_a_token_given_sends_only_that_token(api_as, servers):
    dashboard, moved = servers(), servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url(), token="b-secret-token")

    response = api_as("admin").patch(
        f"{URL}{created.json()['id']}/", {"dashboard_url": moved.url(), "token": "new-token"}, format="json"
    )

    assert response.status_code == 200, response.content
    assert moved.authorizations == ["Bearer new-token"] * 3
    assert secrets.decrypt(Cluster.objects.get().token_ciphertext) == "new-token"


def test_a_new_url_on_the_same_origin_keeps_the_token(api_as, servers):
    dashboard = servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url(), token="b-secret-token")
    response = api_as("admin").patch(
        f"{URL}{created.json()['id']}/", {"dashboard_url": dashboard.url("127.0.0.1") + "/"}, format="json"
    )
    assert response.status_code == 200
    # The same scheme, host and port: the same server, which already had the token.
    response = api_as("admin").patch(f"{URL}{created.json()['id']}/", {"labels": {"env": "prod"}}, format="json")
    assert response.status_code == 200 and secrets.decrypt(Cluster.objects.get().token_ciphertext) == "b-secret-token"


def test_a_url_origin_change_without_a_stored_token_needs_nothing(api_as, servers):
    dashboard, moved = servers(), servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url())
    response = api_as("admin").patch(f"{URL}{created.json()['id']}/", {"dashboard_url": moved.url()}, format="json")
    assert response.status_code == 200, response.content
    assert moved.authorizations == [""] * 3


# --- nothing is echoed, nothing outside the allow-list is called ------------------------------


def test_a_url_that_is_not_a_dashboard_is_refused_without_echoing_its_answer(api_as, servers):
    internal = servers(page=b"<html>internal admin panel, password hunter2</html>")
    response = register(api_as("admin"), "vision", "probe", internal.url())
    assert response.status_code == 400
    text = response.content.decode()
    assert "did not answer JSON" in text and "not shown" in text
    assert "hunter2" not in text and "internal admin panel" not in text


def test_with_nothing_listed_no_destination_is_called_and_the_refusal_names_the_entry(api_as, servers, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    dashboard = servers()
    response = register(api_as("admin"), "vision", "vision-prod", dashboard.url())
    assert response.status_code == 400
    assert "an administrator adds a network entry 127.0.0.1/32" in str(response.json()["dashboard_url"])
    assert dashboard.requests == [] and not Cluster.objects.exists()


# --- allow-list entries of one team -----------------------------------------------------------


def resolving(monkeypatch, address: str) -> None:
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host in ("127.0.0.1", "localhost", "::1"):
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    monkeypatch.setattr(egress.socket, "getaddrinfo", fake)


def test_a_team_with_entries_of_its_own_registers_only_inside_them(api_as, rival, servers, other_team, team):
    EgressRule.objects.create(kind="network", value="10.20.0.0/16", team=team)
    dashboard = servers()

    # Loopback is allowed for every team by the environment, but Vision has its own list now.
    response = register(api_as("admin"), "vision", "vision-prod", dashboard.url())
    assert response.status_code == 400
    message = str(response.json()["dashboard_url"])
    assert "Vision's network allow-list does not cover" in message and "for Vision" in message
    # Speech has no entries of its own: the entries for every team still apply to it.
    assert register(rival, "speech", "speech-prod", dashboard.url()).status_code == 201
    assert dashboard.requests and all(path.startswith("/api/") for path, _ in dashboard.requests)


def test_another_teams_private_entry_opens_nothing_for_this_team(api_as, rival, monkeypatch, other_team, team):
    EgressRule.objects.create(kind="network", value="10.20.0.0/16", team=other_team)
    resolving(monkeypatch, "10.20.3.4")
    response = register(api_as("admin"), "vision", "vision-prod", "http://ray.speech.internal:8265")
    assert response.status_code == 400 and "does not cover" in str(response.json()["dashboard_url"])
    assert not Cluster.objects.exists()


def test_moving_a_cluster_checks_its_urls_against_the_new_teams_list(api_as, servers, other_team, people):
    dashboard = servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url()).json()
    EgressRule.objects.create(kind="network", value="10.20.0.0/16", team=other_team)
    response = api_as("root").patch(f"{URL}{created['id']}/", {"team": "speech"}, format="json")
    assert response.status_code == 400 and "Speech's network allow-list" in response.content.decode()
    assert Cluster.objects.get().team.slug == "vision"


# --- a moved cluster leaves the old team's Kubernetes link behind ------------------------------


def test_a_cluster_moved_to_another_team_loses_the_old_teams_kubernetes_link(api_as, servers, team, other_team):
    dashboard = servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url()).json()
    connection = KubeConnection.objects.create(team=team, name="vision-k8s", namespaces=["serve"], in_cluster=True)
    KubeLink.objects.create(
        cluster_id=created["id"], connection=connection, kind=KubeLink.Kind.RAYCLUSTER, namespace="serve", name="rc"
    )

    response = api_as("root").patch(f"{URL}{created['id']}/", {"team": "speech"}, format="json")

    assert response.status_code == 200, response.content
    assert not KubeLink.objects.exists()
    assert AuditEvent.objects.filter(action="kube.unlink", object_id=str(created["id"])).exists()


def test_a_link_through_the_new_teams_own_connection_survives_a_move(api_as, servers, team, other_team):
    dashboard = servers()
    created = register(api_as("admin"), "vision", "vision-prod", dashboard.url()).json()
    connection = KubeConnection.objects.create(team=other_team, name="speech-k8s", namespaces=["serve"])
    KubeLink.objects.create(
        cluster_id=created["id"], connection=connection, kind=KubeLink.Kind.RAYCLUSTER, namespace="serve", name="rc"
    )
    assert api_as("root").patch(f"{URL}{created['id']}/", {"team": "speech"}, format="json").status_code == 200
    assert KubeLink.objects.filter(connection=connection).exists()
