"""The Ray dashboard adapter against payloads captured from a real Ray 2.60 cluster."""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest

from integrations.ray.dashboard import STATE_API_MAX_LIMIT, USER_AGENT, RayDashboard
from integrations.ray.errors import RayAuthRefused, RayBadResponse, RayTimeout, RayUnreachable
from tests.conftest import ReplayRay, ray_fixture

SERVE = "/api/serve/applications/"
ACTORS = "/api/v0/actors"
NODES = "/api/v0/nodes"


def dashboard(routes: dict | None = None, token: str = "") -> tuple[RayDashboard, ReplayRay]:
    replay = ReplayRay(routes)
    return replay.dashboard(token=token), replay


def is_sentence(message: str) -> bool:
    """A message a person can read: one line, starts with a capital or a path, ends like a sentence."""
    return "\n" not in message and (message[:1].isupper() or message.startswith("/")) and message.endswith((".", "?"))


def envelope_response(name: str, *, status: int | None = None) -> httpx.Response:
    """Replay an envelope fixture ({request, status, content_type, body}) as Ray answered it."""
    envelope = ray_fixture(name)
    body = envelope["body"]
    status = envelope["status"] if status is None else status
    if isinstance(body, str):
        return httpx.Response(status, text=body, headers={"content-type": envelope["content_type"]})
    return httpx.Response(status, json=body)


# --- version and authentication mode -------------------------------------------------------


def test_version_parses_the_ray_version_commit_and_session():
    ray, _ = dashboard()
    info = ray.version()
    assert info.ray_version == "2.60.0"
    assert info.ray_commit == "b7f4259e944bf6959f721b106adc366ddfa0c356"
    assert info.session_name == "session_2026-11-30_13-01-48_260823_5882"


def test_authentication_mode_reads_the_mode_ray_reports():
    ray, _ = dashboard()
    assert ray.authentication_mode() == "disabled"


def test_authentication_mode_is_unsupported_when_the_endpoint_is_missing():
    ray, _ = dashboard({"/api/authentication_mode": httpx.Response(404, text="Not Found")})
    assert ray.authentication_mode() == "unsupported"


def test_authentication_mode_still_raises_a_server_failure():
    ray, _ = dashboard({"/api/authentication_mode": httpx.Response(500, text="boom")})
    with pytest.raises(RayBadResponse) as caught:
        ray.authentication_mode()
    assert caught.value.status == 500


# --- Serve applications ----------------------------------------------------------------------


@pytest.fixture
def two_apps():
    ray, _ = dashboard()
    return ray.serve_applications()


def test_serve_status_of_two_apps_lists_both_applications(two_apps):
    assert two_apps.running is True
    assert list(two_apps.applications) == ["demo", "echo2"]


def test_serve_status_reports_each_application_status_and_route_prefix(two_apps):
    demo, echo2 = two_apps.applications["demo"], two_apps.applications["echo2"]
    assert (demo.status, demo.route_prefix, demo.message) == ("RUNNING", "/demo", "")
    assert (echo2.status, echo2.route_prefix, echo2.message) == ("RUNNING", "/echo2", "")
    assert demo.source == "declarative"
    assert demo.last_deployed_time_s == pytest.approx(1796043829.498971)


def test_serve_status_lists_the_deployments_of_each_application(two_apps):
    assert list(two_apps.applications["demo"].deployments) == ["Echo", "Model"]
    assert list(two_apps.applications["echo2"].deployments) == ["Echo"]
    model = two_apps.applications["demo"].deployments["Model"]
    assert (model.name, model.status, model.status_trigger) == ("Model", "HEALTHY", "CONFIG_UPDATE_COMPLETED")


def test_serve_status_keeps_the_effective_deployment_config(two_apps):
    model = two_apps.applications["demo"].deployments["Model"]
    expected = ray_fixture("serve_applications_two_apps.json")["applications"]["demo"]["deployments"]["Model"]
    assert model.deployment_config == expected["deployment_config"]
    # The effective config carries defaults Ray filled in, absent from the submitted one.
    assert model.deployment_config["autoscaling_config"]["downscale_delay_s"] == 600.0
    assert two_apps.applications["echo2"].deployments["Echo"].deployment_config["max_ongoing_requests"] == 5


def test_serve_status_keeps_the_submitted_app_config(two_apps):
    submitted = two_apps.applications["demo"].deployed_app_config
    assert submitted["import_path"] == "demo_app:app"
    assert [d["name"] for d in submitted["deployments"]] == ["Echo", "Model"]


