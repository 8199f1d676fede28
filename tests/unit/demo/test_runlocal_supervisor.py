"""`make run` keeps its worker and beat running: the supervisor restarts one that exits, says so,
backs off while it keeps exiting, and ends what a dead one left behind."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from apps.demo.management.commands.runlocal import RESTART_BACKOFF_MAX_S, STABLE_RUN_S, Supervisor

EXITS = [sys.executable, "-c", "import sys; sys.exit(1)"]
RUNS = [sys.executable, "-c", "import time; time.sleep(60)"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def supervised():
    made: list[Supervisor] = []

    def make(commands):
        lines: list[str] = []
        clock = Clock()
        supervisor = Supervisor(commands, lines.append, clock=clock)
        made.append(supervisor)
        return supervisor, lines, clock

    yield make
    for supervisor in made:
        for process in supervisor.processes():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def wait_exited(supervisor: Supervisor, name: str) -> None:
    process = supervisor._children[name].process
    process.wait(timeout=30)


def test_a_worker_that_exits_is_restarted_after_the_backoff_and_the_restart_is_printed(supervised):
    supervisor, lines, clock = supervised({"worker": EXITS, "beat": RUNS})
    first = supervisor._children["worker"].process
    wait_exited(supervisor, "worker")

    supervisor.poll()
    assert lines == ["worker exited with code 1; restarting it in 1 s (restart 1)"]
    clock.now += 0.5
    supervisor.poll()
    assert supervisor._children["worker"].process is None
    clock.now += 0.5
    supervisor.poll()

    restarted = supervisor._children["worker"].process
    assert restarted is not None and restarted.pid != first.pid
    assert supervisor._children["beat"].process.poll() is None and len(lines) == 1


def test_a_crash_loop_waits_twice_as_long_each_time_up_to_the_cap(supervised):
    supervisor, lines, clock = supervised({"worker": EXITS})
    waits = []
    for _ in range(8):
        wait_exited(supervisor, "worker")
        supervisor.poll()
        waits.append(supervisor._children["worker"].restart_at - clock.now)
        clock.now = supervisor._children["worker"].restart_at
        supervisor.poll()

    assert waits == [1, 2, 4, 8, 16, 32, 60, 60] and RESTART_BACKOFF_MAX_S == 60
    assert lines[-1] == "worker exited with code 1; restarting it in 60 s (restart 8)"


def test_a_process_that_ran_a_while_before_it_exited_is_restarted_quickly_again(supervised):
    supervisor, lines, clock = supervised({"worker": EXITS})
    for _ in range(3):
        wait_exited(supervisor, "worker")
        supervisor.poll()
        clock.now = supervisor._children["worker"].restart_at
        supervisor.poll()
    clock.now += STABLE_RUN_S
    wait_exited(supervisor, "worker")

    supervisor.poll()

    assert lines[-1] == "worker exited with code 1; restarting it in 1 s (restart 4)"


def test_a_killed_worker_is_named_as_killed_and_what_it_left_running_is_ended(supervised, tmp_path):
    pidfile = tmp_path / "orphan.pid"
    # A prefork worker's pool child outlives its parent: this one starts one that sleeps.
    leaves_a_child = [
        sys.executable,
        "-c",
        "import subprocess, sys, time; "
        f"child = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(child.pid)); "
        "time.sleep(60)",
    ]
    supervisor, lines, _clock = supervised({"worker": leaves_a_child})
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    orphan = int(pidfile.read_text())
    os.kill(supervisor._children["worker"].process.pid, signal.SIGKILL)
    wait_exited(supervisor, "worker")

    supervisor.poll()

    assert lines == ["worker was killed by SIGKILL; restarting it in 1 s (restart 1)"]
    deadline = time.monotonic() + 10
    while _alive(orphan):
        assert time.monotonic() < deadline, "the orphan of the killed worker still runs"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"  # a zombie has ended, only its parent has not reaped it
    except FileNotFoundError:
        return False
