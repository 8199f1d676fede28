"""Metrics endpoints that never finish answering, through a real worker as production runs it
(`-Q celery,tick,metrics --concurrency 2`, prefork) and the configured broker: a byte every two
seconds, a stream without end and an announced gigabyte are each cut off by the transport, which
names the limit, and the cut is recorded as that cluster's metrics error; meanwhile a cluster with
a healthy dashboard keeps its sync interval, syncing while a metrics reading is held open.

The adapters' own handling of each answer is tested in tests/unit/integrations/test_outbound_limits.py;
this is the path around them: the sync asks for the reading, the `metrics` queue runs it, the
worker process survives it, and nobody else waits for it."""

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.utils import timezone

from apps.clusters.models import Cluster
from apps.incidents.models import ScrapeState
from controlplane.celery import app as celery_app
from tests.fake_ray import serving
from tests.integration.test_changes_worker import worker_env
from workers import tasks

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]

DEADLINE_S = 3  # FLEETDECK_OUTBOUND_DEADLINE_S, low so that the test is quick
MAX_BYTES = 2**20  # FLEETDECK_OUTBOUND_MAX_BYTES, its minimum: below the scrape's own 32 MiB check
INTERVAL_S = 5  # FLEETDECK_SYNC_INTERVAL_S, its minimum
DRIP_EVERY_S = 2.0  # under the 5 s read timeout, so only the total deadline can end it
GIGABYTE = 2**30


class Misbehaving(BaseHTTPRequestHandler):
    """`/drip`: a byte every DRIP_EVERY_S, without end; `/endless`: 64 KiB chunks as fast as they
    are read, without end; `/gigabyte`: announces 1 GiB and streams it from one 1 MiB buffer.
    Each answer lasts until the client hangs up; `held` keeps (path, opened, closed, bytes sent)
    per answer, in wall-clock seconds as the database's sync stamps are."""

    protocol_version = "HTTP/1.1"
    held: list[tuple[str, float, float, int]] = []
    lock = threading.Lock()

    def do_GET(self):
        path, opened, sent = self.path.strip("/"), time.time(), 0
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if path == "gigabyte":
            self.send_header("Content-Length", str(GIGABYTE))
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = b"#" * (2**20 if path == "gigabyte" else 65536)
        try:
            while sent < GIGABYTE:
                if path == "drip":
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    sent += 1
                    # Readable with nothing to read: the client hung up.
                    if select.select([self.connection], [], [], DRIP_EVERY_S)[0] and not self.connection.recv(1):
                        break
                else:
                    self.wfile.write(chunk)
                    sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with self.lock:
            self.held.append((path, opened, time.time(), sent))
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoints():
    Misbehaving.held = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def worker():
    """A worker as deploy/k8s/worker.yaml runs it, with low outbound limits."""
    celery_app.control.purge()
    env = {
        **worker_env(),
        "FLEETDECK_OUTBOUND_DEADLINE_S": str(DEADLINE_S),
        "FLEETDECK_OUTBOUND_MAX_BYTES": str(MAX_BYTES),
        "FLEETDECK_SYNC_INTERVAL_S": str(INTERVAL_S),
    }
    command = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--loglevel", "WARNING"]
    command += ["--pool", "prefork", "--concurrency", "2", "--queues", "celery,tick,metrics"]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        # Its process group: the worker and its pool processes.
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                # A warm shutdown waits for the reading in progress: a few seconds at most.
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        celery_app.control.purge()


def test_stalled_metrics_endpoints_are_cut_off_and_recorded_while_other_clusters_keep_syncing(team, endpoints, worker):
    with serving() as dashboard:
        # Half an interval after the others: its syncs fall between theirs, while the readings
        # their syncs asked for are still being read.
        healthy = Cluster.objects.create(
            name="healthy",
            team=team,
            dashboard_url=dashboard.url,
            next_sync_at=timezone.now() + timedelta(seconds=INTERVAL_S / 2),
        )
        stalled = {
            kind: Cluster.objects.create(
                name=kind, team=team, dashboard_url=dashboard.url, metrics_url=f"{endpoints}/{kind}"
            )
            for kind in ("drip", "endless", "gigabyte")
        }
        syncs: dict[int, set] = {pk: set() for pk in [healthy.pk, *(c.pk for c in stalled.values())]}

        def errors() -> dict[str, str]:
            rows = ScrapeState.objects.filter(cluster__in=stalled.values()).values_list("cluster__name", "error")
            return {name: error for name, error in rows if error}

        def drips_done() -> int:
            return sum(1 for path, *_ in list(Misbehaving.held) if path == "drip")

        # The tick as beat sends it; the worker's claim makes each cluster due every INTERVAL_S.
        deadline = time.monotonic() + 55
        while len(errors()) < 3 or drips_done() < 2 or len(syncs[healthy.pk]) < 4:
            assert worker.poll() is None, f"the worker exited with {worker.returncode}"
            assert time.monotonic() < deadline, (errors(), Misbehaving.held, len(syncs[healthy.pk]))
            tasks.tick.delay()
            for pk, synced in Cluster.objects.filter(pk__in=syncs).values_list("pk", "last_sync_at"):
                if synced is not None:
                    syncs[pk].add(synced.timestamp())
            time.sleep(1)
        assert worker.poll() is None, "a metrics reading took the worker down"

    recorded = errors()
    # Each answer was cut by the transport, and the cluster's metrics error says which limit.
    assert "FLEETDECK_OUTBOUND_MAX_BYTES" in recorded["endless"], recorded["endless"]
    assert "announced 1024 MiB" in recorded["gigabyte"], recorded["gigabyte"]
    assert "FLEETDECK_OUTBOUND_MAX_BYTES" in recorded["gigabyte"], recorded["gigabyte"]
    held = list(Misbehaving.held)
    for path, opened, closed, sent in held:
        seconds = closed - opened
        # The deadline, one more drip for the check that crosses it, and room for a loaded machine.
        assert seconds < DEADLINE_S + DRIP_EVERY_S + 3, (path, seconds)
        if path != "drip":
            # What was sent before the cut fills little more than the sockets' buffers: never the gigabyte.
            assert sent < 64 * MAX_BYTES, (path, sent)

    # The healthy cluster kept its interval and went on syncing while the drip held readings open,
    # one after the other (each reading starts right after a sync asks for it, so a sync may fall
    # between two readings rather than inside one); the stalled clusters' own syncs did not wait for
    # their readings either.
    times = sorted(syncs[healthy.pk])
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 2 * INTERVAL_S, gaps
    drips = [(opened, closed) for path, opened, closed, _ in held if path == "drip"]
    first_opened, last_closed = min(o for o, _ in drips), max(c for _, c in drips)
    assert any(first_opened < t < last_closed for t in times), (times, drips)
    for cluster in stalled.values():
        assert len(syncs[cluster.pk]) >= 2, cluster.name
    assert "FLEETDECK_OUTBOUND_DEADLINE_S" in recorded["drip"], recorded["drip"]