def test_serve_status_counts_replicas_by_state_and_keeps_the_target(two_apps):
    echo = two_apps.applications["demo"].deployments["Echo"]
    assert echo.replica_states == {"RUNNING": 1}
    assert echo.target_num_replicas == 1
    replica = echo.replicas[0]
    assert (replica.replica_id, replica.state, replica.node_ip, replica.pid) == (
        "d9y4u6u9",
        "RUNNING",
        "192.0.2.2",
        7335,
    )
    assert replica.actor_name == "SERVE_REPLICA::demo#Echo#d9y4u6u9"
    assert replica.start_time_s == pytest.approx(1796043781.9024274)


def test_serve_status_takes_the_controller_start_time_from_the_health_metrics(two_apps):
    assert two_apps.controller_start_time == pytest.approx(1796043778.1127021)
    assert two_apps.controller_actor_id == "56bb3fc94e8c587ec72595bf01000000"


def test_serve_status_reports_the_http_port(two_apps):
    assert two_apps.http_port == 8000


def test_serve_status_without_serve_is_not_running_and_has_no_applications():
    ray, _ = dashboard({SERVE: "serve_applications_no_serve.json"})
    status = ray.serve_applications()
    assert status.running is False
    assert status.applications == {}
    assert status.controller_actor_id == ""
    assert status.controller_start_time is None
    assert status.http_port is None


def test_serve_status_mid_rollout_counts_stopping_and_starting_replicas():
    ray, _ = dashboard({SERVE: "serve_applications_mid_rollout.json"})
    demo = ray.serve_applications().applications["demo"]
    echo = demo.deployments["Echo"]
    assert demo.status == "DEPLOYING"
    assert (echo.status, echo.status_trigger) == ("UPDATING", "CONFIG_UPDATE_STARTED")
    assert echo.replica_states == {"RUNNING": 1, "STARTING": 1, "STOPPING": 1}
    assert echo.target_num_replicas == 2


def test_a_starting_replica_without_pid_or_node_is_parsed():
    ray, _ = dashboard({SERVE: "serve_applications_mid_rollout.json"})
    echo = ray.serve_applications().applications["demo"].deployments["Echo"]
    starting = next(replica for replica in echo.replicas if replica.state == "STARTING")
    assert starting.replica_id == "36skf8cd"
    assert starting.pid is None
    assert starting.node_ip == ""


def test_serve_status_mid_rollout_keeps_recent_dead_replicas():
    ray, _ = dashboard({SERVE: "serve_applications_mid_rollout.json"})
    echo = ray.serve_applications().applications["demo"].deployments["Echo"]
    assert len(echo.recent_dead_replicas) == 3
    assert {replica.state for replica in echo.recent_dead_replicas} == {"STOPPED"}


def test_a_deploy_failed_application_keeps_ray_message_and_has_no_deployments():
    ray, _ = dashboard({SERVE: "serve_applications_deploy_failed_bad_import.json"})
    status = ray.serve_applications()
    echo2 = status.applications["echo2"]
    assert echo2.status == "DEPLOY_FAILED"
    assert echo2.message.startswith("Deploying app 'echo2' failed with exception:")
    assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in echo2.message
    assert echo2.deployments == {}
    assert echo2.deployed_app_config["import_path"] == "no_such_module_xyz:app"
    assert status.applications["demo"].status == "RUNNING"


def test_serve_status_without_an_applications_object_is_a_bad_response():
    ray, _ = dashboard({SERVE: {"controller_info": {}}})
    with pytest.raises(RayBadResponse) as caught:
        ray.serve_applications()
    assert "no 'applications' object" in caught.value.message


# --- state API -------------------------------------------------------------------------------


def test_list_actors_parses_the_serve_actors():
    ray, _ = dashboard({ACTORS: "state_actors_serve_running_detail.json"})
    page = ray.list_actors()
    assert (page.total, page.truncated, len(page.items)) == (4, False, 4)
    controller = next(actor for actor in page.items if actor.class_name == "ServeController")
    assert controller.actor_id == "56bb3fc94e8c587ec72595bf01000000"
    assert controller.name == "SERVE_CONTROLLER_ACTOR"
    assert (controller.state, controller.pid, controller.ray_namespace) == ("ALIVE", 7179, "serve")
    assert controller.node_id == "12b45ea53173bc350523e69ded3c2374da1a75b3a75de2b9b4024fd5"


