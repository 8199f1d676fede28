"""The broker and the database restarted in the middle of a sync tick: the worker and beat ride
it out and every cluster is synced again, with its inventory intact. Beat killed and restarted
again and again, schedule file lost: a maintenance slot still runs once.

Everything here is real and private to the test: a PostgreSQL and a Redis of its own (the machine's
shared servers must not be taken down), a Celery worker and beat as `make run` starts them, and
a dashboard on loopback answering with payloads captured from Ray 2.60, slowed so that a restart
lands while a sync is reading it."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.fake_ray import serving
from tests.private_services import PrivatePostgres, PrivateRedis

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = ("eu-vision", "us-vision")
# Sync interval 5 s, tick 1 s (below): work must resume within a few intervals of the restart, not
# merely eventually; Celery's reconnect backoff takes the rest.
SYNC_INTERVAL_S = 5
RESUMED_WITHIN_S = 4 * SYNC_INTERVAL_S
SEED = f"""
from apps.accounts.models import Team
from apps.clusters.models import Cluster
team = Team.objects.create(name="Vision", slug="vision")
for name in {CLUSTERS!r}:
    Cluster.objects.create(name=name, team=team, dashboard_url="{{url}}", ray_version="2.60.0")
"""


class Stack:
    """Private PostgreSQL and Redis, a fake dashboard, and a worker and beat using them."""

    def __init__(self, root: Path, fake):
        self.root, self.fake = root, fake
        self.postgres = PrivatePostgres().start()
        self.postgres.create_database()
        self.redis = PrivateRedis(root / "redis").start()
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DATABASE_", "CELERY_", "DJANGO_"))
        }
        self.env = {
            **env,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "FLEETDECK_ALLOW_DEV_SECRET": "1",
            # The fake dashboard is on loopback, which is all these processes may call.
            "FLEETDECK_CLUSTER_NETWORKS": "127.0.0.0/8,::1/128",
            "DATABASE_URL": self.postgres.url,
            "CELERY_BROKER_URL": self.redis.url(0),
            # The cache lives on the same Redis, as in many deployments: it goes down with the broker.
            "FLEETDECK_CACHE_URL": self.redis.url(1),
            "FLEETDECK_VAR_DIR": str(root / "var"),
            "FLEETDECK_TICK_INTERVAL_S": "1",
            "FLEETDECK_SYNC_INTERVAL_S": str(SYNC_INTERVAL_S),
        }
        self.manage("migrate", "-v", "0")
        self.manage("shell", "-c", SEED.replace("{url}", fake.url))
        self.processes: dict[str, subprocess.Popen] = {}
        celery = [sys.executable, "-m", "celery", "-A", "controlplane"]
        self.spawn("worker", [*celery, "worker", "--loglevel", "INFO", "--concurrency", "2"])
        self.spawn("beat", [*celery, "beat", "--loglevel", "INFO", "--schedule", str(root / "var" / "beat-schedule")])

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            check=False,
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def sql(self, query: str, *params) -> list[tuple]:
        with psycopg.connect(self.postgres.url.replace("postgres://", "postgresql://"), connect_timeout=5) as db:
            return db.execute(query, params).fetchall()

    def spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the child writes it until stopped
        self.processes[name] = subprocess.Popen(
            command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def logs(self) -> str:
        files = [self.root / f"{name}.log" for name in self.processes] + [self.postgres.root / "postgres.log"]
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}" for path in files)

    def clusters(self) -> dict[str, tuple[dt.datetime | None, str]]:
        rows = self.sql("SELECT name, last_sync_at, reachability FROM clusters_cluster")
        return {name: (synced, reachability) for name, synced, reachability in rows}

    def application_count(self) -> int:
        return self.sql("SELECT count(*) FROM fleet_application")[0][0]

    def wait_all_synced_after(self, moment: dt.datetime, timeout_s: float = 60) -> float:
        """Seconds from `moment` until every cluster has synced since it."""
        deadline = time.monotonic() + timeout_s
        seen: dict = {}
        while time.monotonic() < deadline:
            try:
                seen = self.clusters()
            except psycopg.OperationalError:
                seen = {}
            if seen and all(synced and synced > moment and reach == "ok" for synced, reach in seen.values()):
                return (dt.datetime.now(dt.UTC) - moment).total_seconds()
            time.sleep(0.3)
        raise AssertionError(f"not every cluster synced again after {moment:%H:%M:%S.%f}: {seen}\n{self.logs()}")

    def assert_alive(self) -> None:
        for name, process in self.processes.items():
            assert process.poll() is None, f"{name} exited with {process.returncode}\n{self.logs()}"

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self.redis.stop()
        self.postgres.remove()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with serving() as fake:
        stack = Stack(tmp_path_factory.mktemp("restarts"), fake)
        try:
            stack.wait_all_synced_after(dt.datetime.min.replace(tzinfo=dt.UTC))
            yield stack
        finally:
            stack.close()


def in_the_middle_of_a_sync(stack: Stack) -> None:
    """Slow every read of Serve's status down, and return while a sync is inside one."""
    stack.fake.arm("GET", "/api/serve/applications", "delay")
    assert stack.fake.holding.wait(timeout=30), f"no sync reached the dashboard\n{stack.logs()}"


