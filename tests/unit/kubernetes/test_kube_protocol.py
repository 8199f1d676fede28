"""The push protocol on a cluster whose Serve config a KubeRay RayService owns: planned against
the dashboard (replayed Ray payloads), pushed by patching the RayService in kmock with its
resourceVersion, verified through the dashboard and the RayService status."""

from __future__ import annotations

import copy

import httpx
import pytest
import yaml

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.kubernetes.models import KubeLink
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory, KubeLinkFactory
from tests.kubeapi import ML, connection, kube  # noqa: F401  (fixture)
from tests.unit.integrations.test_kube_adapter import failure, fixture, forbidden

pytestmark = pytest.mark.django_db
SERVICE = f"{ML}/rayservices/vision"
MODEL = [{"application": "demo", "deployment": "Model"}]


@pytest.fixture(autouse=True)
def quick_verification(settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 5
    settings.FLEETDECK_CHANGE_POLL_S = 0.05


@pytest.fixture
def cluster(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team, serve_config_owner=Cluster.ConfigOwner.RAYSERVICE)
    sync.sync_cluster(cluster.pk)
    return cluster


def served_config() -> dict:
    """serveConfigV2 of the RayService behind the replayed dashboard: its applications in another
    order than the dashboard's, and http_options, which the dashboard's config does not carry."""
    apps = ray_fixture("serve_applications_two_apps.json")["applications"]
    return {
        "http_options": {"port": 8000},
        "applications": [apps["echo2"]["deployed_app_config"], apps["demo"]["deployed_app_config"]],
    }


@pytest.fixture
def rayservice(kube):
    service = fixture("rayservice_vision.json")
    service["spec"]["serveConfigV2"] = yaml.safe_dump(served_config(), sort_keys=False)
    service["status"]["activeServiceStatus"]["applicationStatuses"] = {
        "demo": {
            "status": "RUNNING",
            "serveDeploymentStatuses": {"Echo": {"status": "HEALTHY"}, "Model": {"status": "HEALTHY"}},
        },
        "echo2": {"status": "RUNNING", "serveDeploymentStatuses": {"Echo": {"status": "HEALTHY"}}},
    }
    kube.serve_rayservice(service)
    return kube.services[("ml", "vision")]


def link(kube, cluster, *, read_only=False) -> KubeLink:
    return KubeLinkFactory(cluster=cluster, connection=connection(kube, cluster.team, read_only=read_only))


def kuberay_applies(kube, replay) -> None:
    """What KubeRay and Serve do with a new serveConfigV2: the dashboard runs it (a new deploy
    stamp, the effective config updated) and the RayService status reconciles the generation."""
    payload = ray_fixture("serve_applications_two_apps.json")

    def serve_applications(request):
        service = kube.services[("ml", "vision")]
        for app in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]:
            live = payload["applications"][app["name"]]
            if live["deployed_app_config"] != app:
                live["deployed_app_config"] = copy.deepcopy(app)
                live["last_deployed_time_s"] += 1
                for entry in app.get("deployments", []):
                    _merge(live["deployments"][entry["name"]]["deployment_config"], entry)
        service["status"]["observedGeneration"] = service["metadata"]["generation"]
        return httpx.Response(200, json=payload)

    replay.routes["/api/serve/applications/"] = serve_applications