def test_list_actors_turns_num_restarts_strings_into_integers():
    ray, _ = dashboard({ACTORS: "state_actors_serve_running_detail.json"})
    assert {actor.num_restarts for actor in ray.list_actors().items} == {0}


def test_list_actors_reads_a_restarted_controller_num_restarts():
    ray, _ = dashboard({ACTORS: "state_actors_serve_controller_after_oom_restart_detail.json"})
    (controller,) = ray.list_actors().items
    assert controller.num_restarts == 1


def test_alive_actors_have_no_death_cause():
    ray, _ = dashboard({ACTORS: "state_actors_serve_running_detail.json"})
    assert {actor.death_cause for actor in ray.list_actors().items} == {None}


def test_a_dead_oom_killed_actor_keeps_its_death_cause():
    ray, _ = dashboard({ACTORS: "state_actors_dead_oom_t1_modelonly_detail.json"})
    (actor,) = ray.list_actors(filters=[("state", "=", "DEAD")]).items
    assert actor.state == "DEAD"
    assert actor.name == "SERVE_REPLICA::modelonly#Model#lg45rpy4"
    oom = actor.death_cause["oom_context"]
    assert oom["fail_immediately"] is False
    assert "killed due to the node running low on memory" in oom["error_message"]


def test_a_filtered_actor_list_that_ray_did_not_truncate_is_not_reported_truncated():
    # Ray's envelope: total=6 actors, num_after_truncation=6 (nothing cut), num_filtered=1 after the
    # state=DEAD filter. Every matching actor came back, so the page is complete.
    ray, _ = dashboard({ACTORS: "state_actors_dead_oom_t1_modelonly_detail.json"})
    page = ray.list_actors(filters=[("state", "=", "DEAD")])
    assert len(page.items) == 1
    assert page.truncated is False


def test_list_actors_sends_filters_as_repeated_query_parameters():
    ray, replay = dashboard({ACTORS: "state_actors_dead_oom_t1_modelonly_detail.json"})
    ray.list_actors(filters=[("state", "=", "DEAD"), ("class_name", "!=", "ProxyActor")])
    params = replay.requests[-1].url.params
    assert params.get_list("filter_keys") == ["state", "class_name"]
    assert params.get_list("filter_predicates") == ["=", "!="]
    assert params.get_list("filter_values") == ["DEAD", "ProxyActor"]
    assert params["detail"] == "1"


def test_list_actors_caps_the_limit_at_what_ray_accepts():
    ray, replay = dashboard({ACTORS: "state_actors_serve_running_detail.json"})
    ray.list_actors(limit=100_000)
    assert replay.requests[-1].url.params["limit"] == str(STATE_API_MAX_LIMIT) == "10000"


def test_list_actors_asks_for_at_least_one_item():
    ray, replay = dashboard({ACTORS: "state_actors_serve_running_detail.json"})
    ray.list_actors(limit=0)
    assert replay.requests[-1].url.params["limit"] == "1"


def test_list_actors_without_detail_does_not_ask_for_detail():
    ray, replay = dashboard({ACTORS: "state_actors_serve_running.json"})
    ray.list_actors(detail=False)
    assert "detail" not in replay.requests[-1].url.params


def test_list_nodes_parses_the_head_node():
    ray, replay = dashboard({NODES: "state_nodes.json"})
    page = ray.list_nodes()
    (node,) = page.items
    assert (page.total, page.truncated) == (1, False)
    assert node.node_id == "12b45ea53173bc350523e69ded3c2374da1a75b3a75de2b9b4024fd5"
    assert (node.node_ip, node.is_head_node, node.state) == ("192.0.2.2", True, "ALIVE")
    assert node.resources_total["CPU"] == 2.0
    assert node.resources_total["object_store_memory"] == 7431175372.0
    assert replay.requests[-1].url.params["limit"] == "1000"


def test_a_state_api_refusal_raises_a_bad_response_with_ray_message():
    ray, _ = dashboard({ACTORS: envelope_response("state_actors_limit_too_big.json")})
    with pytest.raises(RayBadResponse) as caught:
        ray.list_actors()
    assert caught.value.status == 400
    assert caught.value.transient is False
    assert "Given limit 100000 exceeds the supported limit 10000." in caught.value.message


