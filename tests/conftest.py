from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Membership, Role, Team
from apps.clusters import network_policy
from integrations.ray.async_dashboard import AsyncRayDashboard
from integrations.ray.dashboard import RayDashboard

FIXTURES = Path(__file__).parent / "fixtures" / "ray"


def ray_fixture(name: str):
    """A payload captured from a real Ray 2.60 cluster (see tests/fixtures/ray/README.txt)."""
    return json.loads((FIXTURES / name).read_text())


class ReplayRay:
    """An httpx transport that answers like a Ray dashboard from captured payloads.

    `routes` maps a path to a fixture file name, a JSON-able body, or an httpx.Response; the
    fake stands at the adapter boundary only, for fault injection and scale simulation."""

    def __init__(self, routes: dict | None = None):
        self.routes = {
            "/api/version": "version.json",
            "/api/authentication_mode": "authentication_mode.json",
            "/api/serve/applications/": "serve_applications_two_apps.json",
            **(routes or {}),
        }
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.routes.get(request.url.path)
        if answer is None:
            return httpx.Response(404, text="Not Found")
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        if callable(answer):
            return answer(request)
        if isinstance(answer, str) and answer.endswith(".json"):
            return httpx.Response(200, json=ray_fixture(answer))
        return httpx.Response(200, json=answer)

    def dashboard(self, url: str = "http://ray.test:8265", token: str = "") -> RayDashboard:
        return RayDashboard(url, token=token, transport=httpx.MockTransport(self))

    def async_dashboard(self, url: str = "http://ray.test:8265", token: str = "") -> AsyncRayDashboard:
        return AsyncRayDashboard(url, token=token, transport=httpx.MockTransport(self))


@pytest.fixture(autouse=True)
def fresh_network_policy():
    """A test's allow-list rows are rolled back with it: the next test must not see them cached."""
    network_policy.forget()
    yield
    network_policy.forget()


@pytest.fixture
def replay_ray():
    return ReplayRay()


def route_adapters_to(monkeypatch, replay: ReplayRay) -> ReplayRay:
    """Route every adapter the services build to `replay` instead of the network."""
    import apps.clusters.services as cluster_services

    def fake_dashboard(base_url, *, token="", timeout_s=5.0):
        return replay.dashboard(base_url, token)

    def fake_async_dashboard(base_url, *, token="", timeout_s=5.0):
        return replay.async_dashboard(base_url, token)

    # The registration probe and every other reader build their adapter here, the sync its async one.
    monkeypatch.setattr(cluster_services, "RayDashboard", fake_dashboard)
    monkeypatch.setattr(cluster_services, "AsyncRayDashboard", fake_async_dashboard)
    # "ray.test" does not resolve; the policy itself is tested on its own.
    monkeypatch.setattr("apps.clusters.validation.check_network_policy", lambda url, policy=None: None)
    return replay


@pytest.fixture
def use_replay(monkeypatch, replay_ray):
    """Route every adapter the services build to `replay_ray` instead of the network."""
    return route_adapters_to(monkeypatch, replay_ray)


@pytest.fixture
def team(db):
    return Team.objects.create(name="Vision", slug="vision")


@pytest.fixture
def other_team(db):
    return Team.objects.create(name="Speech", slug="speech")


@pytest.fixture
def people(db, team, django_user_model):
    """One user per role in `team`, an outsider with no membership, and a superuser."""
    users = {}
    for role in Role:
        user = django_user_model.objects.create_user(username=role.value, password="pw")
        Membership.objects.create(user=user, team=team, role=role)
        users[role.value] = user
    users["outsider"] = django_user_model.objects.create_user(username="outsider", password="pw")
    users["root"] = django_user_model.objects.create_superuser(username="root", password="pw")
    return users


@pytest.fixture
def api_as(people):
    def client_for(who: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(people[who])
        return client

    return client_for


def two_app_config() -> dict:
    """The two-application config captured from the real cluster, pointed at our demo module."""
    from apps.demo.local_ray import DEMO_APP_DIR

    config = ray_fixture("put_config_demo_and_echo2.json")
    for app in config["applications"]:
        app["runtime_env"]["env_vars"]["PYTHONPATH"] = str(DEMO_APP_DIR)
    return config


@pytest.fixture(scope="session")
def ray_head():
    """A real Ray 2.60 head on loopback with the two applications deployed through Ray's own
    REST API; stopped by its own process ids at the end of the session."""
    from apps.demo.local_ray import LocalRayHead

    head = LocalRayHead.start()
    try:
        head.wait_ready()
        head.deploy(two_app_config())
        yield head
    finally:
        head.stop()