def test_a_broker_restart_during_a_sync_tick_loses_no_cluster(stack):
    applications = stack.application_count()
    in_the_middle_of_a_sync(stack)
    # Redis keeps nothing on disk here: every queued message (ticks, syncs) is lost with it.
    stack.redis.stop()
    time.sleep(2)  # the held sync finishes and beat's ticks fail while the broker is away
    stack.redis.start()
    restarted = dt.datetime.now(dt.UTC)

    took = stack.wait_all_synced_after(restarted)
    stack.assert_alive()
    assert stack.application_count() == applications
    print(f"\nevery cluster synced again {took:.1f} s after the restart")
    assert took < RESUMED_WITHIN_S, f"resumed after {took:.1f} s"


def test_a_database_restart_during_a_sync_tick_loses_no_cluster(stack):
    applications = stack.application_count()
    in_the_middle_of_a_sync(stack)
    # An immediate shutdown: every open connection is cut, as in a crash; the start runs recovery.
    stack.postgres.crash()
    time.sleep(2)  # the held sync comes back from the dashboard to a database that is gone
    stack.postgres.start()
    restarted = dt.datetime.now(dt.UTC)

    took = stack.wait_all_synced_after(restarted)
    stack.assert_alive()
    print(f"\nevery cluster synced again {took:.1f} s after the restart")
    assert took < RESUMED_WITHIN_S, f"resumed after {took:.1f} s"
    # The sync cut off mid-write rolled back whole: the inventory is what it was.
    assert stack.application_count() == applications


SCHEDULE = """
import datetime as dt
from django.utils import timezone
from apps.fleet.models import Deployment
from apps.maintenance.models import RecycleSchedule
model = Deployment.objects.get(application__cluster__name="eu-vision", application__name="demo", name="Model")
schedule = RecycleSchedule.objects.create(deployment=model, every_hours=1, next_run_at=timezone.now() + dt.timedelta(seconds=3))
print(schedule.pk)
"""  # noqa: E501 - the script runs as written in a subprocess, so its lines stay whole


def test_beat_killed_and_restarted_around_a_due_slot_runs_it_once(stack):
    schedule_id = int(stack.manage("shell", "-c", SCHEDULE).split()[-1])
    schedule_file = stack.root / "var" / "beat-schedule"
    # Kill beat with SIGKILL every second around the slot, each time losing its schedule file as a
    # new pod would: every fresh beat sends a tick at once.
    for _ in range(8):
        beat = stack.processes["beat"]
        os.killpg(beat.pid, signal.SIGKILL)
        beat.wait(timeout=10)
        for leftover in schedule_file.parent.glob(f"{schedule_file.name}*"):
            leftover.unlink()
        stack.spawn("beat", beat.args)
        time.sleep(1)
    # The last beat's ticks: wait for the run (a beat starts in one to a few seconds on a busy
    # machine), then for several more ticks that must not add a second one.
    query = "SELECT slot FROM maintenance_maintenancerun WHERE schedule_id = %s"
    deadline = time.monotonic() + 30
    while not stack.sql(query, schedule_id) and time.monotonic() < deadline:
        time.sleep(0.3)
    time.sleep(4)

    runs = stack.sql(query, schedule_id)
    assert len(runs) == 1, f"{runs}\n{stack.logs()}"
    stack.assert_alive()
