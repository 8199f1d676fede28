"""A Ray head on loopback for the local run command and the integration tests.

Every port is chosen free, the temp dir is private, and the head is stopped by its own process
group: `ray stop` would end every Ray process on the machine, including other people's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from apps.clusters.network_policy import NetworkPolicy
from integrations.ray.dashboard import RayDashboard
from integrations.ray.errors import RayError

REPO = Path(__file__).resolve().parents[2]
DEMO_APP_DIR = REPO / "deploy" / "demo_app"
REFERENCE_APP_DIR = REPO / "deploy" / "reference_app"
# The reference app's warmup request on its POST-only route. It is also the request a calibration
# of the app sends when the operator gives none, so it is the request the README's load sends
# (scripts/burst_load.py's default body): a smaller one measured about half the memory per request
# the load then needed, and the wizard sized for the lighter request. A calibration numbers each
# call in place of {n}, so the app's answer cache never stands in for the model.
REFERENCE_WARMUP = {
    "name": "request",
    "method": "POST",
    "path": "/reference",
    "body": {"prompt": "request {n}: " + "x" * 186, "max_tokens": 64},
}
# The head this process started, which listens on loopback only: the administrators' allow-list is
# about clusters they register, and the database holding it may not exist yet when the head is waited for.
OWN_HEAD = NetworkPolicy(networks=(ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")))


# Ray's workers listen on 10002-19999 by default; the kernel hands out ports from its ephemeral
# range to every outgoing connection.
_PORTS_FROM = 20000
_PICK = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on, between Ray's worker ports and the
    ephemeral range. A port the kernel picks (binding port 0) is an ephemeral one, which it may
    give to one of Ray's outgoing connections before the process it was picked for binds it. Each
    port stays bound until all are picked: released one by one, two picks could be the same port,
    and Ray refuses to start when two of its components are given one port."""
    below = _ephemeral_start()
    held: list[socket.socket] = []
    try:
        for _ in range(200 + count):
            if len(held) == count:
                break
            port = _PICK.randrange(_PORTS_FROM, below) if below > _PORTS_FROM + 100 else 0
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        if len(held) < count:
            raise OSError(f"no {count} free loopback ports between {_PORTS_FROM} and {below}")
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


GIB = 2**30
# Ray's own default. Above it the kernel's OOM killer may act before Ray's monitor does, and it
# kills without the evidence (death cause, eviction metrics) an OOM incident is built from.
MAX_MEMORY_THRESHOLD = 0.95


