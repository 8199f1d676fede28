"""Run the whole product on this machine: web, Celery worker and beat on the embedded defaults,
plus a local Ray head with the reference Serve application, registered and synced. A worker or
beat that exits is started again, after a backoff that grows while it keeps exiting. Ctrl-C stops all.

FLEETDECK_OOM_HEADROOM_GIB=3 sets the head's memory monitor to kill 3 GiB above the machine's
memory use at start, so the misbehaving config's OOM kills happen without exhausting the machine."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.services import ensure_team, grant
from apps.clusters import services
from apps.clusters.models import Cluster
from apps.demo.local_ray import (
    GIB,
    MAX_MEMORY_THRESHOLD,
    REFERENCE_APP_DIR,
    REFERENCE_WARMUP,
    LocalRayHead,
    memory_monitor_env,
    memory_usage,
    threshold_for_headroom,
)
from apps.fleet import sync
from apps.fleet.models import Application
from apps.maintenance import schedules

DEMO_CLUSTER = "local-demo"
HEADROOM_VAR = "FLEETDECK_OOM_HEADROOM_GIB"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("FLEETDECK_PORT", "8700")))
        parser.add_argument("--no-ray", action="store_true", help="Do not start the local Ray head and reference app.")

    def handle(self, *args, port: int, no_ray: bool, **options):
        headroom_gib = oom_headroom_gib(os.environ.get(HEADROOM_VAR))
        processes: list[subprocess.Popen] = []
        supervisor: Supervisor | None = None
        head: LocalRayHead | None = None
        # Ctrl-C must work even when started from a context that ignores SIGINT (a background
        # job, nohup); SIGTERM from a supervisor gets the same orderly stop.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            call_command("migrate", interactive=False, verbosity=0)
            username, password = self._ensure_admin()
            if not no_ray:
                self.stdout.write("Starting a local Ray head on loopback…")
                extra_env = {}
                if headroom_gib is not None:
                    usage = memory_usage()
                    threshold = threshold_for_headroom(headroom_gib, usage)
                    extra_env = memory_monitor_env(threshold)
                    self.stdout.write(memory_monitor_line(threshold, usage, headroom_gib))
                head = LocalRayHead.start(extra_env=extra_env)
                head.wait_ready()
                self.stdout.write(f"Ray dashboard at {head.dashboard_url}; deploying the reference Serve application…")
                head.deploy(json.loads((REFERENCE_APP_DIR / "reference.json").read_text()))
                self._register(head)
            commands = self._commands(port)
            web = subprocess.Popen(commands.pop("web"), start_new_session=True)
            processes.append(web)
            supervisor = Supervisor(commands, self.stdout.write)
            _wait_listening(port, web, supervisor)
            self.stdout.write(
                self.style.SUCCESS(
                    "\nFleetdeck is running.\n"
                    f"  URL:      http://127.0.0.1:{port}/\n"
                    f"  Login:    {username} / {password}\n"
                    f"  API docs: http://127.0.0.1:{port}/api/docs/\n"
                    + (
                        f"  Ray:      {head.dashboard_url} (reference app at {head.serve_url}/reference)\n"
                        if head
                        else ""
                    )
                    + "Press Ctrl-C to stop everything.\n"
                )
            )
            while True:
                # The web server is what the person at the keyboard uses: when it goes, say so and stop.
                if web.poll() is not None:
                    raise CommandError(f"web {exit_description(web.returncode)}; stopping.")
                supervisor.poll()
                time.sleep(1)
        except KeyboardInterrupt:
            self.stdout.write("\nStopping…")
        finally:
            if head is not None:
                head.begin_stop()
            _stop_all(processes + (supervisor.processes() if supervisor else []))
            if head is not None:
                head.stop()
                self.stdout.write("Ray head stopped.")
            self.stdout.write("Everything Fleetdeck started is stopped.")

    def _ensure_admin(self) -> tuple[str, str]:
        username = os.environ.get("FLEETDECK_ADMIN_USER", "admin")
        password = os.environ.get("FLEETDECK_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username=username, defaults={"is_staff": True})
        user.is_superuser = user.is_staff = True
        user.set_password(password)
        user.save()
        grant(Actor.system(via="cli"), user, ensure_team("Platform"), Role.ADMIN)
        return username, password

    def _register(self, head: LocalRayHead) -> None:
        actor = Actor.system(via="cli")
        existing = Cluster.objects.filter(name=DEMO_CLUSTER).first()
        metrics_url = f"http://127.0.0.1:{head.ports['metrics-export-port']}/metrics"
        if existing:
            services.update_cluster(actor, existing, dashboard_url=head.dashboard_url, metrics_url=metrics_url)
            services.request_sync(actor, existing)
        else:
            services.register_cluster(
                actor,
                name=DEMO_CLUSTER,
                team=ensure_team("Platform"),
                dashboard_url=head.dashboard_url,
                labels={"env": "local"},
                metrics_url=metrics_url,
            )
        self._ensure_warmup(actor, Cluster.objects.get(name=DEMO_CLUSTER))

    def _ensure_warmup(self, actor: Actor, cluster: Cluster) -> None:
        """The reference app's warmup profile, so recycles warm it and a calibration has a request
        its POST-only route serves. Synced here first: the application row must exist."""
        sync.sync_cluster(cluster.pk)
        application = Application.objects.filter(cluster=cluster, name="reference", removed_at__isnull=True).first()
        if application is not None and not application.warmup_profiles.exists():
            schedules.save_profile(actor, application, dict(REFERENCE_WARMUP))

    def _commands(self, port: int) -> dict[str, list[str]]:
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "controlplane"]
        return {
            "web": [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            # As deployed: changes and maintenance runs, which wait minutes on Ray, in processes of
            # their own, so syncs and the tick never wait behind them.
            "worker": [
                *celery,
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "-Q",
                "celery,tick,metrics",
                "--hostname",
                "worker@%h",
            ],
            "worker-long": [
                *celery,
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "1",
                "-Q",
                "long",
                "--hostname",
                "long@%h",
            ],
            # At INFO beat logs each tick it sends, a line every 10 s in the terminal; its warnings still show.
            "beat": [*celery, "beat", "--loglevel", "WARNING"],
        }


# The first restart waits this long; each further exit soon after a start doubles it, up to the cap.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
# A process that ran this long before it exited was not crash-looping: its restart waits the least again.
STABLE_RUN_S = 60.0


@dataclass
class _Child:
    command: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    quick_exits: int = 0
    restarts: int = 0


class Supervisor:
    """Keeps background processes running: one that exits is started again after a backoff, and
    the restart is printed. Each process runs in a session of its own, so what it leaves behind
    (a prefork pool child still running a task) is ended with it before the new one starts."""

    def __init__(
        self,
        commands: dict[str, list[str]],
        write: Callable[[str], object],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._write, self._clock = write, clock
        self._children = {name: _Child(command) for name, command in commands.items()}
        for child in self._children.values():
            self._start(child)

    def processes(self) -> list[subprocess.Popen]:
        return [child.process for child in self._children.values() if child.process is not None]

    def poll(self) -> None:
        now = self._clock()
        for name, child in self._children.items():
            if child.process is None:
                if now >= child.restart_at:
                    self._start(child)
                continue
            code = child.process.poll()
            if code is None:
                continue
            _end_session(child.process)
            child.process = None
            if now - child.started_at >= STABLE_RUN_S:
                child.quick_exits = 0
            wait = min(RESTART_BACKOFF_S * 2**child.quick_exits, RESTART_BACKOFF_MAX_S)
            child.quick_exits += 1
            child.restart_at = now + wait
            child.restarts += 1
            self._write(f"{name} {exit_description(code)}; restarting it in {wait:g} s (restart {child.restarts})")

    def _start(self, child: _Child) -> None:
        child.process = subprocess.Popen(child.command, start_new_session=True)
        child.started_at = self._clock()


def exit_description(code: int) -> str:
    """How a child ended, as Popen reports it: a negative code is the signal that killed it."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _end_session(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # nothing of it is left
        os.killpg(process.pid, signal.SIGKILL)


