"""Kubernetes connections, discovery, registration and links, against kmock serving KubeRay's
CRD shapes (tests/fixtures/kube). Never a real cluster."""

from __future__ import annotations

import copy

import pytest
import yaml
from django.core.exceptions import ValidationError

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster
from apps.core import secrets
from apps.kubernetes import discovery, services
from apps.kubernetes.models import KubeConnection, KubeLink
from tests.factories import ClusterFactory
from tests.kubeapi import ML, connection, kube  # noqa: F401  (fixture)
from tests.unit.integrations.test_kube_adapter import failure, fixture, forbidden, kubeconfig

pytestmark = pytest.mark.django_db


def serve_kuberay(kube, *, services_=None, clusters=None):
    kube.serve_list(
        f"{ML}/rayservices", "RayService", [fixture("rayservice_vision.json")] if services_ is None else services_
    )
    kube.serve_list(
        f"{ML}/rayclusters",
        "RayCluster",
        [fixture("raycluster_vision.json"), fixture("raycluster_batch.json")] if clusters is None else clusters,
    )


def admin(people) -> Actor:
    return Actor(user=people["admin"])


def test_discovery_offers_rayservices_and_standalone_rayclusters_with_their_dashboard_urls(kube, team):
    serve_kuberay(kube)

    found = discovery.discover(connection(kube, team))

    assert [(f.kind, f.name) for f in found.resources] == [("RayCluster", "batch"), ("RayService", "vision")]
    batch, vision = found.resources
    assert batch.dashboard_url == "http://batch-head-svc.ml.svc:8265" and batch.state == "ready"
    # The RayService's own head service follows its active cluster across upgrades.
    assert vision.dashboard_url == "http://vision-head-svc.ml.svc:8265"
    assert (vision.ray_cluster, vision.applications, vision.state) == (
        "vision-raycluster-7x9kq",
        ("detector", "thumbnails"),
        "Ready",
    )
    assert found.partial is False and found.warnings == [] and found.error == ""
    checked = KubeConnection.objects.get()
    assert checked.last_checked_at is not None and checked.last_error == ""


def test_discovery_pages_through_big_namespaces(kube, team, settings):
    settings.FLEETDECK_KUBE_PAGE_SIZE = 1
    clusters = []
    for index in range(3):
        item = copy.deepcopy(fixture("raycluster_batch.json"))
        item["metadata"]["name"] = f"batch-{index}"
        clusters.append(item)
    serve_kuberay(kube, services_=[], clusters=clusters)

    found = discovery.discover(connection(kube, team))

    assert [f.name for f in found.resources] == ["batch-0", "batch-1", "batch-2"]
    pages = [p for p in kube.list_params if p["path"].endswith("/rayclusters")]
    assert [p.get("limit") for p in pages] == ["1", "1", "1"] and pages[1]["continue"] and found.partial is False


def test_a_cap_on_items_marks_discovery_partial_with_the_reason(kube, team, settings):
    settings.FLEETDECK_KUBE_MAX_ITEMS = 1
    serve_kuberay(kube, services_=[], clusters=[fixture("raycluster_batch.json"), fixture("raycluster_vision.json")])

    found = discovery.discover(connection(kube, team))

    assert found.partial is True and len(found.resources) == 1
    assert "Stopped at 1 rayclusters (the cap)" in found.warnings[0]


def test_a_forbidden_namespace_is_partial_and_named_while_the_others_are_listed(kube, team):
    serve_kuberay(kube)
    for plural in ("rayservices", "rayclusters"):
        kube.kmock[f"get /apis/ray.io/v1/namespaces/finance/{plural}"] << forbidden("list", plural, "ray.io", "finance")

    found = discovery.discover(connection(kube, team, namespaces=("finance", "ml")))

    assert {f.name for f in found.resources} == {"vision", "batch"}
    assert found.partial is True
    assert any("Forbidden to list rayservices.ray.io in namespace finance" in w for w in found.warnings)
    assert KubeConnection.objects.get().last_warnings == found.warnings


