"""Changes through the API and real Celery workers, including one killed with SIGKILL mid-change."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connection

from apps.accounts.models import AuditEvent
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from controlplane.celery import app as celery_app
from tests.conftest import two_app_config

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]
REPO = Path(__file__).resolve().parents[2]
MODEL = [{"application": "demo", "deployment": "Model"}]


@pytest.fixture
def cluster(ray_head, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 90
    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    celery_app.control.purge()
    yield Cluster.objects.create(name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0")
    ray_head.deploy(two_app_config())


def wait_final(change_id: int, timeout_s: float = 120) -> Change:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        change = Change.objects.get(pk=change_id)
        if change.is_final:
            return change
        time.sleep(0.2)
    raise AssertionError(f"change {change_id} still {Change.objects.get(pk=change_id).state}")


def effective(head, app="demo", dep="Model") -> dict:
    body = httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()
    return body["applications"][app]["deployments"][dep]["deployment_config"]


def test_plan_apply_and_roll_back_through_the_api_with_a_worker(api_as, cluster, ray_head):
    client = api_as("operator")
    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        planned = client.post(
            "/api/v1/changes/",
            {
                "cluster": cluster.pk,
                "targets": MODEL,
                "options_text": "max_ongoing_requests: 6\nmax_queued_requests: 20",
                "reason": "cap queue",
            },
            format="json",
        )
        assert planned.status_code == 201, planned.content
        body = planned.json()
        assert body["state"] == "planned"
        assert {op["path"] for op in body["json_patch"]} == {
            "/applications/0/deployments/1/max_ongoing_requests",
            "/applications/0/deployments/1/max_queued_requests",
        }
        started = time.monotonic()
        applied = client.post(f"/api/v1/changes/{body['id']}/apply/")
        assert applied.status_code == 202 and applied.json()["state"] == "queued"
        change = wait_final(body["id"])
        elapsed = time.monotonic() - started
        assert change.state == ChangeState.SUCCEEDED, [s.message for s in change.steps.all()]
        assert effective(ray_head)["max_queued_requests"] == 20
        print(f"\napply → verified: {elapsed:.2f} s")

        rolled = client.post(f"/api/v1/changes/{body['id']}/rollback/")
        assert rolled.status_code == 202, rolled.content
        restore = wait_final(rolled.json()["id"])
        assert restore.state == ChangeState.SUCCEEDED and restore.restores_id == body["id"]
        assert effective(ray_head)["max_queued_requests"] == 100
    detail = api_as("viewer").get(f"/api/v1/changes/{body['id']}/").json()
    assert [s["state"] for s in detail["steps"]][-1] == "succeeded"
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"change.plan", "change.apply", "change.succeeded"} <= actions
    assert AuditEvent.objects.filter(action="change.plan", changes__reason="cap queue").exists()


def test_viewers_cannot_plan_or_apply(api_as, cluster):
    response = api_as("viewer").post(
        "/api/v1/changes/",
        {"cluster": cluster.pk, "targets": MODEL, "options": {"max_ongoing_requests": 6}, "reason": "x"},
        format="json",
    )
    assert response.status_code == 403


def worker_env() -> dict:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{db['NAME']}"
    else:
        url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = dict(
        os.environ, DATABASE_URL=url, FLEETDECK_ALLOW_DEV_SECRET="1", DJANGO_SETTINGS_MODULE="controlplane.settings"
    )
    return env


def killable_worker() -> subprocess.Popen:
    """A solo worker in a session of its own, so a test can SIGKILL it and all it started."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "solo", "--loglevel", "WARNING"],
        cwd=REPO,
        env=worker_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_a_worker_killed_mid_change_is_finished_by_the_reconciler(api_as, cluster, ray_head, settings):
    client = api_as("operator")
    # Replacing replicas takes seconds, which gives the kill a window inside the protocol.
    options = "ray_actor_options:\n  runtime_env:\n    env_vars:\n      RECYCLE_GENERATION: '2'"
    planned = client.post(
        "/api/v1/changes/",
        {"cluster": cluster.pk, "targets": MODEL, "options_text": options, "reason": "recycle"},
        format="json",
    )
    assert planned.status_code == 201, planned.content
    change_id = planned.json()["id"]
    worker = killable_worker()
    try:
        assert client.post(f"/api/v1/changes/{change_id}/apply/").status_code == 202
        deadline = time.monotonic() + 60
        while Change.objects.get(pk=change_id).state not in (ChangeState.PUSHING, ChangeState.VERIFYING):
            assert time.monotonic() < deadline, Change.objects.get(pk=change_id).state
            time.sleep(0.05)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    killed_in = Change.objects.get(pk=change_id).state
    assert killed_in in (ChangeState.PUSHING, ChangeState.VERIFYING)

    settings.FLEETDECK_CHANGE_STALE_S = 0
    time.sleep(0.1)
    assert change_id in protocol.stale_changes()
    protocol.reconcile(change_id)

    change = Change.objects.get(pk=change_id)
    assert change.state in (ChangeState.SUCCEEDED, ChangeState.ROLLED_BACK, ChangeState.FAILED), change.state
    log = "\n".join(step.message for step in change.steps.all())
    assert "Reconciler: the worker stopped" in log
    live = effective(ray_head)["ray_actor_options"]["runtime_env"]["env_vars"]["RECYCLE_GENERATION"]
    assert live == ("2" if change.state == ChangeState.SUCCEEDED else "1")
