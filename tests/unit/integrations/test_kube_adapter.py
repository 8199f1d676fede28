"""The Kubernetes adapter against a real HTTP server: kmock's Kubernetes scaffold on a loopback
port, answering with KubeRay- and Kubernetes-shaped JSON from tests/fixtures/kube.

kmock is asyncio-based and the official client is synchronous, so each test runs on kmock's event
loop and calls the adapter in a worker thread (`asyncio.to_thread`): the server keeps answering
while the client blocks."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import socket
import time
from pathlib import Path

import pytest
from kmock import KubernetesError, KubernetesScaffold
from kubernetes import client

from apps.kubernetes.rayservice import RayServiceDrift, RayServiceWriter, dump_serve_config, read_serve_config, status
from integrations.kubernetes.adapter import KubeAdapter
from integrations.kubernetes.errors import (
    KubeBadResponse,
    KubeConfigInvalid,
    KubeConflict,
    KubeCRDNotInstalled,
    KubeForbidden,
    KubeNotFound,
    KubeUnauthorized,
    KubeUnavailable,
)
from integrations.kubernetes.kuberay import ServeConfigError, parse_serve_config_v2

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kube"
TOKEN = "fleetdeck-sa-token"
ML = "/apis/ray.io/v1/namespaces/ml"

pytestmark = pytest.mark.kmock(cls=KubernetesScaffold)


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def kubeconfig(server: str, token: str = TOKEN) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kind-ml", "cluster": {"server": server}}],
        "users": [{"name": "fleetdeck", "user": {"token": token}}],
        "contexts": [{"name": "ml", "context": {"cluster": "kind-ml", "user": "fleetdeck", "namespace": "ml"}}],
        "current-context": "ml",
    }


def failure(code: int, reason: str, message: str, **details) -> KubernetesError:
    """What the API server answers on errors: a v1 Status with the code, reason and details."""
    return KubernetesError(status=code, reason=reason, message=message, details=details)


def forbidden(verb: str, plural: str, group: str, namespace: str) -> KubernetesError:
    resource = f"{plural}.{group}" if group else plural
    return failure(
        403,
        "Forbidden",
        f'{resource} is forbidden: User "system:serviceaccount:fleetdeck:fleetdeck" cannot {verb} resource '
        f'"{plural}" in API group "{group}" in the namespace "{namespace}"',
        group=group,
        kind=plural,
    )


class FakeKube:
    """The API server's behaviour that the adapter relies on, served by kmock: bearer-token auth,
    lists paged with `limit` and opaque `continue` tokens, and a RayService whose PATCH enforces
    the resourceVersion carried in the patch body (409 when stale), as the real server does."""

    def __init__(self, kmock):
        self.kmock = kmock
        self.list_params: list[dict] = []
        self.patches: list[dict] = []
        self.services: dict[tuple[str, str], dict] = {}
        unauthenticated = kmock[lambda request: request.headers.get("Authorization") != f"Bearer {TOKEN}"]
        (unauthenticated**10) << failure(401, "Unauthorized", "Unauthorized")

    @property
    def url(self) -> str:
        return str(self.kmock.url).rstrip("/")

    def adapter(self, token: str = TOKEN, **options) -> KubeAdapter:
        return KubeAdapter.from_kubeconfig(kubeconfig(self.url, token), context="ml", **options)

    def serve_list(self, path: str, kind: str, items: list[dict]) -> None:
        def page(request):
            self.list_params.append({"path": path, **request.params})
            start = (
                int(base64.urlsafe_b64decode(request.params["continue"]).decode().split(":")[1])
                if request.params.get("continue")
                else 0
            )
            limit = int(request.params.get("limit") or len(items) or 1)
            chunk = items[start : start + limit]
            meta = {"resourceVersion": "48213400"}
            if start + limit < len(items):
                meta["continue"] = base64.urlsafe_b64encode(f"{kind}:{start + limit}".encode()).decode()
                meta["remainingItemCount"] = len(items) - start - limit
            return {"apiVersion": "v1", "kind": f"{kind}List", "metadata": meta, "items": chunk}

        self.kmock[f"get {path}"] << page

    def serve_rayservice(self, body: dict) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.services[key] = copy.deepcopy(body)
        path = f"/apis/ray.io/v1/namespaces/{key[0]}/rayservices/{key[1]}"
        self.kmock[f"get {path}"] << (lambda: copy.deepcopy(self.services[key]))
        self.kmock[f"patch {path}"] << (lambda request: self._patch(key, request))

    def bump(self, namespace: str, name: str, *, serve_config_v2: str | None = None) -> None:
        """Someone else writes the RayService (KubeRay's status, or a person's kubectl apply)."""
        service = self.services[(namespace, name)]
        service["metadata"]["resourceVersion"] = str(int(service["metadata"]["resourceVersion"]) + 1)
        if serve_config_v2 is not None:
            service["spec"]["serveConfigV2"] = serve_config_v2
            service["metadata"]["generation"] += 1

    def _patch(self, key, request):
        self.patches.append(
            {"content_type": request.headers.get("Content-Type"), "body": request.data, "params": dict(request.params)}
        )
        if request.headers.get("Content-Type") != "application/merge-patch+json":
            raise failure(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
        service = self.services[key]
        wanted = (request.data.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != service["metadata"]["resourceVersion"]:
            raise failure(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on rayservices.ray.io "{key[1]}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                name=key[1],
                group="ray.io",
                kind="rayservices",
            )
        patch = {k: v for k, v in request.data.items() if k != "metadata"}
        if (
            patch.get("spec", {}).get("serveConfigV2", service["spec"]["serveConfigV2"])
            != service["spec"]["serveConfigV2"]
        ):
            service["metadata"]["generation"] += 1
        _merge(service, patch)
        service["metadata"]["resourceVersion"] = str(int(service["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(service)


def _merge(target: dict, patch: dict) -> None:
    """RFC 7386 JSON merge patch, which the API server applies for application/merge-patch+json."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


