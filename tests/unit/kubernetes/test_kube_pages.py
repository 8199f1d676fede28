"""The Kubernetes pages: connections (empty state, form), discovery with register and link, the
cluster page's card, Kubernetes findings and pod kills on the existing pages."""

from __future__ import annotations

import pytest
import yaml
from django.urls import reverse
from django.utils import timezone

from apps.clusters.models import Cluster
from apps.incidents.models import PodKillRecord
from apps.kubernetes.checks import Finding as KubeFinding
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.remediation import findings
from tests.factories import ClusterFactory, IncidentFactory, KubeLinkFactory
from tests.kubeapi import ML, connection, kube  # noqa: F401  (fixture)
from tests.unit.integrations.test_kube_adapter import failure, fixture, forbidden, kubeconfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def login(client, people):
    def as_(who: str):
        client.force_login(people[who])
        return client

    return as_


def page(client, url_name, *args, **query) -> str:
    response = client.get(reverse(url_name, args=args), query)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_the_connections_page_has_an_empty_state_and_an_add_button_for_admins(login):
    viewer = page(login("viewer"), "kubernetes:connections")
    assert "No Kubernetes connections yet." in viewer and "Add a connection" not in viewer
    assert "Add a connection" in page(login("admin"), "kubernetes:connections")
    assert login("operator").get(reverse("kubernetes:connection_create")).status_code == 403


def test_an_admin_adds_a_connection_and_lands_on_its_discovery(login, kube):
    kube.serve_list(f"{ML}/rayservices", "RayService", [fixture("rayservice_vision.json")])
    kube.serve_list(
        f"{ML}/rayclusters", "RayCluster", [fixture("raycluster_vision.json"), fixture("raycluster_batch.json")]
    )
    client = login("admin")

    response = client.post(
        reverse("kubernetes:connection_create"),
        {
            "name": "prod",
            "team": KubeConnection._meta.get_field("team").related_model.objects.get().pk,
            "kubeconfig": yaml.safe_dump(kubeconfig(kube.url)),
            "context": "ml",
            "namespaces": "ml",
            "read_only": "on",
        },
    )

    created = KubeConnection.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("kubernetes:connection", args=[created.pk])
    discovery = page(client, "kubernetes:connection", created.pk)
    assert "RayService</strong> ml/vision" in discovery and "RayCluster</strong> ml/batch" in discovery
    assert "http://vision-head-svc.ml.svc:8265" in discovery and ">Register</a>" in discovery
    assert "vision-raycluster-7x9kq" in discovery  # the RayService's active cluster, not offered on its own
    assert "RayCluster</strong> ml/vision-raycluster-7x9kq" not in discovery


def test_a_bad_kubeconfig_is_explained_on_the_form(login, team):
    response = login("admin").post(
        reverse("kubernetes:connection_create"),
        {"name": "prod", "team": team.pk, "kubeconfig": "clusters: [", "namespaces": "ml"},
    )
    assert response.status_code == 200 and "not valid YAML" in response.content.decode()
    assert not KubeConnection.objects.exists()


def test_discovery_shows_partial_results_and_errors_in_words(login, kube, team):
    kube.serve_list(f"{ML}/rayservices", "RayService", [])
    kube.serve_list(f"{ML}/rayclusters", "RayCluster", [fixture("raycluster_batch.json")])
    for plural in ("rayservices", "rayclusters"):
        kube.kmock[f"get /apis/ray.io/v1/namespaces/finance/{plural}"] << forbidden("list", plural, "ray.io", "finance")
    partial = connection(kube, team, namespaces=("finance", "ml"))
    expired = connection(kube, team, name="expired", token="expired")

    shown = page(login("viewer"), "kubernetes:connection", partial.pk)
    assert "Partial result" in shown and "Forbidden to list rayclusters.ray.io in namespace finance" in shown
    assert ">Register</a>" not in shown  # viewers look, admins register
    refused = page(login("viewer"), "kubernetes:connection", expired.pk)
    assert "Nothing could be listed." in refused and "missing, expired or revoked" in refused


