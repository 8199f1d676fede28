"""Every outside answer is read under a byte cap and a total deadline, in the one transport every
adapter connects through: real servers on loopback that drip a byte at a time, never stop, or
announce a gigabyte are cut off, each adapter says which limit, and the test process keeps going."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from integrations import egress, prometheus, ray_metrics, serve_http, webhook_client
from integrations.ray.dashboard import RayDashboard
from integrations.ray.errors import RayError

# The network policy in force is read from the allow-list in the database.
pytestmark = pytest.mark.django_db

LIMITS = egress.Limits(max_bytes=256 * 1024, deadline_s=1.0)
# The deadline, one read timeout for the byte that crosses it, and room for a slow machine.
BOUND_S = LIMITS.deadline_s + 1.0 + 2.0


class Misbehaving(http.server.BaseHTTPRequestHandler):
    """`/drip`: a byte every 0.2 s; `/endless`: 64 KiB chunks without end; `/huge`: announces 1 GiB.
    Each stops when the client hangs up, or after 30 s at the most."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer()

    def answer(self):
        kind = self.path.strip("/").split("/")[0].split("?")[0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if kind != "metrics" else "text/plain")
        if kind == "huge":
            self.send_header("Content-Length", str(2**30))
        self.end_headers()
        stop_at = time.monotonic() + 30
        try:
            while time.monotonic() < stop_at:
                if kind == "drip":
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
                else:
                    self.wfile.write(b"0" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    previous = egress.current_limits()
    egress.use_limits(LIMITS)
    yield f"http://127.0.0.1:{httpd.server_port}"
    egress.use_limits(previous)
    httpd.shutdown()
    httpd.server_close()


def bounded(call) -> tuple[Exception | object, float]:
    started = time.monotonic()
    try:
        outcome = call()
    except Exception as exc:  # each adapter's own error is what is checked
        outcome = exc
    return outcome, time.monotonic() - started


ADAPTERS = {
    "prometheus": (lambda url: prometheus.query(url, "up", timeout_s=1.0), prometheus.MetricsUnavailable),
    "metrics": (lambda url: ray_metrics.scrape(f"{url}/metrics", timeout_s=1.0), ray_metrics.MetricsUnavailable),
    "webhook": (lambda url: webhook_client.post(url, {"x": 1}, timeout_s=1.0), webhook_client.DeliveryError),
    "dashboard": (lambda url: RayDashboard(url, timeout_s=1.0).version(), RayError),
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("kind", ["drip", "endless", "huge"])
def test_an_answer_past_its_limits_is_cut_off_and_the_error_says_so(server, adapter, kind):
    call, error = ADAPTERS[adapter]
    base = f"{server}/{kind}"

    outcome, elapsed = bounded(lambda: call(base))

    assert isinstance(outcome, error), outcome
    assert elapsed < BOUND_S, f"{adapter} read {kind} for {elapsed:.1f} s"
    if adapter != "dashboard":
        # The dashboard client keeps its own, tighter limits; every other adapter relies on the transport's.
        limit = "DEADLINE" if kind == "drip" else "MAX_BYTES"
        # The metrics scrape keeps its own, smaller byte cap (a metrics page is never 32 MiB).
        own_cap = adapter == "metrics" and "MiB; not a metrics page" in str(outcome)
        assert f"FLEETDECK_OUTBOUND_{limit}" in str(outcome) or own_cap, str(outcome)


@pytest.mark.parametrize("kind", ["drip", "endless", "huge"])
def test_a_warmup_request_past_its_limits_is_a_failed_sample_not_a_held_worker(server, kind):
    (sample,), elapsed = bounded(
        lambda: serve_http.send(
            server, method="GET", path=f"/{kind}", headers={}, body=None, requests=1, concurrency=1, timeout_s=1.0
        )
    )
    assert not sample.ok and sample.error
    assert elapsed < BOUND_S


def test_a_small_answer_within_the_limits_is_read_whole(server):
    # The positive control: the same transport reads an ordinary answer as it always did.
    page = b"ray_serve_num_http_requests_total 3\n"
    limits = egress.Limits(max_bytes=len(page), deadline_s=5.0)

    class One(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), One)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    egress.use_limits(limits)
    try:
        scrape = ray_metrics.scrape(f"http://127.0.0.1:{httpd.server_port}/metrics", timeout_s=1.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert scrape is not None
