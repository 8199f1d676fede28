"""How tasks are delivered, as Celery's documentation advises: late acknowledgement only where
running twice is harmless, redelivery when a worker dies, a visibility timeout above any task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.core import jobs, ticks
from controlplane.celery import app
from workers import tasks

REPO = Path(__file__).resolve().parents[3]
IDEMPOTENT = [
    tasks.sync_cluster,
    tasks.sync_batch,
    tasks.tick,
    tasks.reconcile_change,
    tasks.poll_calibration,
    tasks.inspect_kubernetes,
]
# A second run would push twice, recycle twice or notify twice; their rows carry the recovery.
ONCE = [tasks.run_change, tasks.run_maintenance, tasks.deliver_webhook]


def test_only_tasks_that_may_run_twice_are_acknowledged_late():
    assert all(task.acks_late for task in IDEMPOTENT)
    assert not any(task.acks_late for task in ONCE)
    assert app.conf.task_reject_on_worker_lost is True


@pytest.mark.parametrize("verify_s", [None, "2400"])
def test_redis_redelivers_only_after_the_longest_task_could_have_finished(verify_s):
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CELERY_BROKER_TRANSPORT_OPTIONS.get('visibility_timeout'), "
        "s.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETDECK_", "DJANGO_", "CELERY_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        FLEETDECK_DEBUG="1",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/0",
        FLEETDECK_VAR_DIR="/tmp/fleetdeck-settings-test",
    )
    if verify_s:
        env["FLEETDECK_CHANGE_VERIFY_TIMEOUT_S"] = verify_s
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    timeout, verify = json.loads(result.stdout.strip().splitlines()[-1])
    # A change verifies, may roll back and verify again: redelivery must wait longer than both.
    assert timeout > 2 * verify and verify == int(verify_s or 180)


def test_every_job_a_service_can_enqueue_is_a_task_the_worker_registers():
    assert sorted(set(jobs.ALL) - set(app.tasks)) == []


def test_the_tick_runs_each_apps_due_work_in_its_order():
    assert [handler.__qualname__ for handler in ticks.handlers()] == [
        "due_syncs",
        "due_reconciles",
        "advance_running",
        "due_runs",
        "lost_deliveries",
        "alerts_still_open",
        "stale_polls",
        "evaluate_due",
        "decide_shadows",
        "settle_awaiting",
        "settle_orphaned_steps",
        "prune",
        "prune_decisions",
        "prune_revisions",
        "prune_step_logs",
        "prune_audit",
        "prune_windows",
    ]