def _merge(target: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def apply(cluster, people) -> Change:
    actor = Actor(user=people["operator"])
    change = protocol.plan_change(
        actor, cluster, targets=MODEL, reason="bound the queue", options={"max_queued_requests": 10}
    )
    protocol.request_apply(actor, change)
    protocol.run(change.pk)
    change.refresh_from_db()
    return change


def test_a_rayservice_owned_change_patches_serve_config_v2_and_verifies(kube, cluster, rayservice, people, use_replay):
    link(kube, cluster)
    kuberay_applies(kube, use_replay)

    change = apply(cluster, people)

    assert change.state == ChangeState.SUCCEEDED, change.error
    (patch,) = kube.patches
    assert patch["body"]["metadata"]["resourceVersion"] == "48213377"
    written = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    # Keys the plan never saw are kept, and so is the RayService's order of applications.
    assert written["http_options"] == {"port": 8000}
    assert [app["name"] for app in written["applications"]] == ["echo2", "demo"]
    model = next(d for d in written["applications"][1]["deployments"] if d["name"] == "Model")
    assert model["max_queued_requests"] == 10
    assert all(request.method == "GET" for request in use_replay.requests), "never pushed through the dashboard"


def test_verification_waits_for_kuberay_to_reconcile_the_new_generation(
    kube, cluster, rayservice, people, use_replay, settings
):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 1
    link(kube, cluster)
    kuberay_applies(kube, use_replay)
    applied = use_replay.routes["/api/serve/applications/"]

    def dashboard_runs_it_but_kuberay_lags(request):
        response = applied(request)
        rayservice["status"]["observedGeneration"] = 7
        return response

    use_replay.routes["/api/serve/applications/"] = dashboard_runs_it_but_kuberay_lags

    change = apply(cluster, people)

    # Rolled back through the RayService too, and KubeRay, still lagging, cannot confirm that either.
    assert change.state == ChangeState.ROLLBACK_FAILED
    assert "KubeRay has not reconciled generation 8" in change.error
    assert [p["body"]["metadata"]["resourceVersion"] for p in kube.patches] == ["48213377", "48213378"]
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == served_config()


def test_a_409_conflict_from_someone_elses_edit_ends_the_change_drifted(kube, cluster, rayservice, people, use_replay):
    link(kube, cluster)
    reads = 0

    def someone_applies_between_our_read_and_patch():
        nonlocal reads
        reads += 1
        served = copy.deepcopy(kube.services[("ml", "vision")])
        if reads == 2:  # the writer's own read, right before its patch
            kube.bump(
                "ml", "vision", serve_config_v2=yaml.safe_dump({"applications": served_config()["applications"][:1]})
            )
        return served

    (kube.kmock[f"get {SERVICE}"] ** 1) << someone_applies_between_our_read_and_patch

    change = apply(cluster, people)

    assert change.state == ChangeState.DRIFTED
    assert "re-plan" in change.error
    assert len(kube.patches) == 1  # refused with 409: the resourceVersion was stale
    assert [app["name"] for app in yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]] == ["echo2"]


def test_an_edit_kuberay_has_not_applied_yet_is_drift_and_nothing_is_written(
    kube, cluster, rayservice, people, use_replay
):
    link(kube, cluster)
    # Someone applied the RayService; the dashboard (replayed) still runs the old config.
    kube.bump("ml", "vision", serve_config_v2=yaml.safe_dump({"applications": served_config()["applications"][:1]}))

    change = apply(cluster, people)

    assert change.state == ChangeState.DRIFTED
    assert "does not hold the config this change was planned against" in change.error and "re-plan" in change.error
    assert kube.patches == []


def test_a_forbidden_patch_fails_the_change_with_the_rbac_message(kube, cluster, rayservice, people, use_replay):
    link(kube, cluster)
    (kube.kmock[f"patch {SERVICE}"] ** 1) << forbidden("patch", "rayservices", "ray.io", "ml")

    change = apply(cluster, people)

    assert change.state == ChangeState.FAILED
    assert "Forbidden to patch rayservices.ray.io in namespace ml" in change.error
    assert "grant Fleetdeck's account 'patch'" in change.error
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == served_config()


def test_an_unavailable_api_server_that_wrote_nothing_fails_the_change_as_unchanged(
    kube, cluster, rayservice, people, use_replay
):
    link(kube, cluster)
    (kube.kmock[f"patch {SERVICE}"] ** 1) << failure(503, "ServiceUnavailable", "etcdserver: leader changed")

    change = apply(cluster, people)

    assert change.state == ChangeState.FAILED
    assert change.error.startswith("The RayService was not changed") and "HTTP 503" in change.error


def test_a_read_only_connection_refuses_the_change_with_the_reason(kube, cluster, rayservice, people, use_replay):
    link(kube, cluster, read_only=True)

    change = apply(cluster, people)

    assert change.state == ChangeState.FAILED
    assert "read-only" in change.error and "RayService" in change.error
    assert kube.patches == []


