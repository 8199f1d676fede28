"""A fault-injecting fake Ray dashboard on a real loopback socket.

It keeps the state a Ray dashboard keeps (payloads captured from Ray 2.60): a PUT that gets
through replaces the submitted configs, merges the options into the effective ones and stamps a
new deploy time, as Ray does. One fault is armed at a time; paths it does not know answer 404,
as the dashboard does."""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.conftest import ray_fixture

HUGE = 65 * 2**20  # above the adapter's 64 MiB cap
DELAY_S = 1.5


class FakeRay:
    """A Ray dashboard's state, with one fault armed at a time: (method, path prefix, kind, times)."""

    def __init__(self):
        self.serve = ray_fixture("serve_applications_two_apps.json")
        self.version = ray_fixture("version.json")
        self.fault: tuple[str, str, str, int] | None = None
        self.lock = threading.Lock()
        # Set while a "delay" fault holds a request: the caller is in the middle of its work.
        self.holding = threading.Event()
        self.url = ""

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
                            effective[key] = (
                                {**effective[key], **value}
                                if isinstance(value, dict) and isinstance(effective.get(key), dict)
                                else value
                            )

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
            if kind == "delay":
                fake.holding.set()
                time.sleep(DELAY_S)
                fake.holding.clear()
                return False
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
                    self.wfile.write(body[i : i + 64])
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


@contextlib.contextmanager
def serving(fake: FakeRay | None = None) -> Iterator[FakeRay]:
    """Serve `fake` (a new one by default) on a free loopback port; its address is `fake.url`."""
    fake = fake or FakeRay()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(fake))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