@pytest.fixture
def kube(kmock) -> FakeKube:
    return FakeKube(kmock)


def pods(count: int, namespace: str = "ml") -> list[dict]:
    template = fixture("pods_ml.json")["items"][1]
    items = []
    for index in range(count):
        item = copy.deepcopy(template)
        item["metadata"].update(name=f"vision-raycluster-7x9kq-gpu-workers-worker-{index:05d}", namespace=namespace)
        items.append(item)
    return items


# --- construction ----------------------------------------------------------------------------


def test_adapter_from_a_kubeconfig_file_uses_the_named_context_and_leaves_the_global_config_alone(tmp_path):
    default_host = client.Configuration.get_default().host
    config = kubeconfig("https://k8s.example.internal:6443")
    config["clusters"].append({"name": "other", "cluster": {"server": "https://other.example.internal:6443"}})
    config["contexts"].append({"name": "other", "context": {"cluster": "other", "user": "fleetdeck"}})
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    before = path.read_text()

    with KubeAdapter.from_kubeconfig(path, context="other") as adapter:
        assert adapter._api.configuration.host == "https://other.example.internal:6443"
        assert adapter._api.configuration.retries is False

    assert client.Configuration.get_default().host == default_host
    assert path.read_text() == before


def test_a_kubeconfig_without_the_context_is_refused_with_a_config_error():
    with pytest.raises(KubeConfigInvalid, match="cannot be used"):
        KubeAdapter.from_kubeconfig(kubeconfig("https://k8s.example.internal:6443"), context="missing")


def test_a_kubeconfig_with_an_exec_plugin_is_refused_before_it_can_run_unless_allowed(tmp_path):
    marker = tmp_path / "plugin-ran"
    config = kubeconfig("https://k8s.example.internal:6443")
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "touch",
            "args": [str(marker)],
            "interactiveMode": "Never",
        }
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))

    with pytest.raises(KubeConfigInvalid, match="exec credential plugin"):
        KubeAdapter.from_kubeconfig(config)
    with pytest.raises(KubeConfigInvalid, match="exec credential plugin"):
        KubeAdapter.from_kubeconfig(path)
    assert not marker.exists()

    # The client runs the plugin's command while loading the kubeconfig: that is what the refusal prevents.
    KubeAdapter.from_kubeconfig(path, allow_plugins=True).close()
    assert marker.exists()


def test_in_cluster_outside_a_pod_is_a_config_error(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigInvalid, match="service account"):
        KubeAdapter.in_cluster()