def memory_usage(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(used, total) bytes of this machine's memory, counted as Ray's memory monitor counts them:
    what is not available."""
    info = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    total = int(info["MemTotal"].split()[0]) * 1024
    available = int(info["MemAvailable"].split()[0]) * 1024
    return total - available, total


def threshold_for_headroom(headroom_gib: float, usage: tuple[int, int] | None = None) -> float:
    """The `RAY_memory_usage_threshold` (a fraction of the node's memory) that trips `headroom_gib`
    above what the machine uses now, so an OOM kill is reproduced without exhausting the machine.
    Rounded to what `memory_monitor_env` passes to Ray, and at most Ray's default."""
    if not (headroom_gib > 0 and math.isfinite(headroom_gib)):
        raise ValueError(f"the memory headroom must be a positive number of GiB, not {headroom_gib!r}")
    used, total = usage or memory_usage()
    return round(min((used + headroom_gib * GIB) / total, MAX_MEMORY_THRESHOLD), 3)


def memory_monitor_env(threshold: float) -> dict[str, str]:
    """The environment of a head whose memory monitor kills above `threshold`. The 250 ms check is
    Ray 2.60's default, pinned because the fraction assumes a burst cannot overshoot it for long."""
    return {"RAY_memory_usage_threshold": f"{threshold:.3f}", "RAY_memory_monitor_refresh_ms": "250"}


def _ray_bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


# The ports `ray start` is given, by flag name.
_HEAD_PORTS = (
    "port",
    "dashboard-port",
    "metrics-export-port",
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "node-manager-port",
    "object-manager-port",
)
# What `ray start` prints when a start can succeed if tried again: a port it was given is not free
# after all (another process can bind a free port between our pick and Ray's bind; a new pick is the
# cure), or its GCS did not answer in time on a machine busy with other clusters (seen on 2 CPUs).
_RETRYABLE_FAILURES = (
    "is trying to use a port number",
    "Address already in use",
    "Failed to bind",
    "The current node timed out during startup",
)
START_ATTEMPTS = 3


@dataclass
class LocalRayHead:
    temp_dir: Path
    log_path: Path
    args: list[str]
    env: dict[str, str]
    dashboard_port: int = 0
    serve_http_port: int = 0
    process: subprocess.Popen | None = None
    ports: dict[str, int] = field(default_factory=dict)
    stop_requested_at: float | None = None
    attempts: int = 0

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_http_port}"

    @classmethod
    def start(cls, *, num_cpus: int = 2, object_store_mb: int = 200, extra_env: dict | None = None) -> LocalRayHead:
        temp_dir = Path(tempfile.mkdtemp(prefix="fdray-", dir="/tmp"))
        args = [
            _ray_bin("ray"),
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--dashboard-host",
            "127.0.0.1",
            "--include-dashboard",
            "true",
            "--disable-usage-stats",
            "--num-cpus",
            str(num_cpus),
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(object_store_mb * 1024 * 1024),
            "--temp-dir",
            str(temp_dir),
        ]
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(DEMO_APP_DIR), str(REFERENCE_APP_DIR), env.get("PYTHONPATH", "")])
            ),
            # Jobs (calibrations) run `python` from the head's PATH: make it this interpreter, which has Ray.
            PATH=os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH", "")])),
            RAY_USAGE_STATS_ENABLED="0",
            # `ray start` replaces a loopback --node-ip-address with the machine's external address
            # (services.resolve_ip_for_localhost) unless Ray clusters are off, as on macOS and Windows;
            # Ray's processes then bind that address or all interfaces where they would bind loopback.
            # Off, the head takes no other nodes, which a head for one machine never needs.
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            **(extra_env or {}),
        )
        head = cls(temp_dir=temp_dir, log_path=temp_dir / "ray-start.log", args=args, env=env)
        head._launch()
        return head

    def _launch(self) -> None:
        """Start `ray start` on newly picked ports; the Serve proxy's port is picked with them."""
        *head_ports, self.serve_http_port = free_ports(len(_HEAD_PORTS) + 1)
        self.ports = dict(zip(_HEAD_PORTS, head_ports, strict=True))
        self.dashboard_port = self.ports["dashboard-port"]
        self.attempts += 1
        args = list(self.args)
        for name, port in self.ports.items():
            args += [f"--{name}", str(port)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Wait for the dashboard and Serve's API. A head that exits because a port it was given
        was taken meanwhile, or whose GCS timed out, is started again on new ports, up to START_ATTEMPTS times."""
        deadline = time.monotonic() + timeout_s
        last_error = ""
        with RayDashboard(self.dashboard_url, timeout_s=2.0, policy=OWN_HEAD) as ray:
            while time.monotonic() < deadline:
                if self.process and self.process.poll() is not None:
                    log = self.log_tail()
                    if self.attempts < START_ATTEMPTS and any(failure in log for failure in _RETRYABLE_FAILURES):
                        self._kill_session()
                        self._launch()
                        return self.wait_ready(max(deadline - time.monotonic(), 1.0))
                    raise RuntimeError(f"ray start exited with {self.process.returncode}:\n{log}")
                try:
                    ray.version()
                    ray.serve_applications()
                    return
                except RayError as exc:
                    last_error = exc.message
                time.sleep(0.5)
        raise TimeoutError(f"Ray dashboard not ready after {timeout_s:.0f}s ({last_error}):\n{self.log_tail()}")

    def deploy(self, config: dict, *, timeout_s: float = 120.0) -> None:
        """Deploy with Ray's own client (`serve deploy`, which PUTs to the dashboard's REST API),
        then wait until every application in `config` is RUNNING and every other one is gone: a
        declarative deploy removes them, and one still DELETING looks deployed from Python."""
        config = dict(config)
        config.setdefault("http_options", {"host": "127.0.0.1", "port": self.serve_http_port})
        path = self.temp_dir / f"serve-config-{time.time_ns()}.json"
        path.write_text(json.dumps(config))
        result = subprocess.run(
            [_ray_bin("serve"), "deploy", str(path), "--address", self.dashboard_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"serve deploy failed:\n{result.stdout}\n{result.stderr}")
        self.wait_running({app["name"] for app in config["applications"]}, timeout_s=timeout_s, only=True)

    def wait_running(self, names: set[str], *, timeout_s: float = 120.0, only: bool = False) -> None:
        deadline = time.monotonic() + timeout_s
        statuses: dict[str, str] = {}
        with RayDashboard(self.dashboard_url, timeout_s=5.0, policy=OWN_HEAD) as ray:
            while time.monotonic() < deadline:
                serve = ray.serve_applications()
                statuses = {name: app.status for name, app in serve.applications.items()}
                if all(statuses.get(name) == "RUNNING" for name in names) and not (only and set(statuses) - set(names)):
                    return
                failed = [name for name in names if statuses.get(name) == "DEPLOY_FAILED"]
                if failed:
                    raise RuntimeError(f"deploy failed: {serve.applications[failed[0]].message}")
                time.sleep(0.5)
        raise TimeoutError(f"applications not RUNNING after {timeout_s:.0f}s: {statuses}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def begin_stop(self) -> None:
        """Ask the head to shut down without waiting, so it can overlap other shutdowns."""
        if self.process is not None and self.process.poll() is None and self.stop_requested_at is None:
            self.process.send_signal(signal.SIGTERM)
            self.stop_requested_at = time.monotonic()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM `ray start --block` (it tears down its children, but waits ~30 s for Serve
        replicas), then SIGKILL every process of the head's session: `ray start` runs as a
        session leader, and Ray's workers keep its session id while they change their process
        group and command line. Nothing outside this head is touched."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.begin_stop()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=max(self.stop_requested_at + timeout_s - time.monotonic(), 0.1))
        self._kill_session()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _kill_session(self) -> None:
        deadline = time.monotonic() + 10
        while (pids := _pids_in_session(self.process.pid)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        if self.process.poll() is None:
            self.process.wait(timeout=5)


def _pids_in_session(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids
