"""The Kubernetes API: /api/v1/kube/connections/ (with discovery, register and link) and
/api/v1/kube/links/, by role; the kubeconfig never comes back."""

from __future__ import annotations

import pytest
import yaml

from apps.accounts.models import AuditEvent
from apps.clusters.models import Cluster, EgressRule
from apps.kubernetes.models import KubeConnection, KubeLink
from tests.factories import ClusterFactory, KubeLinkFactory
from tests.kubeapi import ML, connection, kube  # noqa: F401  (fixture)
from tests.unit.integrations.test_kube_adapter import TOKEN, fixture, kubeconfig
from tests.yaml_aliases import alias_bomb, written_out

pytestmark = pytest.mark.django_db
URL = "/api/v1/kube/connections/"
LINKS = "/api/v1/kube/links/"
# Loopback passes the network policy without resolving a name; creating a connection calls nothing.
OFFLINE = yaml.safe_dump(kubeconfig("https://127.0.0.1:6443"))


def create(client, **overrides):
    body = {"name": "prod", "team": "vision", "kubeconfig": OFFLINE, "context": "ml", "namespaces": ["ml"]} | overrides
    return client.post(URL, body, format="json")


# An outsider naming the team gets what naming an unknown team gets: its existence is not confirmed.
@pytest.mark.parametrize(
    "who, status", [("admin", 201), ("root", 201), ("operator", 403), ("viewer", 403), ("outsider", 400)]
)
def test_only_team_admins_add_connections(api_as, who, status):
    response = create(api_as(who))
    assert response.status_code == status, response.content
    assert KubeConnection.objects.exists() == (status == 201)


def test_the_kubeconfig_is_never_returned_and_the_audit_masks_it(api_as):
    body = create(api_as("admin")).json()
    assert "kubeconfig" not in body and body["has_kubeconfig"] is True and body["read_only"] is True
    for response in (api_as("viewer").get(URL), api_as("admin").get(f"{URL}{body['id']}/")):
        assert TOKEN not in response.content.decode()
    assert TOKEN not in str(AuditEvent.objects.get(action="kube.connection.create").changes)


def test_a_bad_kubeconfig_is_a_400_that_says_why(api_as):
    response = create(api_as("admin"), kubeconfig="clusters: [")
    assert response.status_code == 400 and "not valid YAML" in str(response.json())
    response = create(api_as("admin"), namespaces=["Bad_Name"])
    assert response.status_code == 400 and "not a namespace name" in str(response.json())


def test_a_kubeconfig_whose_api_server_is_outside_the_teams_own_entries_is_refused(api_as, team, other_team):
    # Loopback is allowed for every team by the environment; a team with entries of its own has only those.
    EgressRule.objects.create(kind="network", value="10.20.0.0/16", team=team)
    response = create(api_as("admin"))
    assert response.status_code == 400 and "Vision's network allow-list does not cover" in str(response.json())
    assert not KubeConnection.objects.exists()
    # The same entry, another team's: it neither opens nor closes anything for Vision.
    EgressRule.objects.get(team=team).delete()
    EgressRule.objects.create(kind="network", value="10.20.0.0/16", team=other_team)
    assert create(api_as("admin")).status_code == 201


def test_a_kubeconfig_with_yaml_aliases_is_a_400_that_says_why_and_nothing_is_stored(api_as):
    response = create(api_as("admin"), kubeconfig=f"{OFFLINE}preferences: {alias_bomb()}\n")
    assert response.status_code == 400
    assert "The kubeconfig is not valid YAML: YAML anchors and aliases" in str(response.json())
    assert not KubeConnection.objects.exists()


def test_the_same_kubeconfig_written_out_without_aliases_is_stored(api_as):
    response = create(api_as("admin"), kubeconfig=f"{OFFLINE}preferences: {written_out()}\n")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("who, count", [("viewer", 1), ("operator", 1), ("admin", 1), ("outsider", 0)])
def test_team_members_see_connections_and_outsiders_do_not(api_as, team, who, count):
    KubeConnection.objects.create(team=team, name="prod", namespaces=["ml"])
    assert api_as(who).get(URL).json()["count"] == count