# --- lists and pagination --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_lists_follow_continue_tokens_across_pages_and_send_the_bearer_token(kube):
    kube.serve_list("/api/v1/namespaces/ml/pods", "Pod", pods(5))
    adapter = kube.adapter(page_size=2)

    result = await asyncio.to_thread(adapter.list_pods, "ml", "ray.io/is-ray-node=yes")

    assert [p.name[-5:] for p in result.items] == ["00000", "00001", "00002", "00003", "00004"]
    assert result.partial is False and result.warnings == []
    assert [p.get("limit") for p in kube.list_params] == ["2", "2", "2"]
    assert kube.list_params[0].get("continue") is None
    assert kube.list_params[1]["continue"] and kube.list_params[2]["continue"] != kube.list_params[1]["continue"]
    assert {p["labelSelector"] for p in kube.list_params} == {"ray.io/is-ray-node=yes"}


@pytest.mark.asyncio
async def test_the_cap_on_items_stops_paging_and_marks_the_result_partial(kube):
    kube.serve_list("/api/v1/namespaces/ml/pods", "Pod", pods(7))
    kube.serve_list("/api/v1/namespaces/ml-staging/pods", "Pod", pods(2, "ml-staging"))
    adapter = kube.adapter(page_size=2, max_items=5)

    result = await asyncio.to_thread(adapter.list_pods, ["ml", "ml-staging"])

    assert len(result.items) == 5
    assert result.partial is True
    assert "Stopped at 5 pods" in result.warnings[0] and "ml has more" in result.warnings[0]
    assert "not listed: ml-staging" in result.warnings[0]
    # The last page asks only for what still fits under the cap.
    assert [p.get("limit") for p in kube.list_params] == ["2", "2", "1"]


@pytest.mark.asyncio
async def test_a_result_exactly_at_the_cap_with_nothing_left_is_complete(kube):
    kube.serve_list("/api/v1/namespaces/ml/pods", "Pod", pods(4))
    adapter = kube.adapter(page_size=2, max_items=4)

    result = await asyncio.to_thread(adapter.list_pods, "ml")

    assert len(result.items) == 4 and result.partial is False


@pytest.mark.asyncio
async def test_a_forbidden_namespace_is_skipped_and_named_while_the_others_are_listed(kube):
    vision = fixture("raycluster_vision.json")
    kube.serve_list(f"{ML}/rayclusters", "RayCluster", [vision])
    kube.kmock["get /apis/ray.io/v1/namespaces/finance/rayclusters"] << forbidden(
        "list", "rayclusters", "ray.io", "finance"
    )

    result = await asyncio.to_thread(kube.adapter().list_rayclusters, ["finance", "ml"])

    assert [c.name for c in result.items] == ["vision-raycluster-7x9kq"]
    assert result.partial is True
    assert len(result.warnings) == 1
    assert "list rayclusters.ray.io in namespace finance" in result.warnings[0]
    assert 'cannot list resource "rayclusters"' in result.warnings[0]


@pytest.mark.asyncio
async def test_an_expired_continue_token_keeps_what_was_read_and_marks_the_result_partial(kube):
    items = pods(3)

    def page(request):
        if request.params.get("continue"):
            raise failure(
                410, "Expired", "The provided continue parameter is too old to display a consistent list result."
            )
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"continue": "c2VlbjoyCg", "resourceVersion": "1"},
            "items": items[:2],
        }

    kube.kmock["get /api/v1/namespaces/ml/pods"] << page

    result = await asyncio.to_thread(kube.adapter(page_size=2).list_pods, "ml")

    assert len(result.items) == 2 and result.partial is True
    assert "continue token expired" in result.warnings[0]


@pytest.mark.asyncio
async def test_rayclusters_and_rayservices_are_parsed_from_kuberay_v1_objects(kube):
    kube.serve_list(
        f"{ML}/rayclusters", "RayCluster", [fixture("raycluster_vision.json"), fixture("raycluster_batch.json")]
    )
    kube.serve_list(f"{ML}/rayservices", "RayService", [fixture("rayservice_vision.json")])
    adapter = kube.adapter()

    clusters = await asyncio.to_thread(adapter.list_rayclusters, "ml")
    services = await asyncio.to_thread(adapter.list_rayservices, "ml")

    vision, batch = clusters.items
    assert vision.rayservice == "vision" and batch.rayservice == ""
    assert vision.spec.in_tree_autoscaling is True
    assert [g.name for g in vision.spec.groups] == ["head", "gpu-workers"]
    assert vision.spec.workers[0].ray_container.gpu_limit == 1
    assert vision.spec.workers[0].ray_container.memory_limit_bytes == 48 * 2**30
    (service,) = services.items
    assert service.resource_version == "48213377"
    assert [app["name"] for app in service.serve_config["applications"]] == ["detector", "thumbnails"]
    assert service.status.active.applications["detector"].deployments["Detector"].status == "HEALTHY"
    assert service.status.ready is True and service.status.upgrading is False and service.observed is True


