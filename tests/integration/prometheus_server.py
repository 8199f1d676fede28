"""Debian's Prometheus server on loopback for the integration tests: its own config, data dir and
port, scraping one target every second (a real Ray head's metrics export port, or Fleetdeck's own
/metrics), stopped by its own pid.

`make test` installs the package (scripts/install-monitoring.sh); without it the fixture fails and
says so: a Prometheus path that is never run against a Prometheus is what this module is for."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from apps.demo.local_ray import free_port

PROMETHEUS = os.environ.get("FLEETDECK_PROMETHEUS", "/usr/bin/prometheus")
# The label every series scraped here carries, which a cluster's `prometheus_selector` matches, as
# an operator's relabelling of a shared Prometheus would add it.
CLUSTER_LABEL = "fleetdeck-it"
SELECTOR = f'cluster="{CLUSTER_LABEL}"'


def config(target: str, *, bearer_token: str | None = None, rule_files: tuple[Path, ...] = ()) -> str:
    # Ray exports every ~10 s (metrics_report_interval_ms); a 1 s scrape sees each export within a second.
    job: dict = {
        "job_name": "target",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [target], "labels": {"cluster": CLUSTER_LABEL}}],
    }
    if bearer_token:
        job["authorization"] = {"type": "Bearer", "credentials": bearer_token}
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [job],
        }
    )


@dataclass
class PrometheusServer:
    process: subprocess.Popen
    port: int
    data_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, promql: str) -> dict:
        """Prometheus's raw answer to an instant query, refusals included (HTTP 400 with a JSON body)."""
        return httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10, trust_env=False).json()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start(
    target: str, *, bearer_token: str | None = None, rule_files: tuple[Path, ...] = (), timeout_s: float = 30.0
) -> PrometheusServer:
    """Start a Prometheus scraping `target` (host:port serving /metrics, with `bearer_token` when
    given) and evaluating `rule_files`, and wait until it is ready and has scraped the target."""
    if not os.access(PROMETHEUS, os.X_OK):
        raise RuntimeError(
            f"No Prometheus server at {PROMETHEUS}: run scripts/install-monitoring.sh (make test runs it), "
            "or set FLEETDECK_PROMETHEUS to a prometheus binary."
        )
    data_dir = Path(tempfile.mkdtemp(prefix="fdprom-", dir="/tmp"))
    config_path = data_dir / "prometheus.yml"
    config_path.write_text(config(target, bearer_token=bearer_token, rule_files=rule_files))
    port = free_port()
    log_path = data_dir / "prometheus.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={data_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PrometheusServer(process=process, port=port, data_dir=data_dir, log_path=log_path)
    try:
        _wait_up(server, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_up(server: PrometheusServer, timeout_s: float) -> None:
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=2, trust_env=False).status_code == 200:
                up = server.api(f"up{{{SELECTOR}}}")["data"]["result"]
                if up and up[0]["value"][1] == "1":
                    return
                last = f"target not up yet: {up}"
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(0.3)
    raise TimeoutError(f"Prometheus not scraping after {timeout_s:.0f}s ({last}):\n{server.log_tail()}")