def oom_headroom_gib(value: str | None) -> float | None:
    """FLEETDECK_OOM_HEADROOM_GIB as GiB; None when unset or empty."""
    if value is None or not value.strip():
        return None
    try:
        gib = float(value)
    except ValueError:
        raise CommandError(f"{HEADROOM_VAR} must be a number of GiB, e.g. {HEADROOM_VAR}=3; got {value!r}.") from None
    if not 0 < gib < math.inf:
        raise CommandError(
            f"{HEADROOM_VAR} must be more than 0 GiB (the memory Ray may use above the machine's use now); got "
            f"{value!r}."
        )
    return gib


def memory_monitor_line(threshold: float, usage: tuple[int, int], headroom_gib: float) -> str:
    used, total = usage
    limit = threshold * total
    line = f"Ray memory monitor: kills above {limit / GIB:.1f} GiB used ({(limit - used) / GIB:.1f} GiB above now)"
    if threshold >= MAX_MEMORY_THRESHOLD:
        line += (
            f"; capped at Ray's default, {MAX_MEMORY_THRESHOLD:.0%} of {total / GIB:.1f} GiB, short of the "
            f"{headroom_gib:g} GiB asked: above it the kernel's OOM killer may act first"
        )
    return line


def _wait_listening(port: int, web: subprocess.Popen, supervisor: Supervisor, timeout_s: float = 60.0) -> None:
    """Print the URL only once it answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise CommandError(f"web {exit_description(web.returncode)} while starting.")
        supervisor.poll()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise CommandError(f"The web server did not listen on port {port} within {timeout_s:.0f} s.")


def _stop_all(processes: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    """SIGTERM every process at once, then give them `timeout_s` together before SIGKILL."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