@pytest.mark.asyncio
async def test_pods_carry_resources_restarts_last_termination_and_deletion(kube):
    kube.serve_list("/api/v1/namespaces/ml/pods", "Pod", fixture("pods_ml.json")["items"])

    result = await asyncio.to_thread(kube.adapter().list_pods, "ml")

    by_name = {p.name: p for p in result.items}
    oom = by_name["vision-raycluster-7x9kq-gpu-workers-worker-m4zq7"]
    worker = oom.ray_container
    assert (oom.ray_node_type, oom.ray_cluster, oom.node_name) == ("worker", "vision-raycluster-7x9kq", "gpu-node-a")
    assert worker.restart_count == 3
    assert (worker.last_terminated.reason, worker.last_terminated.exit_code) == ("OOMKilled", 137)
    assert worker.last_terminated.finished_at.isoformat() == "2026-03-02T09:41:07+00:00"
    assert worker.limits == {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "1"}
    leaving = by_name["vision-raycluster-7x9kq-gpu-workers-worker-p2w8d"]
    assert leaving.deletion_timestamp.isoformat() == "2026-03-02T09:50:00+00:00"
    assert (leaving.deletion_grace_period_s, leaving.termination_grace_period_s) == (30, 30)


@pytest.mark.asyncio
async def test_events_narrow_by_one_reason_on_the_server_and_by_several_after_paging(kube):
    kube.serve_list("/api/v1/namespaces/ml/events", "Event", fixture("events_ml.json")["items"])
    adapter = kube.adapter()

    await asyncio.to_thread(adapter.list_events, "ml", field_selector="involvedObject.kind=Pod", reasons=["BackOff"])
    several = await asyncio.to_thread(adapter.list_events, "ml", reasons=["BackOff", "Unhealthy"])

    assert kube.list_params[0]["fieldSelector"] == "involvedObject.kind=Pod,reason=BackOff"
    assert "fieldSelector" not in kube.list_params[1]
    assert sorted(e.reason for e in several.items) == ["BackOff", "Unhealthy"]
    unhealthy = next(e for e in several.items if e.reason == "Unhealthy")
    assert (unhealthy.involved_kind, unhealthy.count, unhealthy.type) == ("Pod", 3, "Warning")


@pytest.mark.asyncio
async def test_hpas_and_keda_scaled_objects_name_their_scale_targets(kube):
    kube.serve_list(
        "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        fixture("hpas_ml.json")["items"],
    )
    kube.serve_list(
        "/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects", "ScaledObject", fixture("scaledobjects_ml.json")["items"]
    )
    adapter = kube.adapter()

    hpas = await asyncio.to_thread(adapter.list_hpas, "ml")
    scaled = await asyncio.to_thread(adapter.list_scaled_objects, "ml")

    assert [(h.target.kind, h.target.name, h.target.group) for h in hpas.items] == [
        ("RayCluster", "vision-raycluster-7x9kq", "ray.io"),
        ("Deployment", "frontend", "apps"),
    ]
    (batch,) = scaled.items
    assert (batch.target.kind, batch.target.name, batch.triggers, batch.paused) == (
        "RayCluster",
        "batch",
        ("prometheus",),
        False,
    )
    assert scaled.warnings == []


@pytest.mark.asyncio
async def test_a_cluster_without_keda_has_no_scaled_objects_and_says_why(kube):
    kube.kmock["get /apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects"] << failure(
        404, "NotFound", "the server could not find the requested resource"
    )

    result = await asyncio.to_thread(kube.adapter().list_scaled_objects, "ml")

    assert result.items == [] and result.partial is False
    assert result.warnings == [
        "KEDA is not installed on this cluster (the API server does not serve scaledobjects.keda.sh/v1alpha1)."
    ]


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_missing_kuberay_crds_are_reported_as_such(kube):
    kube.kmock[f"get {ML}/rayservices"] << failure(404, "NotFound", "the server could not find the requested resource")

    with pytest.raises(KubeCRDNotInstalled, match="KubeRay CRDs are not installed on this cluster"):
        await asyncio.to_thread(kube.adapter().list_rayservices, "ml")


