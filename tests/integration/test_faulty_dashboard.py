"""Faults of the outside world during sync, push and verification, from a fault-injecting fake Ray
dashboard on a real socket: hangs, resets, slow bodies, 500s, malformed and enormous JSON, wrong
content types. Whatever happens, the change ends in a final state with a step log that says what
happened, every application still exists, and the cluster runs exactly the base or the new config.

The fake keeps the state a Ray dashboard keeps (payloads captured from Ray 2.60): a PUT that gets
through replaces the submitted configs, merges the options into the effective ones and stamps a
new deploy time, as Ray does."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import ChangeState
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Application
from tests.conftest import ray_fixture

pytestmark = pytest.mark.django_db
MODEL = [{"application": "demo", "deployment": "Model"}]
HUGE = 65 * 2**20  # above the adapter's 64 MiB cap


class FakeRay:
    """A Ray dashboard's state, with one fault armed at a time: (method, path prefix, kind, times)."""

    def __init__(self):
        self.serve = ray_fixture("serve_applications_two_apps.json")
        self.version = ray_fixture("version.json")
        self.fault: tuple[str, str, str, int] | None = None
        self.lock = threading.Lock()

    def arm(self, method: str, path: str, kind: str, times: int = 10**6) -> None:
        self.fault = (method, path, kind, times)

    def take_fault(self, method: str, path: str) -> str | None:
        with self.lock:
            if self.fault and self.fault[0] == method and path.startswith(self.fault[1]) and self.fault[3] > 0:
                kind = self.fault[2]
                self.fault = (*self.fault[:3], self.fault[3] - 1)
                return kind
        return None

    def apply(self, config: dict) -> None:
        with self.lock:
            now = time.time()
            for app in config["applications"]:
                served = self.serve["applications"][app["name"]]
                served["deployed_app_config"] = copy.deepcopy(app)
                served["last_deployed_time_s"] = now
                served["status"] = "RUNNING"
                for entry in app.get("deployments", []):
                    effective = served["deployments"][entry["name"]]["deployment_config"]
                    for key, value in entry.items():
                        if key != "name":
                            effective[key] = {**effective[key], **value} if isinstance(value, dict) and isinstance(effective.get(key), dict) else value

    def model_moq(self) -> int:
        return self.serve["applications"]["demo"]["deployed_app_config"]["deployments"][1]["max_ongoing_requests"]


def handler_for(fake: FakeRay):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _faulted(self, kind: str) -> bool:
            """Act out a fault; True when the request got no normal answer."""
            if kind == "hang":
                time.sleep(3)
                return True
            if kind == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.close()
                return True
            if kind == "500":
                self._send(500, b"Traceback (most recent call last):\n  RuntimeError: controller died", "text/plain")
            elif kind == "garbage":
                self._send(200, b'{"applications": {"demo": ', "application/json")
            elif kind == "html":
                self._send(200, b"<html><body>Sign in to continue</body></html>", "text/html")
            elif kind == "huge":
                self._send(200, b'{"applications": {}, "pad": "' + b"x" * HUGE + b'"}')
            elif kind == "slow":
                body = json.dumps(fake.serve).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(0, len(body), 64):
                    self.wfile.write(body[i:i + 64])
                    self.wfile.flush()
                    time.sleep(0.2)
            return kind != "apply-then-hang"

        def do_GET(self):
            kind = fake.take_fault("GET", self.path)
            if kind and self._faulted(kind):
                return
            if self.path.startswith("/api/version"):
                return self._send(200, json.dumps(fake.version).encode())
            if self.path.startswith("/api/serve/applications"):
                with fake.lock:
                    body = json.dumps(fake.serve).encode()
                return self._send(200, body)
            self._send(404, b"Not Found", "text/plain")

        def do_PUT(self):
            length = int(self.headers.get("Content-Length", 0))
            config = json.loads(self.rfile.read(length))
            kind = fake.take_fault("PUT", self.path)
            if kind == "apply-then-hang":
                fake.apply(config)
                time.sleep(3)
                return
            if kind and self._faulted(kind):
                return
            fake.apply(config)
            self._send(200, b"{}")

    return Handler