@pytest.mark.parametrize("who, status", [("admin", 200), ("operator", 403), ("viewer", 403), ("outsider", 404)])
def test_only_admins_allow_rayservice_writes(api_as, team, who, status):
    created = KubeConnection.objects.create(team=team, name="prod", namespaces=["ml"])
    response = api_as(who).patch(f"{URL}{created.pk}/", {"read_only": False}, format="json")
    assert response.status_code == status
    created.refresh_from_db()
    assert created.read_only is (status != 200)
    if status == 200:
        assert AuditEvent.objects.get(action="kube.connection.update").changes == {
            "read_only": {"from": True, "to": False}
        }


@pytest.mark.parametrize("who, status", [("viewer", 200), ("outsider", 404)])
def test_discovery_is_for_team_members(api_as, kube, team, who, status):
    kube.serve_list(f"{ML}/rayservices", "RayService", [fixture("rayservice_vision.json")])
    kube.serve_list(f"{ML}/rayclusters", "RayCluster", [fixture("raycluster_batch.json")])
    created = connection(kube, team)

    response = api_as(who).get(f"{URL}{created.pk}/discovery/")

    assert response.status_code == status
    if status == 200:
        body = response.json()
        assert [(r["kind"], r["name"]) for r in body["resources"]] == [
            ("RayCluster", "batch"),
            ("RayService", "vision"),
        ]
        assert body["partial"] is False and body["error"] == ""


def test_discovery_reports_missing_crds_as_an_error(api_as, kube, team):
    from tests.unit.integrations.test_kube_adapter import failure

    kube.kmock[f"get {ML}/rayservices"] << failure(404, "NotFound", "the server could not find the requested resource")
    body = api_as("viewer").get(f"{URL}{connection(kube, team).pk}/discovery/").json()
    assert body["resources"] == [] and "KubeRay CRDs are not installed" in body["error"]


@pytest.mark.parametrize("who, status", [("admin", 201), ("operator", 403), ("viewer", 403)])
def test_only_admins_register_discovered_resources(api_as, kube, team, use_replay, who, status):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    created = connection(kube, team)

    response = api_as(who).post(
        f"{URL}{created.pk}/register/",
        {"kind": "RayService", "namespace": "ml", "name": "vision", "cluster_name": "vision-prod"},
        format="json",
    )

    assert response.status_code == status, response.content
    if status == 201:
        assert response.json()["serve_config_owner"] == "rayservice"
        assert response.json()["dashboard_url"] == "http://vision-head-svc.ml.svc:8265"
        assert KubeLink.objects.get().cluster.name == "vision-prod"


def test_register_refuses_a_taken_cluster_name_and_a_resource_that_is_gone(api_as, kube, team, use_replay):
    from tests.unit.integrations.test_kube_adapter import failure

    kube.kmock[f"get {ML}/rayservices/gone"] << failure(
        404, "NotFound", 'rayservices.ray.io "gone" not found', name="gone"
    )
    ClusterFactory(name="taken", team=team)
    created = connection(kube, team)
    body = {"kind": "RayService", "namespace": "ml", "name": "gone"}

    taken = api_as("admin").post(f"{URL}{created.pk}/register/", body | {"cluster_name": "taken"}, format="json")
    gone = api_as("admin").post(f"{URL}{created.pk}/register/", body | {"cluster_name": "fresh"}, format="json")

    assert taken.status_code == 400 and "already registered" in str(taken.json())
    assert gone.status_code == 400 and "RayService ml/gone does not exist" in str(gone.json())


@pytest.mark.parametrize("token", ["tökén", "a b"])
def test_register_refuses_a_token_no_header_can_carry(api_as, kube, team, use_replay, token):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    created = connection(kube, team)

    response = api_as("admin").post(
        f"{URL}{created.pk}/register/",
        {"kind": "RayService", "namespace": "ml", "name": "vision", "cluster_name": "vision-prod", "token": token},
        format="json",
    )

    assert response.status_code == 400, response.content
    assert response.json()["token"] == ["The token must be printable ASCII without spaces, as Ray issues it."]
    assert not Cluster.objects.exists() and not KubeLink.objects.exists()