@pytest.mark.asyncio
async def test_a_404_page_from_something_else_is_not_mistaken_for_missing_crds(kube):
    kube.kmock[f"get {ML}/rayclusters"] << 404 << b"<html><body>404 page not found</body></html>"

    with pytest.raises(KubeBadResponse, match="without a Kubernetes Status"):
        await asyncio.to_thread(kube.adapter().list_rayclusters, "ml")


@pytest.mark.asyncio
async def test_a_missing_rayservice_is_not_mistaken_for_missing_crds(kube):
    kube.kmock[f"get {ML}/rayservices/vision"] << failure(
        404, "NotFound", 'rayservices.ray.io "vision" not found', name="vision", group="ray.io", kind="rayservices"
    )

    with pytest.raises(KubeNotFound) as caught:
        await asyncio.to_thread(kube.adapter().get_rayservice, "ml", "vision")

    assert not isinstance(caught.value, KubeCRDNotInstalled)
    assert caught.value.message == "RayService ml/vision does not exist."


@pytest.mark.asyncio
async def test_rejected_credentials_raise_unauthorized_and_are_not_transient(kube):
    kube.serve_list(f"{ML}/rayclusters", "RayCluster", [fixture("raycluster_vision.json")])

    with pytest.raises(KubeUnauthorized) as caught:
        await asyncio.to_thread(kube.adapter(token="expired-token").list_rayclusters, "ml")

    assert caught.value.status == 401 and caught.value.transient is False
    assert "missing, expired or revoked" in caught.value.message


@pytest.mark.asyncio
async def test_a_forbidden_get_names_the_verb_resource_and_namespace(kube):
    kube.kmock[f"get {ML}/rayservices/vision"] << forbidden("get", "rayservices", "ray.io", "ml")

    with pytest.raises(KubeForbidden) as caught:
        await asyncio.to_thread(kube.adapter().get_rayservice, "ml", "vision")

    assert (caught.value.verb, caught.value.resource, caught.value.namespace) == ("get", "rayservices.ray.io", "ml")


@pytest.mark.asyncio
async def test_a_hanging_server_fails_as_unavailable_within_the_timeout(kube):
    release = asyncio.Event()

    async def hang():
        await release.wait()
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}

    kube.kmock["get /api/v1/namespaces/ml/pods"] << hang
    adapter = kube.adapter(timeout_s=0.5)

    started = time.monotonic()
    try:
        with pytest.raises(KubeUnavailable, match="did not answer") as caught:
            # The outer bound turns a missing client timeout into a failure instead of a hung test.
            await asyncio.wait_for(asyncio.to_thread(adapter.list_pods, "ml"), timeout=5)
    finally:
        release.set()

    assert time.monotonic() - started < 2.0
    assert caught.value.transient is True


@pytest.mark.asyncio
async def test_a_refused_connection_is_unavailable_and_transient():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    adapter = KubeAdapter.from_kubeconfig(kubeconfig(f"http://127.0.0.1:{port}"), timeout_s=2)

    with pytest.raises(KubeUnavailable, match="Cannot reach the API server") as caught:
        await asyncio.to_thread(adapter.list_rayclusters, "ml")

    assert caught.value.transient is True


@pytest.mark.asyncio
async def test_an_overloaded_api_server_is_transient(kube):
    kube.kmock["get /api/v1/namespaces/ml/pods"] << failure(503, "ServiceUnavailable", "etcdserver: leader changed")

    with pytest.raises(KubeUnavailable, match="HTTP 503") as caught:
        await asyncio.to_thread(kube.adapter().list_pods, "ml")

    assert caught.value.transient is True


# --- RayService: read, patch with resourceVersion, writer -----------------------------------


