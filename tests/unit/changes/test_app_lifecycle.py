"""Deploying and deleting whole applications: the pure planning and checks on captured Ray 2.60
payloads, and the protocol, the API and the pages against a replayed dashboard that takes a PUT
the way Ray does (a new application runs or goes DEPLOY_FAILED, a missing one goes)."""

from __future__ import annotations

import copy
import json

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent
from apps.changes import lifecycle, protocol
from apps.changes.app_validation import validate_application
from apps.changes.models import Change, ChangeState
from apps.changes.planner import PlanError
from apps.fleet import sync
from integrations.ray.parsing import parse_serve_status
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory

NEW_APP = {
    "name": "echo3",
    "route_prefix": "/echo3",
    "import_path": "demo_app:echo_only",
    "runtime_env": {
        "working_dir": "https://example.test/demo_app.zip",
        "pip": ["requests==2.32.3"],
        "env_vars": {"MODE": "prod"},
    },
    "args": {"greeting": "hi"},
    "deployments": [{"name": "Echo", "num_replicas": 2, "max_ongoing_requests": 7}],
}
BAD_IMPORT = ray_fixture("serve_applications_deploy_failed_bad_import.json")["applications"]["echo2"]


def two_apps():
    return parse_serve_status(ray_fixture("serve_applications_two_apps.json"))


def names(config: dict) -> list[str]:
    return [app["name"] for app in config["applications"]]


# --- planning (pure) -----------------------------------------------------------------------


def test_a_new_application_is_added_to_the_live_config_and_the_others_are_sent_as_they_run():
    serve = two_apps()
    plan = lifecycle.plan_create(serve, NEW_APP)

    assert names(plan.new_config) == ["demo", "echo2", "echo3"]
    for name in ("demo", "echo2"):
        sent = next(app for app in plan.new_config["applications"] if app["name"] == name)
        assert sent == serve.applications[name].deployed_app_config
    assert plan.warnings == ["Adds application echo3 at /echo3."]
    assert any('+  "name": "echo3"' in line or '"name": "echo3"' in line for line in plan.diff)
    assert plan.json_patch == [{"op": "add", "path": "/applications/2", "value": NEW_APP}]


@pytest.mark.parametrize(
    "app, message",
    [
        ({**NEW_APP, "name": "echo2"}, "An application named 'echo2' already runs"),
        ({**NEW_APP, "route_prefix": "/demo"}, "Route prefix '/demo' is taken by application 'demo'"),
    ],
)
def test_a_name_or_route_prefix_already_taken_is_refused(app, message):
    with pytest.raises(PlanError, match=message):
        lifecycle.plan_create(two_apps(), app)


def test_a_deletion_plan_removes_only_that_application_and_says_what_goes():
    serve = two_apps()
    plan = lifecycle.plan_delete(serve, "echo2")

    assert names(plan.new_config) == ["demo"]
    assert plan.new_config["applications"][0] == serve.applications["demo"].deployed_app_config
    assert plan.warnings == ["Deletes application echo2 and its deployments: Echo (1 replica)."]
    assert lifecycle.plan_delete(serve, "demo").warnings == [
        "Deletes application demo and its deployments: Echo (1 replica), Model (1 replica)."
    ]


def test_deleting_an_unknown_application_names_the_ones_there_are():
    with pytest.raises(PlanError, match=r"No application 'ghost' on this cluster \(it has: demo, echo2\)"):
        lifecycle.plan_delete(two_apps(), "ghost")


def test_deleting_an_application_another_one_holds_a_handle_to_is_refused():
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployment_topology"]["nodes"]["Echo"]["outbound_deployments"].append(
        {"name": "Echo", "app_name": "echo2"}
    )
    serve = parse_serve_status(payload)

    assert serve.applications["demo"].calls == ("echo2",)
    with pytest.raises(PlanError, match=r"called by other applications.*demo holds a handle to it"):
        lifecycle.plan_delete(serve, "echo2")
    # The application's own deployments calling each other are no caller of anything else.
    assert lifecycle.callers_of(serve, "demo") == []


def test_deleting_an_application_another_ones_args_name_is_refused():
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployed_app_config"]["args"] = {"upstream": {"app": "echo2"}}

    with pytest.raises(PlanError, match=r"demo's args.upstream.app names it"):
        lifecycle.plan_delete(parse_serve_status(payload), "echo2")