def test_missing_kuberay_crds_say_so(kube, team):
    kube.kmock[f"get {ML}/rayservices"] << failure(404, "NotFound", "the server could not find the requested resource")

    found = discovery.discover(connection(kube, team))

    assert found.resources == [] and "KubeRay CRDs are not installed on this cluster" in found.error
    assert "KubeRay CRDs are not installed" in KubeConnection.objects.get().last_error


def test_expired_credentials_say_so(kube, team):
    serve_kuberay(kube)

    found = discovery.discover(connection(kube, team, token="expired-token"))

    assert "missing, expired or revoked" in found.error and found.resources == []


def test_a_connection_stores_its_kubeconfig_encrypted_and_audits_only_that_it_was_set(kube, team, people):
    text = yaml.safe_dump(kubeconfig(kube.url))

    created = services.create_connection(
        admin(people), team=team, name="prod", namespaces="ml, ray-serve", kubeconfig=text, context="ml"
    )

    assert created.namespaces == ["ml", "ray-serve"] and created.read_only is True
    assert "fleetdeck-sa-token" not in created.kubeconfig_ciphertext
    assert secrets.decrypt(created.kubeconfig_ciphertext) == text
    audit = AuditEvent.objects.get(action="kube.connection.create")
    assert audit.changes["kubeconfig"] == "set" and "fleetdeck-sa-token" not in str(audit.changes)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kubeconfig": "clusters: [unclosed"}, "not valid YAML"),
        ({"kubeconfig": "just: text\n"}, "not a kubeconfig"),
        ({"context": "missing"}, "cannot be used"),
        ({"namespaces": "Not_A_Namespace"}, "not a namespace name"),
        ({"namespaces": ""}, "at least one namespace"),
    ],
)
def test_bad_connections_are_refused_with_what_is_wrong(kube, team, people, change, message):
    body = {"kubeconfig": yaml.safe_dump(kubeconfig(kube.url)), "context": "ml", "namespaces": "ml"} | change
    with pytest.raises(ValidationError) as caught:
        services.create_connection(admin(people), team=team, name="prod", **body)
    assert message in str(caught.value)
    assert not KubeConnection.objects.exists()