def test_a_state_api_envelope_with_result_false_raises_ray_message_even_on_200():
    ray, _ = dashboard({ACTORS: envelope_response("state_actors_limit_too_big.json", status=200)})
    with pytest.raises(RayBadResponse) as caught:
        ray.list_actors()
    message = ray_fixture("state_actors_limit_too_big.json")["body"]["msg"]
    assert caught.value.message == f"{ACTORS} failed: {message}"
    assert caught.value.transient is False


def test_a_state_api_answer_without_a_result_list_is_a_bad_response():
    ray, _ = dashboard({ACTORS: {"result": True, "msg": "", "data": {"result": None}}})
    with pytest.raises(RayBadResponse) as caught:
        ray.list_actors()
    assert caught.value.message == f"{ACTORS} has no result list."


# --- error mapping ---------------------------------------------------------------------------


def test_a_refused_connection_is_a_transient_unreachable_error():
    ray, _ = dashboard({"/api/version": httpx.ConnectError("[Errno 111] Connection refused")})
    with pytest.raises(RayUnreachable) as caught:
        ray.version()
    assert caught.value.transient is True
    assert caught.value.message == "Cannot reach the Ray dashboard: [Errno 111] Connection refused."
    assert is_sentence(caught.value.message)


def test_a_transport_error_without_a_message_still_names_what_went_wrong():
    # httpx raises some transport errors (e.g. a connection closed mid-read) with an empty message;
    # the adapter means to fall back to the exception's class name then.
    ray, _ = dashboard({"/api/version": httpx.ReadError("")})
    with pytest.raises(RayUnreachable) as caught:
        ray.version()
    assert caught.value.transient is True
    assert caught.value.message == "Cannot reach the Ray dashboard: ReadError."


def test_a_read_timeout_is_a_transient_timeout():
    ray, _ = dashboard({"/api/version": httpx.ReadTimeout("timed out")})
    with pytest.raises(RayTimeout) as caught:
        ray.version()
    assert caught.value.transient is True
    assert caught.value.message == "Ray dashboard did not answer /api/version in time (ReadTimeout)."
    assert is_sentence(caught.value.message)


def test_a_connect_timeout_is_a_timeout_not_unreachable():
    ray, _ = dashboard({"/api/version": httpx.ConnectTimeout("timed out")})
    with pytest.raises(RayTimeout) as caught:
        ray.version()
    assert caught.value.transient is True


@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_are_a_permanent_auth_refusal(status):
    ray, _ = dashboard({"/api/version": httpx.Response(status, text="Unauthorized")})
    with pytest.raises(RayAuthRefused) as caught:
        ray.version()
    assert caught.value.transient is False
    assert caught.value.status == status
    assert caught.value.message.startswith(f"The Ray dashboard refused /api/version with HTTP {status}:")
    assert "token" in caught.value.message
    assert is_sentence(caught.value.message)


def test_a_302_redirect_is_a_bad_response_naming_the_redirect():
    login = "https://sso.example/login?next=/api/version"
    ray, replay = dashboard({"/api/version": httpx.Response(302, headers={"location": login})})
    with pytest.raises(RayBadResponse) as caught:
        ray.version()
    assert caught.value.transient is False
    assert caught.value.status == 302
    assert "redirect (HTTP 302 to https://sso.example/login?next=/api/version)" in caught.value.message
    assert "does not follow redirects" in caught.value.message
    assert is_sentence(caught.value.message)
    assert len(replay.requests) == 1  # the redirect was not followed


def test_a_404_on_version_asks_whether_this_is_a_ray_dashboard():
    ray, _ = dashboard({"/api/version": httpx.Response(404, text="Not Found")})
    with pytest.raises(RayBadResponse) as caught:
        ray.version()
    assert caught.value.transient is False
    assert caught.value.status == 404
    assert caught.value.message == "/api/version is not found (HTTP 404): is this a Ray dashboard URL?"
    assert is_sentence(caught.value.message)


def test_a_500_with_a_traceback_is_a_transient_bad_response_with_an_excerpt():
    # Ray's real answer to a malformed PUT body: HTTP 500 with a plain-text Python traceback.
    ray, _ = dashboard({SERVE: envelope_response("put_invalid_malformed_json.json")})
    with pytest.raises(RayBadResponse) as caught:
        ray.serve_applications()
    message = caught.value.message
    assert caught.value.transient is True
    assert caught.value.status == 500
    assert message.startswith(
        f"The Ray dashboard failed on {SERVE} with HTTP 500: Traceback (most recent call last): File "
    )
    assert "\n" not in message
    assert message.endswith("…")
    assert len(message) < 400


