"""Registration against real sockets that are not healthy Ray dashboards: nothing is saved and
the operator is told why."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.clusters.models import Cluster

pytestmark = pytest.mark.django_db


class Handler(BaseHTTPRequestHandler):
    status = 200
    body = b"<html><body>It works!</body></html>"
    content_type = "text/html"
    delay_s = 0.0

    def do_GET(self):
        time.sleep(self.delay_s)
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve_http():
    servers = []

    def start(**attributes) -> str:
        handler = type("H", (Handler,), attributes)
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def register(api_as, url):
    return api_as("admin").post(
        "/api/v1/clusters/", {"name": "broken", "team": "vision", "dashboard_url": url}, format="json"
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nothing_listening(api_as):
    response = register(api_as, f"http://127.0.0.1:{closed_port()}")
    assert response.status_code == 400
    assert "Cannot reach the Ray dashboard" in str(response.json()["dashboard_url"])
    assert not Cluster.objects.exists()


def test_a_web_server_that_is_not_ray(api_as, serve_http):
    response = register(api_as, serve_http())
    assert response.status_code == 400
    assert "did not answer JSON" in str(response.json()["dashboard_url"])
    assert not Cluster.objects.exists()


def test_a_dashboard_answering_500(api_as, serve_http):
    url = serve_http(
        status=500, body=b"Traceback (most recent call last):\n  ValueError: boom", content_type="text/plain"
    )
    response = register(api_as, url)
    assert response.status_code == 400
    message = str(response.json()["dashboard_url"])
    # What a URL someone just typed answers is not theirs to read through Fleetdeck.
    assert "HTTP 500" in message and "not shown" in message and "ValueError: boom" not in message


def test_a_dashboard_answering_garbage_json(api_as, serve_http):
    response = register(api_as, serve_http(body=b"[1, 2, 3]", content_type="application/json"))
    assert response.status_code == 400
    assert "not an object" in str(response.json()["dashboard_url"])


def test_a_slow_dashboard_times_out_with_a_clear_message(api_as, serve_http, settings):
    settings.FLEETDECK_RAY_TIMEOUT_S = 0.3
    started = time.monotonic()
    response = register(api_as, serve_http(delay_s=2.0, body=b"{}", content_type="application/json"))
    assert time.monotonic() - started < 2.0
    assert response.status_code == 400
    assert "did not answer /api/version in time" in str(response.json()["dashboard_url"])
    assert not Cluster.objects.exists()


def test_a_metadata_address_is_never_called(api_as):
    response = register(api_as, "http://169.254.169.254/latest/meta-data")
    assert response.status_code == 400
    assert "never calls" in str(response.json()["dashboard_url"])
