"""The README's run command end to end on the embedded defaults: everything comes up, the demo
cluster is registered and synced, and an interrupt stops everything it started, Ray included."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from apps.demo.local_ray import free_port

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]


def test_runlocal_starts_everything_and_an_interrupt_stops_it_all(tmp_path):
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DJANGO_", "DATABASE_URL", "CELERY_"))
    }
    # As `make run` does: the local head is on loopback, and loopback is all this Fleetdeck may call.
    env.update(
        FLEETDECK_DEBUG="1",
        FLEETDECK_VAR_DIR=str(tmp_path),
        FLEETDECK_ADMIN_PASSWORD="pw-for-test",
        FLEETDECK_CLUSTER_NETWORKS="127.0.0.0/8,::1/128",
    )
    log = tmp_path / "runlocal.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runlocal", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "Fleetdeck is running" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "runlocal did not come up"
            time.sleep(1)
        text = log.read_text(errors="replace")
        assert f"URL:      http://127.0.0.1:{port}/" in text and "admin / pw-for-test" in text
        dashboard = re.search(r"Ray:\s+(http://127\.0\.0\.1:\d+)", text).group(1)
        reference_app = re.search(r"reference app at (http://127\.0\.0\.1:\d+/reference)", text).group(1)
        generated = httpx.post(reference_app, json={"prompt": "hello", "max_tokens": 8}, timeout=30)
        assert generated.status_code == 200 and generated.json()["completion_tokens"] == 8

        web = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        assert web.get("/healthz").json()["status"] == "ok"
        login = web.get("/accounts/login/")
        web.post(
            "/accounts/login/",
            data={"username": "admin", "password": "pw-for-test", "csrfmiddlewaretoken": login.cookies["csrftoken"]},
        )
        deadline = time.monotonic() + 60
        while "demo" not in (page := web.get("/").text) or "Reachable" not in page:
            assert time.monotonic() < deadline, "the demo cluster was not synced by the worker"
            time.sleep(1)
        assert "local-demo" in page
    finally:
        process.send_signal(signal.SIGINT)
        returncode = process.wait(timeout=60)

    assert returncode == 0
    assert "Everything Fleetdeck started is stopped." in log.read_text(errors="replace")
    for url in (f"http://127.0.0.1:{port}/healthz", f"{dashboard}/api/version"):
        with pytest.raises(httpx.TransportError):
            httpx.get(url, timeout=2)
