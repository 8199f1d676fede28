"""A worker that dies is seen and replaced, end to end on `make run`'s own command (without Ray):
killed while the supervisor is held, every page shows the banner within three ticks and /healthz
says the worker is stale while answering 200; let go, the supervisor restarts the worker, says so,
and the banner goes once it ticks again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from apps.demo.local_ray import free_port

REPO = Path(__file__).resolve().parents[2]
TICK_S = 1
BANNER = "Fleetdeck's worker has not run since"


def children_of(pid: int) -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if parent == pid:
                found[int(entry.name)] = command
    return found


def wait_until(predicate, what: str, log: Path, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"{what}\n{log.read_text(errors='replace')[-4000:]}"
        time.sleep(0.1)
    return result


@pytest.fixture
def runlocal(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DJANGO_", "DATABASE_URL", "CELERY_"))
    }
    env.update(
        FLEETDECK_DEBUG="1",
        FLEETDECK_VAR_DIR=str(tmp_path),
        FLEETDECK_ADMIN_PASSWORD="pw-for-test",
        FLEETDECK_TICK_INTERVAL_S=str(TICK_S),
    )
    port = free_port()
    log = tmp_path / "runlocal.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runlocal", "--no-ray", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, port, log
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise


def test_a_killed_worker_shows_on_every_page_within_three_ticks_and_make_run_replaces_it(runlocal):
    process, port, log = runlocal
    wait_until(lambda: "Fleetdeck is running" in log.read_text(errors="replace"), "runlocal did not come up", log)
    web = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    login = web.get("/accounts/login/")
    web.post(
        "/accounts/login/",
        data={"username": "admin", "password": "pw-for-test", "csrfmiddlewaretoken": login.cookies["csrftoken"]},
    )
    wait_until(lambda: web.get("/healthz").json()["worker"]["stale"] is False, "the worker never ticked", log)
    assert BANNER not in web.get("/").text
    worker = next(pid for pid, command in children_of(process.pid).items() if " worker " in command)

    # Held, the supervisor cannot restart the worker: this is what a worker nobody replaces looks like.
    os.kill(process.pid, signal.SIGSTOP)
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: BANNER in web.get("/").text, "no banner after the worker was killed", log, timeout_s=30)
    banner_s = time.monotonic() - killed
    health = web.get("/healthz")
    assert (
        health.status_code == 200
        and health.json()["worker"]["stale"] is True
        and health.json()["beat"]["stale"] is False
    )

    os.kill(process.pid, signal.SIGCONT)
    released = time.monotonic()
    wait_until(
        lambda: "worker was killed by SIGKILL; restarting it in 1 s (restart 1)" in log.read_text(errors="replace"),
        "the supervisor did not restart the worker",
        log,
    )
    wait_until(lambda: BANNER not in web.get("/").text, "the banner stayed after the restart", log)
    recovered_s = time.monotonic() - released

    print(
        f"\nworker killed -> banner in {banner_s:.1f} s (tick {TICK_S} s, stale after {3 * TICK_S} s); "
        f"supervisor let go -> worker restarted and ticking, banner gone, in {recovered_s:.1f} s"
    )
    assert banner_s < 3 * TICK_S + 5
    assert web.get("/healthz").json()["worker"]["stale"] is False