def test_a_cluster_linked_to_a_raycluster_is_not_pushed_through_the_dashboard_either(kube, cluster, people, use_replay):
    KubeLinkFactory(
        cluster=cluster,
        connection=connection(kube, cluster.team, read_only=False),
        kind=KubeLink.Kind.RAYCLUSTER,
        name="batch",
    )

    change = apply(cluster, people)

    assert change.state == ChangeState.FAILED and "not to a RayService" in change.error
    assert all(request.method == "GET" for request in use_replay.requests)


def test_discovery_inspection_and_a_change_call_exactly_what_the_rbac_roles_grant(
    kube, cluster, rayservice, people, use_replay
):
    from apps.kubernetes import discovery, inspection
    from integrations.kubernetes.kinds import READS, WRITES
    from tests.kubeapi import serve_namespace

    serve_namespace(kube, rayclusters=[fixture("raycluster_vision.json")], scaled_objects=[])
    linked = link(kube, cluster)
    kuberay_applies(kube, use_replay)

    discovery.discover(linked.connection)
    inspection.inspect(cluster.pk)
    assert apply(cluster, people).state == ChangeState.SUCCEEDED

    # What the API server was asked, as RBAC names its verbs.
    verbs = {"LIST": "list", "FETCH": "get", "UPDATE": "patch", "WATCH": "watch", "CREATE": "create"}
    called = {(request.resource.group, request.resource.plural, verbs[request.action.value]) for request in kube.kmock}
    granted = {
        (group, plural, verb)
        for access in (READS, WRITES)
        for (group, plural), verbs in access.items()
        for verb in verbs
    }
    assert called == granted


def kuberay_runs_whole_applications(kube, replay) -> None:
    """KubeRay and Serve given a serveConfigV2 that adds or drops an application: the dashboard
    lists exactly its applications (a new one RUNNING like echo2), and the status reports them."""
    payload = ray_fixture("serve_applications_two_apps.json")
    template = copy.deepcopy(payload["applications"]["echo2"])

    def serve_applications(request):
        service = kube.services[("ml", "vision")]
        wanted = {app["name"]: app for app in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]}
        apps = payload["applications"]
        for name in set(apps) - set(wanted):
            del apps[name]
        for name, app in wanted.items():
            if name not in apps:
                apps[name] = {**copy.deepcopy(template), "name": name, "route_prefix": app.get("route_prefix")}
                apps[name]["deployed_app_config"] = copy.deepcopy(app)
                apps[name]["last_deployed_time_s"] += 1
        statuses = service["status"]["activeServiceStatus"]["applicationStatuses"]
        for name in wanted:
            statuses.setdefault(name, {"status": "RUNNING", "serveDeploymentStatuses": {"Echo": {"status": "HEALTHY"}}})
        service["status"]["observedGeneration"] = service["metadata"]["generation"]
        return httpx.Response(200, json=payload)

    replay.routes["/api/serve/applications/"] = serve_applications


def test_a_new_application_on_a_rayservice_owned_cluster_is_written_to_serve_config_v2(
    kube, cluster, rayservice, people, use_replay
):
    link(kube, cluster)
    kuberay_runs_whole_applications(kube, use_replay)
    actor = Actor(user=people["operator"])
    app = {"name": "echo3", "route_prefix": "/echo3", "import_path": "demo_app:echo_only"}

    change = protocol.plan_create_app(actor, cluster, app=app, reason="new route")
    protocol.request_apply(actor, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    written = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert [a["name"] for a in written["applications"]] == ["echo2", "demo", "echo3"]
    assert written["applications"][2] == app and written["http_options"] == {"port": 8000}
    assert written["applications"][:2] == served_config()["applications"]
    assert all(request.method == "GET" for request in use_replay.requests), "never pushed through the dashboard"


def test_deleting_an_application_on_a_rayservice_owned_cluster_drops_it_from_serve_config_v2(
    kube, cluster, rayservice, people, use_replay
):
    link(kube, cluster)
    kuberay_runs_whole_applications(kube, use_replay)
    actor = Actor(user=people["operator"])

    change = protocol.plan_delete_app(actor, cluster, application="echo2", reason="retired")
    protocol.request_apply(actor, change, confirm="echo2")
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    written = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert written["applications"] == [served_config()["applications"][1]]
    assert all(request.method == "GET" for request in use_replay.requests), "never pushed through the dashboard"
