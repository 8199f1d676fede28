"""scripts/burst_load.py against a loopback server: the bursts are simultaneous and bounded, and
the summary counts every status, the goodput and the latency of the successes."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "burst_load.py"
spec = importlib.util.spec_from_file_location("burst_load", SCRIPT)
burst_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(burst_load)


@pytest.fixture
def server():
    """Answers every third POST with a 500, after 50 ms; records bodies and peak concurrency."""
    state = {"bodies": [], "in_flight": 0, "peak": 0, "count": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state["bodies"].append(body)
                state["count"] += 1
                status = 500 if state["count"] % 3 == 0 else 200
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
            time.sleep(0.05)
            with lock:
                state["in_flight"] -= 1
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/reference"
    yield state
    httpd.shutdown()
    httpd.server_close()


def test_bursts_are_simultaneous_bounded_and_summarised(server, capsys):
    started = time.monotonic()
    assert (
        burst_load.main(
            [server["url"], "--bursts", "3", "--burst-size", "4", "--period-s", "0.2", "--json", '{"prompt": "hi"}']
        )
        == 0
    )

    assert time.monotonic() - started < 5
    assert len(server["bodies"]) == 12 and all(body == {"prompt": "hi"} for body in server["bodies"])
    assert server["peak"] == 4
    out = capsys.readouterr().out
    assert out.count("burst ") == 3
    assert "12 requests in " in out and "200 × 8, 500 × 4" in out
    assert "(67% succeeded)" in out and "latency of successes: p50 0.0" in out


def test_each_request_gets_its_number_so_an_answer_cache_cannot_serve_it(server, capsys):
    burst_load.main([server["url"], "--bursts", "2", "--burst-size", "3", "--period-s", "0"])
    prompts = [body["prompt"] for body in server["bodies"]]
    assert len(prompts) == 6 and len(set(prompts)) == 6
    assert sorted(p.split(":")[0] for p in prompts) == [f"request {n}" for n in range(6)]
    assert all(body["max_tokens"] == 64 for body in server["bodies"])


def test_an_unreachable_url_is_counted_not_raised(capsys):
    from apps.demo.local_ray import free_port

    burst_load.main([f"http://127.0.0.1:{free_port()}/", "--bursts", "1", "--burst-size", "2", "--period-s", "0"])
    out = capsys.readouterr().out
    assert "ConnectError × 2" in out and "goodput: 0.00 successful requests/s (0% succeeded)" in out
    assert "latency of successes" not in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["127.0.0.1:8000/reference"], "must be http(s)://"),
        (["http://127.0.0.1:1/", "--json", "{prompt}"], "--json is not JSON"),
        (["http://127.0.0.1:1/", "--bursts", "0"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_request(argv, message, capsys):
    with pytest.raises(SystemExit):
        burst_load.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_load_sends_the_request_a_calibration_of_the_reference_app_sends_by_default():
    # The README's story sizes from a calibration of the default request and judges the fix under
    # this load: a lighter calibration request would size for traffic that never comes.
    from apps.demo.local_ray import REFERENCE_WARMUP

    assert REFERENCE_WARMUP["body"] == burst_load.DEFAULT_BODY