def test_a_200_html_page_did_not_answer_json():
    page = "<!doctype html><html><head><title>Welcome to nginx!</title></head><body>It works</body></html>"
    response = httpx.Response(200, text=page, headers={"content-type": "text/html; charset=utf-8"})
    ray, _ = dashboard({"/api/version": response})
    with pytest.raises(RayBadResponse) as caught:
        ray.version()
    assert caught.value.transient is False
    assert caught.value.message.startswith("/api/version did not answer JSON (content-type text/html; charset=utf-8):")
    assert "Welcome to nginx!" in caught.value.message


def test_200_json_without_ray_version_is_not_a_ray_dashboard():
    ray, _ = dashboard({"/api/version": {"version": "1.0", "name": "some other service"}})
    with pytest.raises(RayBadResponse) as caught:
        ray.version()
    assert caught.value.transient is False
    assert caught.value.message == "/api/version has no ray_version: this does not look like a Ray dashboard."


def test_a_json_array_body_is_a_bad_response():
    ray, _ = dashboard({"/api/version": ["2.60.0"]})
    with pytest.raises(RayBadResponse) as caught:
        ray.version()
    assert caught.value.transient is False
    assert caught.value.message == '/api/version answered JSON that is not an object: ["2.60.0"]'


def test_a_400_with_a_plain_text_body_is_a_permanent_bad_response_with_an_excerpt():
    ray, _ = dashboard({SERVE: envelope_response("put_invalid_negative_num_cpus.json")})
    with pytest.raises(RayBadResponse) as caught:
        ray.serve_applications()
    assert caught.value.transient is False
    assert caught.value.status == 400
    assert caught.value.message.startswith(f"{SERVE} answered HTTP 400: 1 validation error for ServeDeploySchema")


@pytest.mark.django_db
def test_a_closed_port_on_localhost_is_unreachable():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with RayDashboard(f"http://127.0.0.1:{port}", timeout_s=5.0) as ray, pytest.raises(RayUnreachable) as caught:
        ray.version()
    assert caught.value.transient is True
    assert caught.value.message.startswith("Cannot reach the Ray dashboard: ")


# --- headers ---------------------------------------------------------------------------------


def _all_requests_without_token():
    ray, replay = dashboard({ACTORS: "state_actors_serve_running_detail.json", NODES: "state_nodes.json"})
    ray.version()
    ray.authentication_mode()
    ray.serve_applications()
    ray.list_actors()
    ray.list_nodes()
    return replay.requests


def test_every_request_carries_the_adapter_user_agent():
    requests = _all_requests_without_token()
    assert len(requests) == 5
    assert {request.headers["user-agent"] for request in requests} == {USER_AGENT}
    assert USER_AGENT == "fleetdeck-ray-adapter/1"


def test_no_request_looks_like_a_browser():
    for request in _all_requests_without_token():
        assert "mozilla" not in request.headers["user-agent"].lower()
        names = {name.lower() for name in request.headers}
        assert "origin" not in names
        assert "referer" not in names
        assert not any(name.startswith("sec-fetch-") for name in names)


def test_requests_carry_no_authorization_without_a_token():
    for request in _all_requests_without_token():
        assert "authorization" not in request.headers


def test_requests_carry_a_bearer_token_when_one_is_given():
    ray, replay = dashboard(token="s3cret-token")
    ray.version()
    ray.serve_applications()
    assert [request.headers["authorization"] for request in replay.requests] == ["Bearer s3cret-token"] * 2


def test_requests_go_to_the_dashboard_url_without_a_doubled_slash():
    replay = ReplayRay()
    ray = replay.dashboard(url="http://ray.test:8265/")
    ray.version()
    assert str(replay.requests[0].url) == "http://ray.test:8265/api/version"


@pytest.mark.django_db
def test_building_an_adapter_does_not_load_the_ca_certificates_again(monkeypatch):
    # A sync builds two adapters per cluster; loading the CA bundle each time cost ~20 ms of CPU.
    RayDashboard("https://ray.test:8265").close()
    loads = []
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda self, *args, **kwargs: loads.append(args))
    for _ in range(3):
        RayDashboard("https://ray.test:8265").close()
    assert loads == []