@pytest.mark.parametrize("who, status", [("admin", 201), ("operator", 403)])
def test_only_admins_link_clusters(api_as, kube, team, who, status):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    cluster = ClusterFactory(name="vision-prod", team=team)
    created = connection(kube, team)

    response = api_as(who).post(
        f"{URL}{created.pk}/link/",
        {"cluster": cluster.pk, "kind": "RayService", "namespace": "ml", "name": "vision"},
        format="json",
    )

    assert response.status_code == status, response.content
    if status == 201:
        assert response.json()["kind"] == "RayService" and response.json()["cluster_name"] == "vision-prod"


def test_another_teams_cluster_cannot_be_named_for_a_link(api_as, kube, team, other_team):
    cluster = ClusterFactory(name="speech", team=other_team)
    response = api_as("admin").post(
        f"{URL}{connection(kube, team).pk}/link/",
        {"cluster": cluster.pk, "kind": "RayService", "namespace": "ml", "name": "vision"},
        format="json",
    )
    unknown = api_as("admin").post(
        f"{URL}{KubeConnection.objects.get().pk}/link/",
        {"cluster": 987654, "kind": "RayService", "namespace": "ml", "name": "vision"},
        format="json",
    )
    assert response.status_code == unknown.status_code == 400
    assert response.json()["cluster"] == [m.replace("987654", str(cluster.pk)) for m in unknown.json()["cluster"]]


@pytest.fixture
def linked(team, kube):
    cluster = ClusterFactory(name="vision-prod", team=team)
    return KubeLinkFactory(
        cluster=cluster,
        connection=connection(kube, team),
        snapshot={"pods": [{"name": "head", "memory_limit": "16Gi", "restarts": 0}]},
    )


@pytest.mark.parametrize("who, count", [("viewer", 1), ("outsider", 0)])
def test_links_show_the_snapshot_to_team_members(api_as, linked, who, count):
    body = api_as(who).get(LINKS).json()
    assert body["count"] == count
    if count:
        assert body["results"][0]["snapshot"]["pods"][0]["memory_limit"] == "16Gi"


@pytest.mark.parametrize("who, status", [("operator", 202), ("viewer", 403), ("outsider", 404)])
def test_operators_queue_an_inspection(api_as, linked, who, status):
    assert api_as(who).post(f"{LINKS}{linked.pk}/inspect/").status_code == status


def test_a_broker_that_refuses_the_inspection_fails_nothing(
    api_as, linked, monkeypatch, django_capture_on_commit_callbacks
):
    from kombu.exceptions import OperationalError

    from controlplane.celery import app

    def refused(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", refused)
    with django_capture_on_commit_callbacks(execute=True):
        assert api_as("operator").post(f"{LINKS}{linked.pk}/inspect/").status_code == 202


@pytest.mark.parametrize("who, status", [("admin", 204), ("operator", 403), ("viewer", 403)])
def test_only_admins_unlink(api_as, linked, who, status):
    assert api_as(who).delete(f"{LINKS}{linked.pk}/").status_code == status
    assert KubeLink.objects.exists() == (status != 204)


def test_findings_carry_the_subject_and_message_of_kubernetes_checks(api_as, linked):
    from apps.kubernetes.checks import Finding as KubeFinding
    from apps.remediation import findings

    findings.recompute_kube(
        linked.cluster,
        [KubeFinding("K4", "warning", "ml/vision/gpu/ray-worker", {"gpus": 2.0}, "Request at least 2 CPU.", "LAT-3")],
        complete=True,
    )

    (row,) = api_as("viewer").get("/api/v1/findings/", {"rule": "K4"}).json()["results"]
    assert (row["subject"], row["message"], row["title"], row["remedy"]) == (
        "ml/vision/gpu/ray-worker",
        "Request at least 2 CPU.",
        "GPU pods with too little CPU",
        "",
    )
    assert row["evidence"] == {"gpus": 2.0, "cause": "LAT-3"}


def test_the_openapi_schema_documents_the_kubernetes_endpoints(client):
    paths = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    for path in (
        URL,
        f"{URL}{{id}}/",
        f"{URL}{{id}}/discovery/",
        f"{URL}{{id}}/register/",
        f"{URL}{{id}}/link/",
        LINKS,
        f"{LINKS}{{id}}/",
        f"{LINKS}{{id}}/inspect/",
    ):
        assert path in paths, path