def test_a_kubeconfig_with_a_credential_plugin_is_refused(kube, team, people):
    config = kubeconfig(kube.url)
    config["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}
    with pytest.raises(ValidationError, match="exec credential plugin"):
        services.create_connection(
            admin(people), team=team, name="prod", namespaces="ml", kubeconfig=yaml.safe_dump(config)
        )


def test_registering_a_discovered_rayservice_makes_a_rayservice_owned_linked_cluster(kube, team, people, use_replay):
    serve_kuberay(kube)
    kube.serve_rayservice(fixture("rayservice_vision.json"))

    cluster = services.register_discovered(
        admin(people),
        connection(kube, team),
        kind="RayService",
        namespace="ml",
        name="vision",
        cluster_name="vision-prod",
    )

    assert cluster.dashboard_url == "http://vision-head-svc.ml.svc:8265"
    assert cluster.serve_config_owner == Cluster.ConfigOwner.RAYSERVICE and cluster.team == team
    link = KubeLink.objects.get()
    assert (link.cluster, link.kind, link.namespace, link.name) == (cluster, "RayService", "ml", "vision")
    # Registration is the ordinary one: the dashboard was connection-tested.
    assert [r.url.path for r in use_replay.requests][:1] == ["/api/version"]
    assert {"cluster.register", "kube.link"} <= set(AuditEvent.objects.values_list("action", flat=True))


@pytest.mark.parametrize("token", ["tökén", "a b"])
def test_registering_refuses_a_token_no_header_can_carry(kube, team, people, use_replay, token):
    kube.serve_rayservice(fixture("rayservice_vision.json"))

    with pytest.raises(ValidationError, match="printable ASCII without spaces"):
        services.register_discovered(
            admin(people),
            connection(kube, team),
            kind="RayService",
            namespace="ml",
            name="vision",
            cluster_name="vision-prod",
            token=token,
        )
    assert not Cluster.objects.exists() and not KubeLink.objects.exists()


def test_a_raycluster_owned_by_a_rayservice_is_not_linked_on_its_own(kube, team, people, use_replay):
    serve_kuberay(kube)

    with pytest.raises(ValidationError, match="belongs to RayService vision"):
        services.register_discovered(
            admin(people),
            connection(kube, team),
            kind="RayCluster",
            namespace="ml",
            name="vision-raycluster-7x9kq",
            cluster_name="vision-prod",
        )
    assert not Cluster.objects.exists()


def test_a_namespace_outside_the_connection_is_refused(kube, team, people, use_replay):
    with pytest.raises(ValidationError, match="not one of connection prod's namespaces"):
        services.register_discovered(
            admin(people),
            connection(kube, team),
            kind="RayCluster",
            namespace="kube-system",
            name="batch",
            cluster_name="batch",
        )


def test_linking_an_existing_cluster_to_a_rayservice_makes_it_rayservice_owned(kube, team, people):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    cluster = ClusterFactory(name="vision-prod", team=team)

    link = services.link_cluster(
        admin(people), connection(kube, team), cluster, kind="RayService", namespace="ml", name="vision"
    )

    cluster.refresh_from_db()
    assert link.resource == "RayService ml/vision" and cluster.serve_config_owner == Cluster.ConfigOwner.RAYSERVICE
    with pytest.raises(ValidationError, match="already linked"):
        services.link_cluster(
            admin(people), KubeConnection.objects.get(), cluster, kind="RayService", namespace="ml", name="vision"
        )


def test_a_connection_links_only_its_own_teams_clusters(kube, team, other_team, people):
    cluster = ClusterFactory(name="speech", team=other_team)
    with pytest.raises(ValidationError, match="belongs to team Vision"):
        services.link_cluster(
            admin(people), connection(kube, team), cluster, kind="RayService", namespace="ml", name="vision"
        )


# --- the API server's address, vetted and pinned ---------------------------------------------


def named_connection(kube, team, server: str) -> KubeConnection:
    text = yaml.safe_dump(kubeconfig(server))
    return KubeConnection.objects.create(
        team=team, name="named", kubeconfig_ciphertext=secrets.encrypt(text), context="ml", namespaces=["ml"]
    )


def resolving(monkeypatch, address: str) -> None:
    import socket

    from integrations import egress

    def fake(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(egress.socket, "getaddrinfo", fake)


def test_the_api_server_is_reached_at_the_address_the_allow_list_vetted(kube, team, monkeypatch):
    from apps.kubernetes.adapters import adapter_for

    serve_kuberay(kube)
    port = kube.url.rsplit(":", 1)[1]
    resolving(monkeypatch, "127.0.0.1")
    conn = named_connection(kube, team, f"http://kube.internal:{port}")
    with adapter_for(conn) as adapter:
        assert adapter._api.configuration.host == f"http://127.0.0.1:{port}"
    assert discovery.discover(conn).error == ""


def test_tls_to_a_pinned_api_server_is_verified_against_its_name(team, monkeypatch, settings):
    from apps.kubernetes.adapters import adapter_for

    settings.FLEETDECK_CLUSTER_NETWORKS = ["10.0.0.0/8"]
    resolving(monkeypatch, "10.1.2.3")
    conn = KubeConnection.objects.create(
        team=team,
        name="tls",
        context="ml",
        namespaces=["ml"],
        kubeconfig_ciphertext=secrets.encrypt(yaml.safe_dump(kubeconfig("https://kube.internal:6443"))),
    )
    with adapter_for(conn) as adapter:
        configuration = adapter._api.configuration
    assert (configuration.host, configuration.tls_server_name) == ("https://10.1.2.3:6443", "kube.internal")


def test_an_api_server_name_that_resolves_to_the_metadata_service_is_never_called(kube, team, monkeypatch):
    serve_kuberay(kube)
    resolving(monkeypatch, "169.254.169.254")
    found = discovery.discover(named_connection(kube, team, "http://kube.internal:6443"))
    assert "an address Fleetdeck never calls" in found.error and found.resources == []
