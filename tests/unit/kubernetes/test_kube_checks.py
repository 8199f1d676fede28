"""K1-K4, OOMKilled evidence and object parsing: pure functions over the KubeRay- and
Kubernetes-shaped objects in tests/fixtures/kube."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from apps.kubernetes.checks import check_k1, check_k2, check_k3, check_k4
from apps.kubernetes.oomkilled import oomkilled, ray_restarts
from integrations.kubernetes.autoscalers import parse_hpa, parse_scaled_object
from integrations.kubernetes.fields import parse_quantity
from integrations.kubernetes.kuberay import parse_raycluster, parse_rayservice
from integrations.kubernetes.pods import parse_pod
from tests.yaml_aliases import alias_bomb, written_out

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kube"
GIB = 2**30


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def pods(*names: str):
    items = fixture("pods_ml.json")["items"]
    return [parse_pod(item) for item in items if not names or item["metadata"]["name"] in names]


def vision_pods():
    return [pod for pod in pods() if pod.ray_cluster == "vision-raycluster-7x9kq"]


def vision_cluster():
    return parse_raycluster(fixture("raycluster_vision.json"))


def batch_cluster():
    return parse_raycluster(fixture("raycluster_batch.json"))


def vision_service(edit=None):
    raw = fixture("rayservice_vision.json")
    if edit:
        edit(raw)
    return parse_rayservice(raw)


OOM_WORKER = "vision-raycluster-7x9kq-gpu-workers-worker-m4zq7"
TERMINATING_WORKER = "vision-raycluster-7x9kq-gpu-workers-worker-p2w8d"


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "value"),
    [
        ("48Gi", 48 * GIB),
        ("512Mi", 512 * 2**20),
        ("500m", 0.5),
        ("8", 8.0),
        ("1.5G", 1.5e9),
        ("1e3", 1000.0),
        ("100k", 1e5),
        (2, 2.0),
        ("12GiB", None),
        ("lots", None),
        (None, None),
        ("", None),
    ],
)
def test_quantities_parse_like_kubernetes_does(quantity, value):
    assert parse_quantity(quantity) == value


def test_a_rayservice_with_malformed_serve_config_still_parses_and_says_what_is_wrong():
    def break_yaml(raw):
        raw["spec"]["serveConfigV2"] = "applications:\n  - name: detector\n   import_path: x\n"

    service = vision_service(break_yaml)

    assert service.serve_config is None
    assert "not valid YAML (line 3" in service.serve_config_error
    assert service.cluster_spec.workers[0].name == "gpu-workers"


def with_args(args: str):
    def edit(raw):
        raw["spec"]["serveConfigV2"] = f"applications:\n  - name: detector\n    import_path: x\n    args: {args}\n"

    return edit


def test_a_serve_config_with_yaml_aliases_is_refused_without_expanding_them():
    service = vision_service(with_args(alias_bomb()))
    assert service.serve_config is None
    assert "anchors and aliases (&name / *name) are not accepted" in service.serve_config_error


def test_the_same_serve_config_written_out_without_aliases_parses():
    service = vision_service(with_args(written_out()))
    assert service.serve_config["applications"][0]["args"] == json.loads(written_out())


# --- K1 --------------------------------------------------------------------------------------


def test_k1_accepts_a_cluster_whose_ray_containers_have_requests_limits_and_fitting_sizes():
    assert check_k1([vision_cluster()], [vision_service()], vision_pods()) == []


def test_k1_flags_a_worker_group_without_memory_request_or_limit():
    (finding,) = [f for f in check_k1([batch_cluster()]) if f.subject == "ml/batch/cpu-workers/ray-worker"]

    assert finding.evidence["missing"] == ["memory limit", "memory request"]
    assert (finding.rule, finding.severity, finding.cause) == ("K1", "major", "OOM-6")
    assert "no memory limit and no memory request" in finding.message


def test_k1_takes_a_memory_limit_alone_as_enough_since_the_request_defaults_to_it():
    raw = fixture("raycluster_vision.json")
    del raw["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]

    assert check_k1([parse_raycluster(raw)]) == []


def test_k1_flags_a_memory_request_without_a_limit():
    raw = fixture("raycluster_vision.json")
    del raw["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]

    (finding,) = check_k1([parse_raycluster(raw)])

    assert finding.evidence["missing"] == ["memory limit"]


def test_k1_flags_ray_start_params_that_add_up_to_more_than_the_limit():
    (finding,) = [f for f in check_k1([batch_cluster()]) if f.subject == "ml/batch/head/ray-head"]

    assert finding.evidence["ray_start_params.memory"] == 6 * GIB
    assert finding.evidence["ray_start_params.object-store-memory"] == 4 * GIB
    assert finding.evidence["memory_limit_bytes"] == 8 * GIB
    assert "10.0 GiB, more than the container limit of 8.0 GiB" in finding.message


def test_k1_flags_an_object_store_param_larger_than_the_limit_on_its_own():
    raw = fixture("raycluster_vision.json")
    raw["spec"]["workerGroupSpecs"][0]["rayStartParams"]["object-store-memory"] = str(64 * GIB)

    (finding,) = check_k1([parse_raycluster(raw)])

    assert finding.subject == "ml/vision-raycluster-7x9kq/gpu-workers/ray-worker"
    assert finding.evidence["ray_start_params.object-store-memory"] == 64 * GIB


def test_k1_flags_ray_believing_a_pod_has_more_memory_than_its_limit():
    # Ray read the host's 256 GiB instead of the container's 48 GiB limit.
    findings = check_k1([vision_cluster()], pods=pods(OOM_WORKER), ray_nodes=[("10.42.3.21", 256 * GIB, 76 * GIB)])

    assert {f.cause for f in findings} == {"OOM-6", "OOM-3"}
    memory = next(f for f in findings if f.cause == "OOM-6")
    assert memory.subject == f"ml/{OOM_WORKER}/ray-worker"
    assert memory.evidence == {
        "memory_limit_bytes": 48 * GIB,
        "ray_memory_total_bytes": 256 * GIB,
        "ray_object_store_bytes": 76 * GIB,
        "node": "gpu-node-a",
        "pod_ip": "10.42.3.21",
    }


def test_k1_accepts_ray_seeing_the_container_limit():
    assert check_k1(pods=pods(OOM_WORKER), ray_nodes=[("10.42.3.21", 48 * GIB, 10 * GIB)]) == []


def test_k1_matches_ray_nodes_by_pod_name_too():
    (finding,) = check_k1(pods=pods(OOM_WORKER), ray_nodes=[(OOM_WORKER, 256 * GIB, 10 * GIB)])

    assert finding.cause == "OOM-6" and "Ray sees 256.0 GiB" in finding.message


def test_k1_reports_a_spec_mistake_once_not_for_the_rayservice_its_cluster_and_every_pod():
    def drop_limits(raw):
        del raw["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
            "limits"
        ]["memory"]

    raw_cluster = fixture("raycluster_vision.json")
    del raw_cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]

    findings = check_k1([parse_raycluster(raw_cluster)], [vision_service(drop_limits)], vision_pods())

    assert [(f.subject, f.evidence["missing"]) for f in findings] == [
        ("ml/vision-raycluster-7x9kq/gpu-workers/ray-worker", ["memory limit"])
    ]


def test_k1_checks_live_pods_whose_cluster_spec_was_not_given():
    (finding,) = check_k1(pods=pods("batch-cpu-workers-worker-x7f2k"))

    assert finding.subject == "ml/batch-cpu-workers-worker-x7f2k/ray-worker"
    assert finding.evidence["missing"] == ["memory limit", "memory request"]


# --- K2 --------------------------------------------------------------------------------------


def hpas():
    return [parse_hpa(item) for item in fixture("hpas_ml.json")["items"]]


def scaled_objects():
    return [parse_scaled_object(item) for item in fixture("scaledobjects_ml.json")["items"]]


def test_k2_flags_an_hpa_on_a_raycluster_that_ray_autoscales_in_tree():
    (finding,) = check_k2([vision_cluster(), batch_cluster()], [vision_service()], hpas(), scaled_objects())

    assert (finding.rule, finding.severity, finding.subject) == ("K2", "major", "ml/vision-workers")
    assert finding.evidence["target"] == "RayCluster/vision-raycluster-7x9kq"
    assert finding.evidence["ray_in_tree_autoscaling"] is True
    assert finding.evidence["serve_autoscaling"] is True  # its RayService's detector autoscales


def test_k2_ignores_scalers_of_other_workloads_and_clusters_nobody_else_scales():
    # The HPA on a Deployment, and KEDA on a RayCluster with neither Ray nor Serve autoscaling.
    assert check_k2([batch_cluster()], [], hpas(), scaled_objects()) == []


def test_k2_flags_keda_on_a_cluster_whose_serve_config_autoscales_as_a_warning():
    (finding,) = check_k2([batch_cluster()], [], [], scaled_objects(), serve_autoscaled_clusters=["ml/batch"])

    assert (finding.severity, finding.subject) == ("warning", "ml/batch-queue")
    assert finding.evidence["scaler"] == "ScaledObject/batch-queue"


def test_k2_ignores_a_paused_scaled_object():
    raw = fixture("scaledobjects_ml.json")["items"][0]
    raw["metadata"]["annotations"] = {"autoscaling.keda.sh/paused": "true"}

    assert check_k2([batch_cluster()], [], [], [parse_scaled_object(raw)], serve_autoscaled_clusters=["ml/batch"]) == []


def test_k2_resolves_an_hpa_that_targets_the_rayservice_itself():
    def no_in_tree(raw):
        raw["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = False

    raw = fixture("hpas_ml.json")["items"][0]
    raw["spec"]["scaleTargetRef"] = {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "vision"}

    (finding,) = check_k2([], [vision_service(no_in_tree)], [parse_hpa(raw)])

    assert finding.severity == "warning" and finding.evidence["serve_autoscaling"] is True


def test_k2_does_not_count_fixed_replica_serve_configs_as_autoscaling():
    def fixed(raw):
        raw["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = False
        raw["spec"]["serveConfigV2"] = (
            "applications:\n- name: thumbnails\n  import_path: vision.thumbs:app\n  deployments:\n"
            "  - name: Thumbnailer\n    num_replicas: 2\n"
        )

    raw = fixture("hpas_ml.json")["items"][0]
    raw["spec"]["scaleTargetRef"] = {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "vision"}

    assert check_k2([], [vision_service(fixed)], [parse_hpa(raw)]) == []


# --- K3 --------------------------------------------------------------------------------------


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_k3_flags_a_pod_terminating_past_its_deadline_and_margin():
    # 135 s past deletionTimestamp: past the 120 s margin. Adding the 30 s grace period again
    # (it is already inside deletionTimestamp) would wrongly hide this pod until 150 s.
    (finding,) = check_k3(pods(), now=at("2026-03-02T09:52:15"))

    assert (finding.rule, finding.subject, finding.cause) == ("K3", f"ml/{TERMINATING_WORKER}", "OOM-7")
    assert finding.evidence["overdue_s"] == 135
    assert finding.evidence["deletion_grace_period_s"] == 30 and finding.evidence["node"] == "gpu-node-b"
    assert "kubelet on gpu-node-b" in finding.message


def test_k3_leaves_a_pod_alone_within_the_margin_after_its_deadline():
    # deletionTimestamp already includes the 30 s grace period; 60 s past it is within the margin.
    assert check_k3(pods(), now=at("2026-03-02T09:51:00")) == []


def test_k3_names_the_finalizers_that_hold_a_pod():
    raw = fixture("pods_ml.json")["items"][2]
    raw["metadata"]["finalizers"] = ["example.com/drain-replicas"]

    (finding,) = check_k3([parse_pod(raw)], now=at("2026-03-02T10:30:00"))

    assert finding.evidence["finalizers"] == ["example.com/drain-replicas"]
    assert "finalizers example.com/drain-replicas have not been removed" in finding.message


# --- K4 --------------------------------------------------------------------------------------


def test_k4_flags_a_gpu_group_with_less_than_one_cpu_per_gpu():
    (finding,) = check_k4([batch_cluster()])

    assert (finding.rule, finding.severity, finding.subject) == ("K4", "warning", "ml/batch/gpu-small/ray-worker")
    assert (finding.evidence["gpus"], finding.evidence["cpu_request_cores"]) == (2.0, 1.0)
    assert "0.50 per GPU" in finding.message and "at least 2 CPU" in finding.message


def test_k4_accepts_gpu_workers_with_eight_cpus_per_gpu():
    assert check_k4([vision_cluster()], [vision_service()], pods()) == []


def test_k4_flags_a_gpu_pod_without_any_cpu_request_as_major():
    raw = fixture("pods_ml.json")["items"][1]
    resources = raw["spec"]["containers"][0]["resources"]
    del resources["requests"]["cpu"], resources["limits"]["cpu"]

    (finding,) = check_k4(pods=[parse_pod(raw)])

    assert finding.severity == "major" and finding.evidence["cpu_request_cores"] is None


def test_k4_reads_a_millicore_request_and_honours_the_threshold():
    raw = fixture("pods_ml.json")["items"][1]
    raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1000m"
    assert check_k4(pods=[parse_pod(raw)]) == []  # exactly one CPU per GPU is the floor, not below it

    raw["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1500m"
    (finding,) = check_k4(pods=[parse_pod(raw)], min_cpu_per_gpu=2)
    assert finding.evidence["cpu_request_cores"] == 1.5


# --- OOMKilled evidence ----------------------------------------------------------------------


def test_oomkilled_reports_the_kernel_kill_of_a_ray_worker_with_its_kuberay_identity():
    (kill,) = oomkilled(pods())

    assert (kill.namespace, kill.pod, kill.container, kill.node) == ("ml", OOM_WORKER, "ray-worker", "gpu-node-a")
    assert (kill.exit_code, kill.restart_count, kill.reason) == (137, 3, "OOMKilled")
    assert kill.finished_at == at("2026-03-02T09:41:07")
    assert (kill.ray_node_type, kill.ray_cluster, kill.ray_group) == (
        "worker",
        "vision-raycluster-7x9kq",
        "gpu-workers",
    )
    assert kill.kernel_oom is True and kill.suspected_cause == "OOM-6"


def test_oomkilled_sees_a_container_killed_now_and_counts_each_kill_once():
    raw = fixture("pods_ml.json")["items"][1]
    status = raw["status"]["containerStatuses"][0]
    status["state"] = {
        "terminated": {
            "exitCode": 137,
            "reason": "OOMKilled",
            "startedAt": "2026-03-02T09:41:09Z",
            "finishedAt": "2026-03-02T10:02:44Z",
        }
    }
    pod = parse_pod(raw)

    kills = oomkilled([pod, copy.deepcopy(pod)])

    assert sorted(k.finished_at.isoformat() for k in kills) == [
        "2026-03-02T09:41:07+00:00",
        "2026-03-02T10:02:44+00:00",
    ]


def test_oomkilled_ignores_restarts_for_other_reasons():
    assert oomkilled(pods("batch-cpu-workers-worker-x7f2k", "vision-raycluster-7x9kq-head-8xk2p")) == []


def test_ray_restarts_lists_every_restarted_ray_container_with_its_reason():
    restarts = sorted(ray_restarts(pods()), key=lambda r: r.pod)

    assert [(r.pod, r.reason, r.exit_code, r.kernel_oom) for r in restarts] == [
        ("batch-cpu-workers-worker-x7f2k", "Error", 1, False),
        (OOM_WORKER, "OOMKilled", 137, True),
    ]