@pytest.fixture
def fake(settings):
    settings.FLEETDECK_RAY_TIMEOUT_S = 1.0
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 4
    settings.FLEETDECK_CHANGE_POLL_S = 0.1
    fake = FakeRay()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(fake))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


@pytest.fixture
def cluster(fake, team):
    cluster = Cluster.objects.create(name="faulty", team=team, dashboard_url=fake.url, ray_version="2.60.0")
    assert sync.sync_cluster(cluster.pk).ok
    return cluster


def change_through(cluster: Cluster, fake: FakeRay, value: int = 6, *, within_s: float = 30):
    operator = Actor.system(via="cli")
    change = protocol.plan_change(operator, cluster, targets=MODEL, options={"max_ongoing_requests": value}, reason="fault test")
    protocol.request_apply(operator, change)
    started = time.monotonic()
    protocol.run(change.pk)
    change.refresh_from_db()
    log = "\n".join(step.message for step in change.steps.all())
    assert change.is_final, log
    assert time.monotonic() - started < within_s, "a fault made the change hang"
    assert set(fake.serve["applications"]) == {"demo", "echo2"}, "an application was lost"
    return change, log


@pytest.mark.parametrize(
    ("kind", "ends", "runs"),
    [
        ("hang", ChangeState.FAILED, 8),  # no answer, and the cluster still runs the base: nothing changed
        ("reset", ChangeState.FAILED, 8),
        ("500", ChangeState.FAILED, 8),
        ("apply-then-hang", ChangeState.SUCCEEDED, 6),  # the answer was lost but the push landed: verified
    ],
)
def test_a_push_that_fails_in_flight_ends_with_the_cluster_on_base_or_verified_new(cluster, fake, kind, ends, runs):
    fake.arm("PUT", "/api/serve/applications", kind, times=1)
    change, log = change_through(cluster, fake)
    assert change.state == ends, log
    assert fake.model_moq() == runs
    if ends == ChangeState.FAILED:
        assert "nothing changed" in change.error or "nothing changed" in log


@pytest.mark.parametrize("kind", ["hang", "500", "garbage", "html", "huge", "slow"])
def test_verification_rides_out_a_dashboard_that_misbehaves_for_a_while(cluster, fake, kind, settings):
    # The push lands; the next reads misbehave twice, then the dashboard answers again. A trickled
    # body is cut at the adapter's deadline (10 s here), so verification gets the time for two.
    if kind == "slow":
        settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 30
    original_apply = fake.apply

    def apply_and_break(config):
        original_apply(config)
        fake.arm("GET", "/api/serve/applications", kind, times=2)

    fake.apply = apply_and_break
    change, log = change_through(cluster, fake, within_s=45)
    assert change.state == ChangeState.SUCCEEDED, log
    assert fake.model_moq() == 6


def test_a_dashboard_that_stays_broken_after_the_push_is_rolled_back_or_recorded_as_not(cluster, fake):
    original_apply = fake.apply

    def apply_and_break(config):
        original_apply(config)
        if fake.model_moq() == 6:
            fake.arm("GET", "/api/serve/applications", "garbage")

    fake.apply = apply_and_break
    change, log = change_through(cluster, fake)
    # The rollback push lands (the base config runs again), but nothing can verify it: the record says so.
    assert change.state == ChangeState.ROLLBACK_FAILED, log
    assert fake.model_moq() == 8
    assert "did not answer JSON" in change.error or "not answering" in change.error, change.error


@pytest.mark.parametrize("kind", ["hang", "reset", "500", "garbage", "html", "huge", "slow"])
def test_a_sync_against_a_faulty_dashboard_keeps_the_inventory_and_says_why(cluster, fake, kind):
    fake.arm("GET", "/api/serve/applications", kind)
    result = sync.sync_cluster(cluster.pk)
    cluster.refresh_from_db()
    assert not result.ok and cluster.last_error
    assert set(Application.objects.filter(cluster=cluster, removed_at__isnull=True).values_list("name", flat=True)) == {"demo", "echo2"}