def test_a_deletion_is_verified_once_the_application_is_gone_and_the_others_run_as_planned():
    serve = two_apps()
    remaining = lifecycle.plan_delete(serve, "echo2").new_config

    assert lifecycle.verify_gone(serve, ["echo2"], remaining).waiting_for == ["echo2: still listed (RUNNING)"]
    gone = parse_serve_status(ray_fixture("serve_applications_after_put_without_demo.json"))
    assert lifecycle.verify_gone(
        gone, ["demo"], {"applications": [serve.applications["echo2"].deployed_app_config]}
    ).done
    changed = copy.deepcopy(remaining)
    changed["applications"][0]["route_prefix"] = "/elsewhere"
    assert lifecycle.others_unchanged(serve, changed) == [
        "demo: its config changed, though this change does not touch it"
    ]
    assert lifecycle.others_unchanged(gone, remaining) == [
        "demo: no longer listed, though this change does not touch it"
    ]


# --- the application's own checks ------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        ({"runtime_env": {"working_dir": "/opt/demo-app"}}, "runtime_env.working_dir: '/opt/demo-app' is not a URI"),
        ({"route_prefix": "echo3"}, "route_prefix: 'echo3' must start with '/'"),
        ({"route_prefix": "/echo3/"}, "must not end with '/'"),
        ({"runtime_env": {"env_vars": {"WORKERS": 4}}}, "env_vars: give a mapping of names to strings"),
        ({"import_path": "nodots"}, "import_path: Value error, Got invalid import path"),
        ({"name": "has space"}, "is not an application name"),
        ({"max_concurrent_queries": 4}, "Serve does not know this application field"),
        ({"deployments": [{"name": "Echo", "max_concurrent_queries": 2}]}, "deployments.Echo: max_concurrent_queries"),
        ({"deployments": [{"name": "Echo", "max_ongoing_requests": 0}]}, "deployments.Echo: max_ongoing_requests"),
        ({"deployments": [{"num_replicas": 1}]}, "each entry needs the deployment's name"),
    ],
)
def test_bad_application_configs_are_refused_with_what_to_change(change, message):
    with pytest.raises(ValidationError) as refused:
        validate_application({**NEW_APP, **change})
    assert any(message in problem for problem in refused.value.messages), refused.value.messages


def test_a_good_application_config_passes_fleetdecks_checks_and_serves_schema():
    assert validate_application(copy.deepcopy(NEW_APP)) == NEW_APP
    assert validate_application({"name": "bare", "import_path": "m:app", "route_prefix": None})["route_prefix"] is None


# --- the protocol, against a dashboard that takes a PUT the way Ray does ----------------------


class RayTakesPuts:
    """The dashboard's Serve state: a PUT stamps every application, keeps the ones sent unchanged
    as they run (same replicas), removes those not sent, and adds new ones, RUNNING with the options
    sent or, for an import path that does not import, DEPLOY_FAILED with Ray's captured message."""

    def __init__(self):
        self.payload = ray_fixture("serve_applications_two_apps.json")
        self.pushes: list[dict] = []
        # Applications the next PUT that drops them leaves DELETING instead of removing.
        self.stuck_deleting: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            config = json.loads(request.content)
            self.pushes.append(config)
            self.apply(config)
            return httpx.Response(200, text="")
        return httpx.Response(200, json=self.payload)

    def apply(self, config: dict) -> None:
        apps = self.payload["applications"]
        stamp = max(app["last_deployed_time_s"] for app in apps.values()) + 1
        sent = {app["name"]: app for app in config["applications"]}
        for name in set(apps) - set(sent):
            if name in self.stuck_deleting:
                apps[name]["status"] = "DELETING"
            else:
                del apps[name]
        self.stuck_deleting = set()
        for name, app in sent.items():
            if name in apps:
                apps[name]["status"] = "RUNNING"
            else:
                apps[name] = self.new_application(app)
            apps[name]["deployed_app_config"] = copy.deepcopy(app)
            apps[name]["last_deployed_time_s"] = stamp

    def new_application(self, app: dict) -> dict:
        if app["import_path"].startswith("no_such_module"):
            return {**copy.deepcopy(BAD_IMPORT), "name": app["name"], "route_prefix": app.get("route_prefix")}
        echo = copy.deepcopy(ray_fixture("serve_applications_two_apps.json")["applications"]["echo2"])
        dep = echo["deployments"]["Echo"]
        for entry in app.get("deployments", []):
            dep["deployment_config"].update({k: v for k, v in entry.items() if k != "name"})
        return {**echo, "name": app["name"], "route_prefix": app.get("route_prefix")}


