"""The inspection after each sync of a linked cluster: K1-K4 as finding rows next to config lint,
kernel OOM kills as incidents (once each), the snapshot the cluster page shows. Kubernetes is
kmock serving KubeRay's shapes; the dashboard is replayed Ray payloads."""

from __future__ import annotations

import copy

import httpx
import pytest

from apps.accounts.audit import Actor
from apps.fleet import sync
from apps.incidents.models import Incident, PodKillRecord
from apps.kubernetes import inspection, services
from apps.kubernetes.models import KubeLink
from apps.remediation import findings
from apps.remediation.models import Finding
from apps.remediation.rules import KUBE_IDS
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory, KubeLinkFactory
from tests.kubeapi import connection, kube, serve_namespace  # noqa: F401  (fixture)
from tests.unit.integrations.test_kube_adapter import fixture, forbidden

pytestmark = pytest.mark.django_db
GIB = 2**30
OOM_POD = "vision-raycluster-7x9kq-gpu-workers-worker-m4zq7"
STUCK_POD = "vision-raycluster-7x9kq-gpu-workers-worker-p2w8d"


@pytest.fixture
def cluster(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    sync.sync_cluster(cluster.pk)
    cluster.refresh_from_db()
    return cluster


def ray_sees(replay, ip: str, memory: int, object_store: int) -> None:
    """The dashboard's view of one node: its memory (node summary) and object store (state API)."""
    replay.routes["/nodes"] = {
        "result": True,
        "msg": "",
        "data": {"summary": [{"ip": ip, "mem": [memory, memory // 2, 50.0, memory // 2]}]},
    }
    nodes = ray_fixture("state_nodes.json")
    node = nodes["data"]["result"]["result"][0]
    node["node_ip"] = ip
    node["resources_total"].update(memory=float(memory) * 0.7, object_store_memory=float(object_store))
    replay.routes["/api/v0/nodes"] = nodes


def link_vision(kube, cluster, **serve) -> KubeLink:
    serve_namespace(
        kube,
        rayservices=[fixture("rayservice_vision.json")],
        rayclusters=[fixture("raycluster_vision.json"), fixture("raycluster_batch.json")],
        hpas=fixture("hpas_ml.json")["items"],
        **serve,
    )
    return KubeLinkFactory(cluster=cluster, connection=connection(kube, cluster.team))


def open_kube_findings(cluster) -> dict[tuple[str, str], Finding]:
    return {
        (f.rule, f.subject): f
        for f in Finding.objects.filter(cluster=cluster, rule__in=KUBE_IDS, resolved_at__isnull=True)
    }


def test_k1_k2_k3_become_findings_and_config_lint_is_left_alone(kube, cluster, use_replay):
    findings.recompute(cluster.pk)
    lint = set(Finding.objects.filter(cluster=cluster, resolved_at__isnull=True).values_list("pk", flat=True))
    assert lint, "the replayed cluster has config-lint findings"
    link_vision(kube, cluster)
    ray_sees(use_replay, "10.42.3.21", 64 * GIB, 10 * GIB)

    inspection.inspect(cluster.pk)

    found = open_kube_findings(cluster)
    assert set(found) == {
        ("K1", f"ml/{OOM_POD}/ray-worker"),
        ("K2", "ml/vision-workers"),
        ("K3", f"ml/{STUCK_POD}"),
    }
    k1 = found[("K1", f"ml/{OOM_POD}/ray-worker")]
    assert k1.severity == "major" and "48.0 GiB" in k1.message and k1.evidence["cause"] == "OOM-6"
    assert k1.evidence["memory_limit_bytes"] == 48 * GIB and k1.deployment_name == ""
    assert "enableInTreeAutoscaling" in found[("K2", "ml/vision-workers")].message
    assert found[("K3", f"ml/{STUCK_POD}")].evidence["cause"] == "OOM-7"
    # The batch RayCluster's mistakes are not this cluster's: its pods were not even read.
    assert not any("batch" in subject for _, subject in found)
    # Config lint and Kubernetes checks own separate rules: neither recompute resolves the other's.
    findings.recompute(cluster.pk)
    assert set(open_kube_findings(cluster)) == set(found)
    assert lint <= set(Finding.objects.filter(cluster=cluster, resolved_at__isnull=True).values_list("pk", flat=True))


def test_k1_k2_k4_on_a_hand_written_raycluster(kube, cluster, use_replay):
    serve_namespace(
        kube,
        rayclusters=[fixture("raycluster_batch.json")],
        pods=[],
        events=[],
        scaled_objects=fixture("scaledobjects_ml.json")["items"],
    )
    KubeLinkFactory(
        cluster=cluster, connection=connection(kube, cluster.team), kind=KubeLink.Kind.RAYCLUSTER, name="batch"
    )

    inspection.inspect(cluster.pk)

    found = open_kube_findings(cluster)
    assert set(found) == {
        ("K1", "ml/batch/head/ray-head"),
        ("K1", "ml/batch/cpu-workers/ray-worker"),
        ("K4", "ml/batch/gpu-small/ray-worker"),
        ("K2", "ml/batch-queue"),
    }
    assert "memory + object-store-memory is 10.0 GiB" in found[("K1", "ml/batch/head/ray-head")].message
    assert found[("K1", "ml/batch/cpu-workers/ray-worker")].evidence["missing"] == ["memory limit", "memory request"]
    assert found[("K4", "ml/batch/gpu-small/ray-worker")].evidence["cpu_request_cores"] == 1
    # Serve autoscaling comes from the dashboard (demo/Model autoscales): the ScaledObject doubles it.
    assert found[("K2", "ml/batch-queue")].evidence["serve_autoscaling"] is True


def pod_list(names_to_drop=()):
    pods = [
        p
        for p in fixture("pods_ml.json")["items"]
        if p["metadata"]["labels"]["ray.io/cluster"] == "vision-raycluster-7x9kq"
        and p["metadata"]["name"] not in names_to_drop
    ]
    return lambda: {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": copy.deepcopy(pods)}


def test_a_fixed_problem_resolves_but_a_partial_read_resolves_nothing(kube, cluster, use_replay):
    link_vision(kube, cluster)
    ray_sees(use_replay, "10.42.3.21", 48 * GIB, 10 * GIB)
    inspection.inspect(cluster.pk)
    assert ("K3", f"ml/{STUCK_POD}") in open_kube_findings(cluster)

    (kube.kmock["get /api/v1/namespaces/ml/pods"] ** 1) << forbidden("list", "pods", "", "ml")
    partial = inspection.inspect(cluster.pk)
    assert partial.partial is True and any("Forbidden to list pods in namespace ml" in w for w in partial.warnings)
    assert ("K3", f"ml/{STUCK_POD}") in open_kube_findings(cluster)

    (kube.kmock["get /api/v1/namespaces/ml/pods"] ** 2) << pod_list(names_to_drop={STUCK_POD})
    inspection.inspect(cluster.pk)
    assert ("K3", f"ml/{STUCK_POD}") not in open_kube_findings(cluster)
    assert Finding.objects.get(cluster=cluster, rule="K3").resolved_at is not None


def test_without_ray_s_view_nothing_resolves_and_the_card_says_why(kube, cluster, use_replay):
    link_vision(kube, cluster)
    ray_sees(use_replay, "10.42.3.21", 64 * GIB, 10 * GIB)
    inspection.inspect(cluster.pk)
    del use_replay.routes["/nodes"]

    link = inspection.inspect(cluster.pk)

    assert ("K1", f"ml/{OOM_POD}/ray-worker") in open_kube_findings(cluster)
    assert any(w.startswith("Ray's view of node memory is unavailable") for w in link.warnings)


def test_a_kernel_oom_kill_becomes_an_incident_with_oom6_first_and_only_once(kube, cluster, use_replay):
    link_vision(kube, cluster)
    ray_sees(use_replay, "10.42.3.21", 64 * GIB, 10 * GIB)

    inspection.inspect(cluster.pk)
    inspection.inspect(cluster.pk)

    incident = Incident.objects.get(cluster=cluster, kind=Incident.Kind.OOM_KILL)
    assert incident.node_ip == "10.42.3.21" and incident.signal_count == 1
    first = incident.causes[0]
    assert first["id"] == "OOM-6"
    assert "48.0 GiB container limit" in first["reason"] and "64.0 GiB (Ray's dashboard)" in first["reason"]
    assert [check["id"] for check in first["checks"]] == ["K1"] and first["remedies"] == []
    (kill,) = PodKillRecord.objects.filter(incident=incident)
    assert (kill.pod, kill.container, kill.exit_code, kill.memory_limit_bytes) == (OOM_POD, "ray-worker", 137, 48 * GIB)
    assert incident.evidence["pod"] == f"ml/{OOM_POD}" and incident.evidence["source"] == "kubernetes"
    assert [r["reason"] for r in incident.evidence["ray_pod_restarts"]] == ["OOMKilled"]


def test_without_ray_s_view_the_oom6_reason_uses_the_ray_start_params(kube, cluster, use_replay):
    service = fixture("rayservice_vision.json")
    cluster_spec = fixture("raycluster_vision.json")
    cluster_spec["spec"]["workerGroupSpecs"][0]["rayStartParams"]["memory"] = str(60 * GIB)
    serve_namespace(kube, rayservices=[service], rayclusters=[cluster_spec], hpas=[])
    KubeLinkFactory(cluster=cluster, connection=connection(kube, cluster.team))

    inspection.inspect(cluster.pk)

    reason = Incident.objects.get(kind=Incident.Kind.OOM_KILL).causes[0]["reason"]
    assert "60.0 GiB (rayStartParams memory)" in reason


def test_the_snapshot_keeps_pods_limits_restarts_the_last_oomkilled_and_warning_events(kube, cluster, use_replay):
    link_vision(kube, cluster)

    link = inspection.inspect(cluster.pk)

    snapshot = KubeLink.objects.get(pk=link.pk).snapshot
    pods = {p["name"]: p for p in snapshot["pods"]}
    assert len(pods) == 3 and snapshot["pods"][0]["node_type"] == "head"
    assert (pods[OOM_POD]["memory_request"], pods[OOM_POD]["memory_limit"], pods[OOM_POD]["restarts"]) == (
        "48Gi",
        "48Gi",
        3,
    )
    assert pods[OOM_POD]["last_termination"]["reason"] == "OOMKilled" and pods[STUCK_POD]["terminating"] is True
    assert snapshot["last_oomkilled"]["pod"] == OOM_POD
    assert [e["reason"] for e in snapshot["events"]] == ["BackOff"]
    assert snapshot["resource"]["active_cluster"] == "vision-raycluster-7x9kq" and snapshot["resource"]["ready"] is True
    assert link.partial is False and link.last_error == ""


def test_an_api_server_that_refuses_keeps_the_last_snapshot_and_says_why(kube, cluster, use_replay):
    link = link_vision(kube, cluster)
    inspection.inspect(cluster.pk)
    before = KubeLink.objects.get(pk=link.pk).snapshot
    link.connection.kubeconfig_ciphertext = connection(
        kube, cluster.team, name="expired", token="expired"
    ).kubeconfig_ciphertext
    link.connection.save()

    inspection.inspect(cluster.pk)

    link.refresh_from_db()
    assert "missing, expired or revoked" in link.last_error and link.snapshot == before
    assert open_kube_findings(cluster), "an unreadable cluster resolves nothing"


def test_the_sync_task_queues_an_inspection_for_linked_clusters_even_when_the_dashboard_fails(
    kube, cluster, use_replay, monkeypatch
):
    from workers import tasks

    queued = []
    monkeypatch.setattr(tasks.inspect_kubernetes, "delay", queued.append)
    tasks.sync_cluster(cluster.pk)
    assert queued == []

    link_vision(kube, cluster)
    tasks.sync_cluster(cluster.pk)
    use_replay.routes["/api/version"] = httpx.ConnectError("refused")
    tasks.sync_cluster(cluster.pk)
    assert queued == [cluster.pk, cluster.pk]


def test_unlinking_resolves_the_kubernetes_findings(kube, cluster, use_replay, people):
    link = link_vision(kube, cluster)
    inspection.inspect(cluster.pk)
    assert open_kube_findings(cluster)

    services.unlink(Actor(user=people["admin"]), link)

    assert open_kube_findings(cluster) == {} and not KubeLink.objects.exists()