@pytest.mark.asyncio
async def test_patch_carries_the_resource_version_in_a_merge_patch_and_replaces_serve_config(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    adapter = kube.adapter()

    updated = await asyncio.to_thread(
        adapter.patch_rayservice_serve_config, "ml", "vision", "applications: []\n", "48213377"
    )

    (patch,) = kube.patches
    assert patch["content_type"] == "application/merge-patch+json"
    assert patch["body"] == {
        "metadata": {"resourceVersion": "48213377"},
        "spec": {"serveConfigV2": "applications: []\n"},
    }
    assert patch["params"]["fieldManager"] == "fleetdeck"
    assert updated.serve_config == {"applications": []}
    assert updated.resource_version == "48213378" and updated.generation == 8
    # Only serveConfigV2 changed: the embedded cluster config is intact.
    assert updated.cluster_spec.workers[0].name == "gpu-workers"


@pytest.mark.asyncio
async def test_patch_with_a_stale_resource_version_is_a_conflict_and_changes_nothing(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    kube.bump("ml", "vision")

    with pytest.raises(KubeConflict, match="changed since it was read") as caught:
        await asyncio.to_thread(
            kube.adapter().patch_rayservice_serve_config, "ml", "vision", "applications: []\n", "48213377"
        )

    assert caught.value.status == 409
    assert (
        kube.services[("ml", "vision")]["spec"]["serveConfigV2"]
        == fixture("rayservice_vision.json")["spec"]["serveConfigV2"]
    )


@pytest.mark.asyncio
async def test_read_serve_config_returns_the_config_and_its_resource_version(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))

    config, version = await asyncio.to_thread(read_serve_config, kube.adapter(), "ml", "vision")

    assert version == "48213377"
    detector = config["applications"][0]["deployments"][0]
    assert detector["autoscaling_config"]["target_ongoing_requests"] == 1


@pytest.mark.asyncio
async def test_read_serve_config_refuses_malformed_yaml_with_the_place_it_broke(kube):
    service = fixture("rayservice_vision.json")
    service["spec"]["serveConfigV2"] = "applications:\n  - name: detector\n    import_path: [vision.detector:app\n"
    kube.serve_rayservice(service)

    with pytest.raises(ServeConfigError, match=r"ml/vision: serveConfigV2 is not valid YAML \(line \d+"):
        await asyncio.to_thread(read_serve_config, kube.adapter(), "ml", "vision")


@pytest.mark.asyncio
async def test_read_serve_config_refuses_a_single_application_config(kube):
    service = fixture("rayservice_vision.json")
    service["spec"]["serveConfigV2"] = "import_path: vision.detector:app\nruntime_env: {}\n"
    kube.serve_rayservice(service)

    with pytest.raises(ServeConfigError, match="no 'applications' list"):
        await asyncio.to_thread(read_serve_config, kube.adapter(), "ml", "vision")


def _new_config() -> dict:
    config = parse_serve_config_v2(fixture("rayservice_vision.json")["spec"]["serveConfigV2"])
    config["applications"][0]["deployments"][0]["max_ongoing_requests"] = 1
    return config


@pytest.mark.asyncio
async def test_the_writer_replaces_serve_config_v2_with_the_whole_new_config(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    config = _new_config()

    await asyncio.to_thread(RayServiceWriter(kube.adapter(), "ml", "vision").push, config)

    written = kube.services[("ml", "vision")]["spec"]["serveConfigV2"]
    assert parse_serve_config_v2(written) == config
    assert written.startswith("applications:\n- name: detector\n")
    assert kube.patches[0]["body"]["metadata"]["resourceVersion"] == "48213377"


@pytest.mark.asyncio
async def test_the_writer_does_not_write_a_config_that_is_already_there(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    same = parse_serve_config_v2(fixture("rayservice_vision.json")["spec"]["serveConfigV2"])

    await asyncio.to_thread(RayServiceWriter(kube.adapter(), "ml", "vision").push, same)

    assert kube.patches == []


@pytest.mark.asyncio
async def test_the_writer_retries_a_conflict_caused_by_a_status_update_only(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    writer = RayServiceWriter(kube.adapter(), "ml", "vision")
    reads = 0

    def status_write_between_read_and_patch():
        nonlocal reads
        reads += 1
        served = copy.deepcopy(kube.services[("ml", "vision")])
        if reads == 1:
            kube.bump("ml", "vision")  # KubeRay updates the status right after our read
        return served

    (kube.kmock[f"get {ML}/rayservices/vision"] ** 1) << status_write_between_read_and_patch

    await asyncio.to_thread(writer.push, _new_config())

    assert [p["body"]["metadata"]["resourceVersion"] for p in kube.patches] == ["48213377", "48213378"]
    assert parse_serve_config_v2(kube.services[("ml", "vision")]["spec"]["serveConfigV2"]) == _new_config()


@pytest.mark.asyncio
async def test_the_writer_stops_with_drift_when_someone_else_changed_serve_config(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    reads = 0

    def someone_applies_between_read_and_patch():
        nonlocal reads
        reads += 1
        served = copy.deepcopy(kube.services[("ml", "vision")])
        if reads == 1:
            kube.bump(
                "ml", "vision", serve_config_v2="applications:\n- name: detector\n  import_path: vision.detector:app\n"
            )
        return served

    (kube.kmock[f"get {ML}/rayservices/vision"] ** 1) << someone_applies_between_read_and_patch

    with pytest.raises(RayServiceDrift, match="changed by someone else"):
        await asyncio.to_thread(RayServiceWriter(kube.adapter(), "ml", "vision").push, _new_config())

    assert len(kube.patches) == 1  # the refused one
    assert "thumbnails" not in kube.services[("ml", "vision")]["spec"]["serveConfigV2"]


@pytest.mark.asyncio
async def test_the_writer_refuses_to_push_over_a_config_that_is_not_the_planned_base(kube):
    kube.serve_rayservice(fixture("rayservice_vision.json"))
    base = _new_config()  # planned against a config the cluster does not hold

    with pytest.raises(RayServiceDrift, match="no longer the config this change was planned against"):
        await asyncio.to_thread(
            RayServiceWriter(kube.adapter(), "ml", "vision", expected_base=base).push, {"applications": []}
        )

    assert kube.patches == []


def test_a_config_without_applications_cannot_be_dumped_for_kuberay():
    with pytest.raises(ServeConfigError, match="applications"):
        dump_serve_config({"http_options": {"port": 8000}})


@pytest.mark.asyncio
async def test_status_reports_running_applications_only_once_kuberay_reconciled_the_generation(kube):
    service = fixture("rayservice_vision.json")
    kube.serve_rayservice(service)
    adapter = kube.adapter()

    healthy = await asyncio.to_thread(status, adapter, "ml", "vision")
    kube.bump("ml", "vision", serve_config_v2="applications: []\n")
    pending = await asyncio.to_thread(status, adapter, "ml", "vision")

    assert healthy.waiting_for(["detector", "thumbnails"]) == []
    assert healthy.cluster_name == "vision-raycluster-7x9kq" and healthy.ready
    assert pending.observed is False
    assert pending.waiting_for(["detector"]) == ["KubeRay has not reconciled generation 8 of ml/vision yet"]


@pytest.mark.asyncio
async def test_status_names_the_applications_and_deployments_not_yet_healthy(kube):
    service = fixture("rayservice_vision.json")
    apps = service["status"]["activeServiceStatus"]["applicationStatuses"]
    apps["detector"]["status"] = "DEPLOYING"
    apps["thumbnails"]["serveDeploymentStatuses"]["Thumbnailer"]["status"] = "UPDATING"
    kube.serve_rayservice(service)

    health = await asyncio.to_thread(status, kube.adapter(), "ml", "vision")

    assert health.waiting_for(["detector", "thumbnails", "ocr"]) == [
        "detector: DEPLOYING",
        "thumbnails/Thumbnailer: UPDATING",
        "ocr: not reported by KubeRay",
    ]


@pytest.mark.asyncio
async def test_status_does_not_verify_while_kuberay_upgrades_to_a_new_cluster(kube):
    service = fixture("rayservice_vision.json")
    upgrade = next(c for c in service["status"]["conditions"] if c["type"] == "UpgradeInProgress")
    upgrade.update(status="True", reason="BothActivePendingClustersExist")
    service["status"]["pendingServiceStatus"]["rayClusterName"] = "vision-raycluster-q8d4m"
    kube.serve_rayservice(service)

    health = await asyncio.to_thread(status, kube.adapter(), "ml", "vision")

    assert health.upgrading is True and health.pending_cluster_name == "vision-raycluster-q8d4m"
    assert health.waiting_for(["detector"]) == [
        "KubeRay is upgrading ml/vision to a new RayCluster (vision-raycluster-q8d4m); "
        "the active cluster's statuses are not the new config's"
    ]