@pytest.fixture
def ray(use_replay, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 5
    settings.FLEETDECK_CHANGE_POLL_S = 0.01
    fake = RayTakesPuts()
    use_replay.routes["/api/serve/applications/"] = fake
    return fake


@pytest.fixture
def cluster(db, team, ray):
    cluster = ClusterFactory(name="vision-prod", team=team)
    sync.sync_cluster(cluster.pk)
    return cluster


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"], via="api")


def test_a_new_application_is_pushed_with_every_other_one_untouched_and_verified(cluster, operator, ray):
    before = copy.deepcopy(ray.payload["applications"])
    change = protocol.plan_create_app(operator, cluster, app=NEW_APP, reason="new route")
    assert change.kind == Change.Kind.CREATE_APP and change.targets == ["echo3"] and not ray.pushes

    protocol.request_apply(operator, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    (pushed,) = ray.pushes
    for name in ("demo", "echo2"):
        assert next(app for app in pushed["applications"] if app["name"] == name) == before[name]["deployed_app_config"]
        assert ray.payload["applications"][name]["deployments"] == before[name]["deployments"]
    assert {"change.plan", "change.apply", "change.succeeded"} <= set(
        AuditEvent.objects.values_list("action", flat=True)
    )


def test_an_import_path_that_does_not_import_is_rolled_back_by_removing_the_new_application(cluster, operator, ray):
    before = copy.deepcopy(ray.payload["applications"])
    change = protocol.plan_create_app(
        operator, cluster, app={**NEW_APP, "import_path": "no_such_module_xyz:app"}, reason="typo"
    )
    protocol.request_apply(operator, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.ROLLED_BACK
    assert "echo3 is DEPLOY_FAILED" in change.error
    assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in change.error
    assert change.steps.last().message == "Rolled back: echo3 was removed; every other application runs as before."
    _forward, back = ray.pushes
    assert names(back) == ["demo", "echo2"] and back == change.base_config
    assert set(ray.payload["applications"]) == {"demo", "echo2"}
    for name in ("demo", "echo2"):
        assert ray.payload["applications"][name]["deployments"] == before[name]["deployments"]


def test_a_new_application_with_no_deployment_options_is_still_waited_for(cluster, operator, ray):
    app = {"name": "echo3", "route_prefix": "/echo3", "import_path": "no_such_module_xyz:app"}
    change = protocol.plan_create_app(operator, cluster, app=app, reason="typo")
    protocol.request_apply(operator, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.ROLLED_BACK and "echo3 is DEPLOY_FAILED" in change.error


def test_a_deletion_needs_the_name_typed_and_then_removes_only_that_application(cluster, operator, ray):
    change = protocol.plan_delete_app(operator, cluster, application="echo2", reason="retired")

    for typed in (None, "", "demo", "echo"):
        with pytest.raises(protocol.ConfirmationMismatch, match="Type the application's name, echo2"):
            protocol.request_apply(operator, change, confirm=typed)
    change.refresh_from_db()
    assert change.state == ChangeState.PLANNED and not ray.pushes

    protocol.request_apply(operator, change, confirm="echo2")
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert change.steps.last().message == "Verified: echo2 is gone and every other application runs as before."
    (pushed,) = ray.pushes
    assert names(pushed) == ["demo"] and set(ray.payload["applications"]) == {"demo"}


def test_a_deletion_that_ray_does_not_carry_out_is_rolled_back_to_the_application_running(
    cluster, operator, ray, settings
):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 0.5
    ray.stuck_deleting = {"echo2"}
    change = protocol.plan_delete_app(operator, cluster, application="echo2", reason="retired")
    protocol.request_apply(operator, change, confirm="echo2")
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.ROLLED_BACK, change.error
    assert "echo2: still listed (DELETING)" in change.error
    assert ray.pushes[-1] == change.base_config
    assert ray.payload["applications"]["echo2"]["status"] == "RUNNING"


def test_a_drifted_cluster_stops_a_creation_before_anything_is_pushed(cluster, operator, ray):
    change = protocol.plan_create_app(operator, cluster, app=NEW_APP, reason="new route")
    ray.payload["applications"]["echo2"]["deployed_app_config"]["deployments"][0]["user_config"] = {"greeting": "yo"}
    protocol.request_apply(operator, change)
    protocol.run(change.pk)

    change.refresh_from_db()
    assert change.state == ChangeState.DRIFTED and not ray.pushes


# --- the API and the pages -----------------------------------------------------------------


def test_the_api_plans_a_new_application_and_refuses_bad_input_with_nothing_saved(api_as, cluster, ray):
    client = api_as("operator")
    body = {"cluster": cluster.pk, "application": NEW_APP, "reason": "new route"}
    created = client.post("/api/v1/changes/create-application/", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["kind"] == "create_app" and created.json()["warnings"] == [
        "Adds application echo3 at /echo3."
    ]

    for application, field in (
        ({**NEW_APP, "name": "echo2"}, "already runs"),
        ({**NEW_APP, "runtime_env": {"working_dir": "/opt/demo-app"}}, "is not a URI"),
        ({**NEW_APP, "route_prefix": "/echo2"}, "is taken by application 'echo2'"),
        ({**NEW_APP, "logging": {}}, "Serve does not know this application field"),
    ):
        refused = client.post(
            "/api/v1/changes/create-application/", {**body, "application": application}, format="json"
        )
        assert refused.status_code == 400 and field in refused.content.decode(), refused.content
    assert Change.objects.count() == 1 and not ray.pushes
    assert api_as("viewer").post("/api/v1/changes/create-application/", body, format="json").status_code == 403


def test_the_api_deletes_with_the_name_typed_as_confirmation(api_as, cluster, ray):
    client = api_as("operator")
    planned = client.post(
        "/api/v1/changes/delete-application/",
        {"cluster": cluster.pk, "application": "echo2", "reason": "retired"},
        format="json",
    )
    assert planned.status_code == 201, planned.content
    assert planned.json()["warnings"] == ["Deletes application echo2 and its deployments: Echo (1 replica)."]
    change_id = planned.json()["id"]

    wrong = client.post(f"/api/v1/changes/{change_id}/apply/", {"confirm": "demo"}, format="json")
    assert wrong.status_code == 400 and "Type the application's name, echo2" in wrong.json()["confirm"][0]
    applied = client.post(f"/api/v1/changes/{change_id}/apply/", {"confirm": "echo2"}, format="json")
    assert applied.status_code == 202 and applied.json()["state"] == "queued"
    assert api_as("viewer").post(f"/api/v1/changes/{change_id}/apply/", {"confirm": "echo2"}).status_code == 403


def test_the_openapi_schema_documents_both_endpoints_and_the_confirmation(api_as):
    schema = api_as("viewer").get("/api/schema/", {"format": "json"}).json()
    assert "/api/v1/changes/create-application/" in schema["paths"]
    assert "/api/v1/changes/delete-application/" in schema["paths"]
    assert "import_path" in schema["components"]["schemas"]["NewApplicationRequest"]["properties"]
    assert "confirm" in schema["components"]["schemas"]["ChangeApplyRequest"]["properties"]


def test_the_pages_plan_a_deployment_and_a_deletion_that_is_applied_with_its_name(client, people, cluster, ray):
    client.force_login(people["operator"])
    page = client.post(
        reverse("changes:deploy_application", args=[cluster.pk]),
        {
            "name": "echo3",
            "route_prefix": "/echo3",
            "import_path": "demo_app:echo_only",
            "runtime_env": "env_vars:\n  MODE: prod\nworking_dir: /opt/demo-app\n",
            "deployments": "- name: Echo\n  num_replicas: 2\n",
            "reason": "new route",
        },
    )
    assert page.status_code == 200 and "is not a URI" in page.content.decode() and not Change.objects.exists()

    planned = client.post(
        reverse("changes:delete_application", args=[cluster.pk]), {"application": "echo2", "reason": "retired"}
    )
    change = Change.objects.get()
    assert planned.status_code == 302 and change.kind == Change.Kind.DELETE_APP
    detail = client.get(reverse("changes:detail", args=[change.pk])).content.decode()
    assert "Deletes application echo2 and its deployments: Echo (1 replica)." in detail
    assert 'name="confirm"' in detail

    client.post(reverse("changes:action", args=[change.pk, "apply"]), {"confirm": "echo"}, follow=True)
    change.refresh_from_db()
    assert change.state == ChangeState.PLANNED
    client.post(reverse("changes:action", args=[change.pk, "apply"]), {"confirm": "echo2"})
    change.refresh_from_db()
    assert change.state == ChangeState.QUEUED


LLM_APP = {
    "name": "llm",
    "route_prefix": "/llm",
    "import_path": "ray.serve.llm:build_openai_app",
    "args": {
        "llm_configs": [
            {
                "model_loading_config": {"model_id": "meta-llama/Meta-Llama-3-8B-Instruct"},
                "accelerator_type": "H100",
                "engine_kwargs": {"max_model_len": 8192, "gpu_memory_utilisation": 0.9},
            }
        ]
    },
}


def test_a_serve_llm_app_with_an_unknown_engine_argument_is_refused_and_nothing_is_pushed(cluster, operator, ray):
    with pytest.raises(protocol.ChangeRefused) as refused:
        protocol.plan_create_app(operator, cluster, app=LLM_APP, reason="serve llama")

    (message,) = refused.value.messages
    assert message.startswith(
        "llm: llm_configs[0].engine_kwargs: unknown vLLM engine argument 'gpu_memory_utilisation'"
    )
    assert 'serve.llm fails with "Unknown engine argument: gpu_memory_utilisation"' in message
    assert not ray.pushes and not Change.objects.exists()


def test_a_valid_serve_llm_app_is_planned(cluster, operator, ray):
    app = copy.deepcopy(LLM_APP)
    kwargs = app["args"]["llm_configs"][0]["engine_kwargs"]
    kwargs["gpu_memory_utilization"] = kwargs.pop("gpu_memory_utilisation")

    change = protocol.plan_create_app(operator, cluster, app=app, reason="serve llama")

    assert change.kind == Change.Kind.CREATE_APP and change.targets == ["llm"] and not ray.pushes
