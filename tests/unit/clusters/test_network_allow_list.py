"""The network allow-list administrators keep in the Django admin: networks and host names that
clusters, metrics, Prometheus, Serve and webhook URLs may point at. Edits apply at once, are
audited, and never open the addresses that are always refused."""

from __future__ import annotations

import socket

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from apps.accounts.models import AuditEvent
from apps.clusters.egress_rules import normalize_rule
from apps.clusters.models import EgressRule
from apps.clusters.network_policy import NetworkPolicy
from apps.clusters.validation import check_network_policy
from integrations import egress

pytestmark = pytest.mark.django_db


def resolving_to(monkeypatch, address: str) -> None:
    def fake(host, port, *args, **kwargs):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr("apps.clusters.validation.socket.getaddrinfo", fake)
    monkeypatch.setattr(egress.socket, "getaddrinfo", fake)


def refused(url: str) -> str:
    with pytest.raises(ValidationError) as caught:
        check_network_policy(url)
    return caught.value.messages[0]


# --- what an entry may be ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "raw", "stored"),
    [
        ("network", "10.20.1.5/16", "10.20.0.0/16"),
        ("network", "10.0.0.7", "10.0.0.7/32"),
        ("network", "FD12:3456::/48", "fd12:3456::/48"),
        ("host", "Ray-Head.Prod.Example.", "ray-head.prod.example"),
        ("host", "*.prod.example", "*.prod.example"),
    ],
)
def test_entries_are_stored_in_canonical_form(kind, raw, stored):
    assert normalize_rule(kind, raw) == stored


@pytest.mark.parametrize(
    ("kind", "raw", "message"),
    [
        ("network", "10.0.0.0/33", "is not a network"),
        ("network", "ray.example", "is not a network"),
        ("network", "0.0.0.0/0", "allows everything"),
        ("host", "10.0.0.7", "That is an address"),
        ("host", "ray_head.example", "is not a host name"),
        ("host", "*.*.example", "is not a host name"),
        ("host", "", "is not a host name"),
    ],
)
def test_a_bad_entry_says_what_is_wrong(kind, raw, message):
    with pytest.raises(ValidationError) as caught:
        normalize_rule(kind, raw)
    assert message in str(caught.value)


# --- what the policy allows --------------------------------------------------------------------


def test_an_empty_list_allows_nothing_and_says_which_entry_would():
    assert NetworkPolicy().refusal("ray.example", "192.168.1.5") == (
        "ray.example resolves to 192.168.1.5, which the network allow-list does not cover, so Fleetdeck did not "
        "call it. To allow it, an administrator adds a network entry 192.168.1.5/32 or a host entry ray.example "
        "(Admin › Network allow-list), or lists the network in FLEETDECK_CLUSTER_NETWORKS."
    )
    assert "never calls" in NetworkPolicy().refusal("ray.example", "169.254.169.254")


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("ray.prod.example", True),
        ("a.b.prod.example", True),
        ("prod.example", False),  # the domain itself is not under it
        ("evilprod.example", False),
        ("ray.staging.example", False),
    ],
)
def test_a_host_rule_allows_names_under_its_domain_wherever_they_resolve(host, allowed):
    policy = NetworkPolicy(hosts=("*.prod.example",))
    assert (policy.refusal(host, "192.168.1.5") is None) is allowed


def test_a_host_rule_never_opens_the_metadata_service():
    policy = NetworkPolicy(hosts=("metadata.google.internal",))
    assert "never calls" in policy.refusal("metadata.google.internal", "169.254.169.254")