def test_discovery_with_nothing_found_and_missing_crds(login, kube, team):
    kube.serve_list(f"{ML}/rayservices", "RayService", [])
    kube.serve_list(f"{ML}/rayclusters", "RayCluster", [])
    assert "No RayCluster or RayService in ml." in page(
        login("viewer"), "kubernetes:connection", connection(kube, team).pk
    )
    (kube.kmock[f"get {ML}/rayservices"] ** 1) << failure(
        404, "NotFound", "the server could not find the requested resource"
    )
    missing = connection(kube, team, name="nocrds")
    assert "KubeRay CRDs are not installed" in page(login("viewer"), "kubernetes:connection", missing.pk)


def test_registering_from_discovery_creates_a_linked_cluster(login, kube, team, use_replay):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    created = connection(kube, team)
    client = login("admin")
    resource = {"kind": "RayService", "namespace": "ml", "name": "vision"}

    form = page(client, "kubernetes:register", created.pk, **resource)
    assert 'value="vision"' in form and "serveConfigV2" in form
    response = client.post(
        reverse("kubernetes:register", args=[created.pk]), resource | {"cluster_name": "vision-prod"}
    )

    cluster = Cluster.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("fleet:cluster", args=[cluster.pk])
    assert cluster.serve_config_owner == "rayservice" and cluster.kube_link.name == "vision"


@pytest.mark.parametrize("token", ["tökén", "a b"])
def test_a_token_no_header_can_carry_is_refused_on_the_register_form(login, kube, team, use_replay, token):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    created = connection(kube, team)

    response = login("admin").post(
        reverse("kubernetes:register", args=[created.pk]),
        {"kind": "RayService", "namespace": "ml", "name": "vision", "cluster_name": "vision-prod", "token": token},
    )

    assert response.status_code == 200
    assert response.context["form"].errors["token"] == [
        "The token must be printable ASCII without spaces, as Ray issues it."
    ]
    assert not Cluster.objects.exists() and not KubeLink.objects.exists()


def test_a_dashboard_that_does_not_answer_is_explained_on_the_register_form(login, kube, team, use_replay):
    import httpx

    kube.serve_rayservice(fixture("rayservice_vision.json"))
    use_replay.routes["/api/version"] = httpx.ConnectError("connection refused")
    created = connection(kube, team)

    response = login("admin").post(
        reverse("kubernetes:register", args=[created.pk]),
        {"kind": "RayService", "namespace": "ml", "name": "vision", "cluster_name": "vision-prod"},
    )

    assert response.status_code == 200 and "Connection test failed" in response.content.decode()
    assert not Cluster.objects.exists() and not KubeLink.objects.exists()


def test_linking_from_discovery_links_an_existing_cluster(login, kube, team):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    cluster = ClusterFactory(name="vision-prod", team=team)
    created = connection(kube, team)

    response = login("admin").post(
        reverse("kubernetes:link", args=[created.pk]),
        {"cluster": cluster.pk, "kind": "RayService", "namespace": "ml", "name": "vision"},
    )

    assert response.status_code == 302 and KubeLink.objects.get().cluster == cluster
    assert login("operator").post(reverse("kubernetes:link", args=[created.pk]), {}).status_code == 403


def test_the_cluster_page_card_without_a_link_says_how_to_get_one(login, team):
    cluster = ClusterFactory(name="vision-prod", team=team, serve_config_owner="rayservice")
    shown = page(login("viewer"), "fleet:cluster", cluster.pk)
    assert "Not linked to a KubeRay resource." in shown and "changes are refused until it is linked" in shown


