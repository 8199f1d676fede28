"""Outbound connections go to the address that was checked: DNS rebinding, metadata addresses and
networks outside the allow-list are refused before anything is sent."""

from __future__ import annotations

import http.server
import socket
import threading

import httpx
import pytest

from integrations import egress, webhook_client
from integrations.ray.dashboard import RayDashboard
from integrations.ray.errors import RayUnreachable

pytestmark = pytest.mark.django_db


def resolving(monkeypatch, *answers: str):
    """getaddrinfo answering each call with the next address (the last one repeats)."""
    calls = []

    def fake(host, port, *args, **kwargs):
        address = answers[min(len(calls), len(answers) - 1)]
        calls.append(host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(egress.socket, "getaddrinfo", fake)
    return calls


class Recorder(httpx.MockTransport):
    def __init__(self):
        self.seen: list[httpx.Request] = []
        super().__init__(lambda request: self.seen.append(request) or httpx.Response(200, json={}))


def test_the_connection_goes_to_the_checked_address_under_the_original_name(monkeypatch):
    resolving(monkeypatch, "127.0.0.1")
    inner = Recorder()
    with httpx.Client(transport=egress.PinnedTransport(inner=inner)) as client:
        client.get("https://ray.example:8265/api/version")
    request = inner.seen[0]
    assert request.url.host == "127.0.0.1" and request.headers["Host"] == "ray.example:8265"
    assert request.extensions["sni_hostname"] == "ray.example"


def test_a_name_that_rebinds_to_the_metadata_service_is_refused_before_anything_is_sent(monkeypatch, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = ["93.184.216.0/24"]
    # The registration check saw a harmless address; by connection time DNS answers the metadata service.
    calls = resolving(monkeypatch, "93.184.216.34", "169.254.169.254")
    from apps.clusters.validation import check_network_policy

    monkeypatch.setattr("apps.clusters.validation.socket.getaddrinfo", egress.socket.getaddrinfo)
    check_network_policy("http://rebind.example:8265")
    inner = Recorder()
    with pytest.raises(RayUnreachable, match=r"169\.254\.169\.254, an address Fleetdeck never calls"):
        with RayDashboard("http://rebind.example:8265", transport=egress.PinnedTransport(inner=inner)) as ray:
            ray.version()
    assert inner.seen == [] and len(calls) == 2


def test_one_forbidden_address_among_several_refuses_the_name(monkeypatch, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = ["10.0.0.0/8"]

    def two_addresses(host, port, *args, **kwargs):
        # The allowed one first: a check of the first answer alone would let the name through.
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in ("10.0.0.7", "192.168.1.5")]

    monkeypatch.setattr(egress.socket, "getaddrinfo", two_addresses)
    inner = Recorder()
    with pytest.raises(egress.EgressRefused, match="does not cover"):
        with httpx.Client(transport=egress.PinnedTransport(inner=inner)) as client:
            client.get("http://ray.internal:8265/")
    assert inner.seen == []


def test_webhooks_to_a_link_local_address_are_refused_and_not_retried_forever():
    with pytest.raises(webhook_client.DeliveryError, match="never calls"):
        webhook_client.post("http://169.254.169.254/latest/meta-data/", {"x": 1}, timeout_s=1)


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"ray_version": "2.60.0", "ray_commit": "x", "version": "4", "session_name": "s"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_real_dashboard_on_loopback_is_reached_by_name_through_the_pinned_transport():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with RayDashboard(f"http://localhost:{server.server_port}") as ray:
            assert ray.version().ray_version == "2.60.0"
    finally:
        server.shutdown()


def test_when_the_first_address_refuses_the_next_checked_one_is_tried(monkeypatch):
    def two(host, port, *args, **kwargs):
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(egress.socket, "getaddrinfo", two)
    tried = []

    def answer(request):
        tried.append(request.url.host)
        if request.url.host == "::1":
            raise httpx.ConnectError("refused")
        return httpx.Response(200)

    with httpx.Client(transport=egress.PinnedTransport(inner=httpx.MockTransport(answer))) as client:
        assert client.get("http://ray.local:8265/").status_code == 200
    assert tried == ["::1", "127.0.0.1"]