def test_rules_added_in_the_admin_apply_at_once_and_removing_them_closes(monkeypatch, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    resolving_to(monkeypatch, "192.168.1.5")
    assert "does not cover" in refused("http://ray.internal:8265")

    EgressRule.objects.create(kind="network", value="10.0.0.0/8")
    assert "a network entry 192.168.1.5/32 or a host entry ray.internal" in refused("http://ray.internal:8265")
    EgressRule.objects.create(kind="host", value="ray.internal")
    assert check_network_policy("http://ray.internal:8265") is None
    assert "does not cover" in refused("http://other.internal:8265")

    EgressRule.objects.all().delete()
    assert "does not cover" in refused("http://ray.internal:8265")


def test_the_environments_networks_and_the_admin_rules_add_up(monkeypatch, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = ["10.0.0.0/8"]
    EgressRule.objects.create(kind="network", value="192.168.0.0/16")
    resolving_to(monkeypatch, "192.168.1.5")
    assert check_network_policy("http://ray.internal:8265") is None
    resolving_to(monkeypatch, "10.1.2.3")
    assert check_network_policy("http://ray.internal:8265") is None
    resolving_to(monkeypatch, "172.16.0.1")
    assert "does not cover" in refused("http://ray.internal:8265")


def test_connections_are_refused_by_the_list_and_read_it_once_per_client(monkeypatch, django_assert_num_queries):
    EgressRule.objects.create(kind="host", value="ray.internal")
    resolving_to(monkeypatch, "192.168.1.5")
    seen = []
    inner = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
    with httpx.Client(transport=egress.PinnedTransport(inner=inner)) as client:
        # Requests may come from worker threads: none of them reads the database.
        with django_assert_num_queries(0):
            assert client.get("http://ray.internal:8265/api/version").status_code == 200
            with pytest.raises(egress.EgressRefused, match="network allow-list"):
                client.get("http://elsewhere.internal:8265/api/version")
    assert [request.url.host for request in seen] == ["192.168.1.5"]


def test_registering_a_cluster_outside_the_list_is_refused_and_nothing_is_created(api_as, monkeypatch):
    EgressRule.objects.create(kind="network", value="10.0.0.0/8")
    resolving_to(monkeypatch, "192.168.1.5")
    response = api_as("admin").post(
        "/api/v1/clusters/",
        {"name": "outside", "team": "vision", "dashboard_url": "http://ray.internal:8265"},
        format="json",
    )
    assert response.status_code == 400 and "network allow-list" in str(response.json())
    assert not api_as("admin").get("/api/v1/clusters/").json()["results"]


# --- who keeps it ------------------------------------------------------------------------------


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_administrator_adds_an_entry_normalized_and_audited(people):
    root = admin_client(people["root"])
    response = root.post(
        "/admin/clusters/egressrule/add/", {"kind": "network", "value": "10.20.1.5/16", "note": "prod GPU VPC"}
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    rule = EgressRule.objects.get()
    assert (rule.value, rule.created_by) == ("10.20.0.0/16", people["root"])
    event = AuditEvent.objects.get(action="egress_rule.add")
    assert (event.actor, event.via, event.changes["value"]) == (people["root"], "admin", "10.20.0.0/16")


def test_a_bad_entry_in_the_admin_is_shown_and_nothing_is_saved(people):
    response = admin_client(people["root"]).post(
        "/admin/clusters/egressrule/add/", {"kind": "host", "value": "10.0.0.7"}
    )
    assert response.status_code == 200 and "That is an address" in response.content.decode()
    assert not EgressRule.objects.exists() and not AuditEvent.objects.filter(action__startswith="egress_rule").exists()


def test_deleting_entries_is_audited_one_by_one(people):
    rules = [EgressRule.objects.create(kind="network", value=v) for v in ("10.0.0.0/8", "192.168.0.0/16")]
    response = admin_client(people["root"]).post(
        "/admin/clusters/egressrule/",
        {"action": "delete_selected", "_selected_action": [r.pk for r in rules], "post": "yes"},
    )
    assert response.status_code == 302
    assert not EgressRule.objects.exists()
    assert sorted(e.changes["value"] for e in AuditEvent.objects.filter(action="egress_rule.delete")) == [
        "10.0.0.0/8",
        "192.168.0.0/16",
    ]


def test_the_empty_list_warns_the_administrator_that_nothing_is_called(people, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    page = admin_client(people["root"]).get("/admin/clusters/egressrule/", follow=True).content.decode()
    assert "The allow-list is empty: Fleetdeck calls no cluster" in page


def test_staff_without_superuser_and_team_admins_cannot_touch_it(people, django_user_model):
    staff = django_user_model.objects.create_user(username="staff", password="pw", is_staff=True)
    for user in (staff, people["admin"]):
        response = admin_client(user).post(
            "/admin/clusters/egressrule/add/", {"kind": "network", "value": "0.0.0.1/32"}
        )
        assert response.status_code in (302, 403), response.status_code
        if response.status_code == 302:
            assert response["Location"].startswith("/admin/login/")
    assert not EgressRule.objects.exists()