def test_the_cluster_page_card_shows_pods_limits_restarts_and_the_last_oomkilled(login, kube, team):
    cluster = ClusterFactory(name="vision-prod", team=team)
    KubeLinkFactory(
        cluster=cluster,
        connection=connection(kube, team),
        inspected_at=timezone.now(),
        partial=True,
        warnings=["Forbidden to list events in namespace ml (HTTP 403)"],
        snapshot={
            "resource": {"kind": "RayService", "ready": True, "active_cluster": "vision-raycluster-7x9kq"},
            "pods": [
                {
                    "name": "vision-worker-m4zq7",
                    "node_type": "worker",
                    "group": "gpu-workers",
                    "phase": "Running",
                    "node": "gpu-node-a",
                    "memory_request": "48Gi",
                    "memory_limit": "48Gi",
                    "cpu_request": "8",
                    "gpus": 1.0,
                    "restarts": 3,
                    "last_termination": {"reason": "OOMKilled", "exit_code": 137},
                    "terminating": False,
                    "ray_memory_bytes": 64 * 2**30,
                }
            ],
            "pod_count": 1,
            "last_oomkilled": {
                "pod": "vision-worker-m4zq7",
                "container": "ray-worker",
                "node": "gpu-node-a",
                "exit_code": 137,
                "finished_at": "2026-03-02T09:41:07+00:00",
                "restart_count": 3,
            },
            "events": [
                {
                    "reason": "BackOff",
                    "message": "Back-off restarting failed container",
                    "object": "vision-worker-m4zq7",
                    "count": 4,
                    "last_seen": "2026-03-02T09:41:08+00:00",
                }
            ],
        },
    )

    shown = page(login("operator"), "fleet:cluster", cluster.pk)

    assert "RayService ml/vision" in shown and "partial" in shown and "Forbidden to list events" in shown
    assert "48Gi / 48Gi" in shown and "OOMKilled (exit 137)" in shown and "64\xa0GiB" in shown
    assert "Last OOMKilled:" in shown and "Back-off restarting failed container" in shown
    assert "Inspect now" in shown and "Unlink" not in shown  # operators inspect, admins unlink


def test_a_failed_inspection_is_on_the_card(login, kube, team):
    cluster = ClusterFactory(name="vision-prod", team=team)
    KubeLinkFactory(
        cluster=cluster,
        connection=connection(kube, team),
        kind="RayCluster",
        name="batch",
        inspected_at=timezone.now(),
        last_error="KubeRay CRDs are not installed on this cluster",
    )
    shown = page(login("viewer"), "fleet:cluster", cluster.pk)
    assert (
        "The last inspection failed" in shown
        and "KubeRay CRDs are not installed" in shown
        and "Not inspected yet" in shown
    )


def test_kubernetes_findings_are_on_the_findings_page_with_their_subject(login, kube, team):
    cluster = ClusterFactory(name="vision-prod", team=team)
    findings.recompute_kube(
        cluster,
        [
            KubeFinding(
                "K3",
                "warning",
                "ml/worker-p2w8d",
                {"overdue_s": 900},
                "Pod worker-p2w8d has been Terminating 900 s past its deadline.",
                "OOM-7",
            )
        ],
        complete=True,
    )

    shown = page(login("operator"), "remediation:findings")

    assert "Pods stuck Terminating past their deadline" in shown and ">K3</span>" in shown
    assert "<code>ml/worker-p2w8d</code>" in shown and "Terminating 900 s past its deadline" in shown
    assert ">Mute</button>" in shown and ">Wizard</button>" not in shown  # a pod, not a deployment


def test_the_incident_page_lists_kernel_oom_kills(login, team):
    cluster = ClusterFactory(name="vision-prod", team=team)
    now = timezone.now()
    incident = IncidentFactory(
        cluster=cluster,
        application_name="",
        deployment_name="",
        node_ip="10.42.3.21",
        title="OOM kill of node 10.42.3.21 on vision-prod",
        started_at=now,
    )
    PodKillRecord.objects.create(
        incident=incident,
        kill_key="uid/ray-worker/t",
        namespace="ml",
        pod="vision-worker-m4zq7",
        container="ray-worker",
        node="gpu-node-a",
        exit_code=137,
        restart_count=3,
        memory_limit_bytes=48 * 2**30,
        ray_memory_bytes=64 * 2**30,
    )

    shown = page(login("viewer"), "incidents:detail", incident.pk)

    assert (
        "the kernel, not Ray's memory monitor" in shown and "ml/vision-worker-m4zq7" in shown and "48\xa0GiB" in shown
    )
