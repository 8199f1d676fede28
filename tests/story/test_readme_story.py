"""The README's "Reproduce an OOM and fix it", walked as a new user walks it: `make run` with the
README's headroom on its own embedded database and broker, the second terminal's commands as
written, and the wizard driven in a real browser from the incident to "Fixed and verified".

It then holds the story to what it claims: the load's own counts agree with the verdict, and the
replicas processed the verification's requests in the time the calibration measured for the
request the values were sized for (not cache hits, not another request). About 5 minutes and
5 GiB of memory: `make story` runs it, `make test` does not (README, "Tests")."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from apps.demo.local_ray import free_port
from apps.remediation.measurements import TRAFFIC_RATIO
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.story

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "story-walk-password"
PYTHON = str(REPO / ".venv" / "bin" / "python")


class MakeRun:
    """`FLEETDECK_OOM_HEADROOM_GIB=5 make run` in its own process group, its output kept."""

    def __init__(self, env: dict[str, str]):
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            ["make", "run"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            assert self.process.poll() is None, "make run exited:\n" + "\n".join(self.lines[-40:])
            time.sleep(0.5)
        raise AssertionError(f"make run never printed {pattern!r}:\n" + "\n".join(self.lines[-40:]))

    def stop(self) -> None:
        """Ctrl-C, as the README says; whatever is left of its group after that is killed."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def run(env: dict[str, str], *command: str, timeout_s: float = 600) -> str:
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def reload_until(page, url: str, ready, what: str, timeout_s: float, every_s: float = 5.0):
    """Load `url` until `ready(page)` gives something truthy, as a person pressing reload would."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.goto(url)
        if found := ready(page):
            return found
        assert time.monotonic() < deadline, (
            f"{what}: not there after {timeout_s:.0f} s; the page says:\n" + (page.inner_text("main")[-3000:])
        )
        time.sleep(every_s)


def succeeded_share(summary: str) -> float:
    return int(re.search(r"\((\d+)% succeeded\)", summary).group(1)) / 100


@pytest.fixture
def story_env(tmp_path):
    # A new user's shell: none of the CI's PostgreSQL or broker, the embedded defaults in a
    # directory of their own, so nothing here touches another run's database.
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(
        FLEETDECK_OOM_HEADROOM_GIB="5",
        FLEETDECK_PORT=str(free_port()),
        FLEETDECK_ADMIN_PASSWORD=PASSWORD,
        FLEETDECK_VAR_DIR=str(tmp_path / "var"),
        FLEETDECK_DEBUG="1",
    )
    return env


def test_the_readme_story_from_an_oom_kill_to_fixed_and_verified(story_env, tmp_path):
    from playwright.sync_api import sync_playwright

    env = story_env
    server = MakeRun(env)
    load: subprocess.Popen | None = None
    try:
        server.wait_for(r"Ray memory monitor: kills above .* \(5\.0 GiB above now\)", 300)
        base = server.wait_for(r"URL:\s+(http://127\.0\.0\.1:\d+)/", 400).group(1)
        serve = server.wait_for(r"reference app at (http://\S+/reference)", 5).group(1)

        # The second terminal, as written.
        run(env, PYTHON, "manage.py", "demo_config", "misbehaving")
        first = run(env, PYTHON, "scripts/burst_load.py", serve, timeout_s=900)
        print(f"\nthe misbehaving config under the README's load:\n{first}")
        assert "500" in first, "the misbehaving config served the burst: no OOM to fix"
        token = run(env, "make", "--no-print-directory", "token", "USER=admin").strip()

        def oom_incidents():
            answer = httpx.get(
                f"{base}/api/v2/incidents/",
                params={"kind": "oom_kill"},
                headers={"Authorization": f"Token {token}"},
                timeout=30,
            ).json()
            return [i for i in answer["results"] if i["deployment_name"] == "Generator"]

        deadline = time.monotonic() + 120
        while not (incidents := oom_incidents()):
            assert time.monotonic() < deadline, "no OOM incident of reference/Generator within 120 s"
            time.sleep(5)
        incident = incidents[0]
        print(f"incident #{incident['id']}: {incident['title']}; causes {[c['id'] for c in incident['causes']]}")
        assert incident["causes"][0]["id"] == "OOM-2", incident["causes"]  # 16 at once on one replica

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(f"{base}/accounts/login/?next=/incidents/{incident['id']}/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")

            # 1. The incident, then the wizard.
            page.click("text=Fix with a wizard")
            page.wait_for_selector(".wizard-steps")
            wizard_url = page.url.split("?")[0]
            # 2. Nothing measured yet: the calibration first, its fields left empty.
            page.click("#wizard button:text('Calibrate')")
            reload_until(
                page,
                wizard_url,
                lambda p: p.query_selector(".wizard-steps .badge:text('Measured')"),
                "the calibration's result",
                600,
            )
            # 3. The config steps, recomputed from the measurement, applied as one change.
            apply = page.query_selector("#wizard button:text-matches('Apply .+ as one change')") or page.query_selector(
                "#wizard button:text-matches('^Apply R')"
            )
            assert apply is not None, page.inner_text("#wizard")[-3000:]
            applied_as = apply.inner_text()
            apply.click()
            page.wait_for_selector(".wizard-steps .badge:text('Applying')")
            reload_until(
                page,
                wizard_url,
                lambda p: not p.query_selector(".wizard-steps .badge:text('Applying')"),
                "the wizard's change",
                600,
            )
            assert not page.query_selector(".wizard-steps .badge:text('Change failed')"), page.inner_text("#wizard")

            # 4. A load that outlasts the window; the window set to 120 s while it runs.
            load = subprocess.Popen(
                [PYTHON, "scripts/burst_load.py", serve, "--bursts", "20"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            time.sleep(10)
            page.click(".wizard-steps >> text=Verification")
            page.fill("input[name=window_s]", "120")
            page.click("button:text('Start verification')")
            page.wait_for_selector(".wizard-steps .badge:text('Verifying')")
            # 5. The verdict.
            verdict = reload_until(
                page,
                wizard_url,
                lambda p: p.query_selector(".wizard-steps .badge:text-matches('Fixed and verified|Not fixed|Failed')"),
                "the verification's verdict",
                420,
            ).inner_text()
            page_text = page.inner_text("#wizard")
            page.screenshot(path=str(tmp_path / "wizard.png"), full_page=True)
            browser.close()
        second, _ = load.communicate(timeout=400)
        print(f"applied: {applied_as}; verdict: {verdict}\n{page_text[:1500]}\nthe load during verification:\n{second}")
        assert verdict == "Fixed and verified", page_text
        # What clients saw agrees: the wizard's objective is at most 5 % failed.
        assert succeeded_share(second) >= 0.95, second
        assert "Fixed and verified" in page_text

        # The replicas processed the window's requests in the time the calibration measured for the
        # request the values were sized for: the verdict judged the traffic that was sized.
        with sqlite3.connect(Path(env["FLEETDECK_VAR_DIR"]) / "fleetdeck.sqlite3") as db:
            after = json.loads(db.execute("select after from remediation_wizard").fetchone()[0])
            points = json.loads(
                db.execute(
                    "select points from calibration_memorycalibration where state = 'succeeded' order by id desc"
                ).fetchone()[0]
            )
        sized_s = min(points, key=lambda p: p["x"])["service_s"]
        print(f"processing p50 during verification {after['p50_ms']:.0f} ms; calibrated {sized_s * 1000:.0f} ms")
        assert 1 / TRAFFIC_RATIO <= after["p50_ms"] / (sized_s * 1000) <= TRAFFIC_RATIO
        assert after["oom_kills"] == 0 and after["client_requests"] > 0
    finally:
        if load is not None and load.poll() is None:
            load.kill()
        server.stop()
        print("\n".join(server.lines[-5:]))
    assert "Everything Fleetdeck started is stopped." in "\n".join(server.lines)
