"""A simulated fleet on loopback: N fake Ray dashboards served by one asyncio process.

Each dashboard listens on its own port (a real fleet has one host per dashboard, and a sync opens
its own connections), and answers `/api/version`, `/api/serve/applications/`, `/api/cluster_status`
and the state API's `/api/v0/actors` with payloads built from the captured Ray 2.60 fixtures. One event loop in its own
process holds 1,000 listening sockets and thousands of sleeping requests for a few MB and a few
percent of a core, which leaves the second core to the worker under test; a process or a thread
per dashboard would not fit 1,000 on two cores.

Every request waits a latency drawn from a distribution with p50 5 ms, p95 60 ms, p99 130 ms.
Per cycle each dashboard is healthy or, with the given probabilities, hangs (reads the request
and never answers), resets the connection, or answers 500 with a traceback as Ray does.
The process is driven through a multiprocessing pipe: ("cycle", seed, faults), ("stats",), ("stop",).
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import json
import math
import random
import socket
import struct
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ray"
APPLICATIONS = 10
DEPLOYMENTS = ("Ingress", "Model", "Postprocess")
# Quantile knots of the latency (ms), interpolated log-linearly: exactly p50 5, p95 60, p99 130.
LATENCY_KNOTS = [(0.0, 1.0), (0.5, 5.0), (0.95, 60.0), (0.99, 130.0), (0.999, 200.0), (1.0, 250.0)]
TRACEBACK = (
    b'Traceback (most recent call last):\n  File "/ray/dashboard/modules/serve/serve_head.py", line 98, in '
    b"get_serve_instance_details\nray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.\n"
)


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def serve_applications_body() -> dict:
    """10 applications x 3 deployments, each shaped like the captured `demo/Model` (effective
    config, submitted config, one RUNNING replica)."""
    captured = fixture("serve_applications_two_apps.json")
    template = captured["applications"]["demo"]
    running = template["deployments"]["Model"]
    submitted = next(d for d in template["deployed_app_config"]["deployments"] if d["name"] == "Model")
    applications = {}
    for a in range(APPLICATIONS):
        name = f"app{a:02d}"
        app = copy.deepcopy(template)
        app.update(name=name, route_prefix=f"/{name}")
        app["deployed_app_config"].update(name=name, route_prefix=f"/{name}", deployments=[])
        app["deployments"] = {}
        for d, dep_name in enumerate(DEPLOYMENTS):
            dep = copy.deepcopy(running)
            dep["name"] = dep["deployment_config"]["name"] = dep_name
            replica_id = f"r{a:02d}{d}abcd"
            dep["replicas"][0].update(
                replica_id=replica_id,
                actor_name=f"SERVE_REPLICA::{name}#{dep_name}#{replica_id}",
                actor_id=f"{a:02d}{d}" + running["replicas"][0]["actor_id"][3:],
            )
            app["deployments"][dep_name] = dep
            app["deployed_app_config"]["deployments"].append({**copy.deepcopy(submitted), "name": dep_name})
        applications[name] = app
    return {**captured, "applications": applications}


def draw_latency(rng: random.Random) -> float:
    """Seconds, by inverse CDF through LATENCY_KNOTS."""
    u = rng.random()
    i = max(1, bisect.bisect_left([q for q, _ in LATENCY_KNOTS], u))
    (q0, v0), (q1, v1) = LATENCY_KNOTS[i - 1], LATENCY_KNOTS[i]
    return math.exp(math.log(v0) + (u - q0) / (q1 - q0) * (math.log(v1) - math.log(v0))) / 1000


def _response(status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: "
        + content_type
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Fleet:
    def __init__(self, n: int, hang_cost_s: float):
        self.n = n
        self.hang_cost_s = hang_cost_s  # what a hung request costs the client: its timeout
        version = fixture("version.json")
        self.versions = [
            _response(b"200 OK", json.dumps({**version, "session_name": f"session_bench_{i:04d}"}).encode())
            for i in range(n)
        ]
        self.serve = _response(b"200 OK", json.dumps(serve_applications_body()).encode())
        self.actors = _response(b"200 OK", json.dumps(fixture("state_actors_dead_after_rollouts_detail.json")).encode())
        self.cluster_status = _response(b"200 OK", json.dumps(fixture("cluster_status.json")).encode())
        self.not_found = _response(b"404 Not Found", b"404: Not Found", b"text/plain")
        self.error = _response(b"500 Internal Server Error", TRACEBACK, b"text/plain")
        self.rng = random.Random(0)
        self.modes = ["ok"] * n
        self.reset_stats()

    def reset_stats(self) -> None:
        self.waits = [0.0] * self.n  # per dashboard: latencies served plus the timeout of every hung request
        self.latencies: list[float] = []
        self.requests = 0

    def new_cycle(self, seed: int, faults: dict[str, float]) -> dict[str, int]:
        self.rng = random.Random(seed)
        self.modes = []
        for _ in range(self.n):
            u, mode = self.rng.random(), "ok"
            for name, p in faults.items():
                if u < p:
                    mode = name
                    break
                u -= p
            self.modes.append(mode)
        self.reset_stats()
        return {mode: self.modes.count(mode) for mode in set(self.modes)}

    def route(self, i: int, path: bytes) -> bytes:
        path = path.split(b"?", 1)[0]
        if path == b"/api/version":
            return self.versions[i]
        if path == b"/api/serve/applications/":
            return self.serve
        if path == b"/api/v0/actors":
            return self.actors
        if path == b"/api/cluster_status":
            return self.cluster_status
        return self.not_found

    async def handle(self, i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                mode = self.modes[i]
                if mode == "hang":
                    self.waits[i] += self.hang_cost_s
                    await reader.read()  # until the client gives up and closes
                    return
                if mode == "reset":
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    writer.transport.abort()
                    return
                delay = draw_latency(self.rng)
                self.waits[i] += delay
                self.latencies.append(delay)
                await asyncio.sleep(delay)
                writer.write(self.error if mode == "error" else self.route(i, head.split(b" ", 2)[1]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


def serve(n: int, hang_cost_s: float, conn) -> None:
    """Entry point of the fleet process: send the ports, then obey commands until ("stop",)."""
    fleet = Fleet(n, hang_cost_s)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = []
        for i in range(n):
            servers.append(
                await asyncio.start_server(lambda r, w, i=i: fleet.handle(i, r, w), "127.0.0.1", 0, backlog=64)
            )
        conn.send([server.sockets[0].getsockname()[1] for server in servers])
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            if command[0] == "cycle":
                conn.send(fleet.new_cycle(command[1], command[2]))
            elif command[0] == "stats":
                conn.send({"waits": fleet.waits, "latencies": fleet.latencies, "requests": fleet.requests})
            else:
                for server in servers:
                    server.close()
                conn.send("stopped")
                return

    asyncio.run(main())
