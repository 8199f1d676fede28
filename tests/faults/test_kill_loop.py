"""A worker killed with SIGKILL at random points of the push protocol, again and again, on a real
Ray cluster. Every change must end succeeded, rolled back or failed-with-nothing-changed, with a
step log that says what happened, the cluster running exactly the base or the new config, and
both applications still there.

Long (about 10 s a round): not part of `make test`. Run it with `make fault-loop`
(FAULT_LOOP_ROUNDS=20 by default)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import httpx
import pytest

from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from controlplane.celery import app as celery_app
from tests.conftest import two_app_config
from tests.integration.test_changes_worker import REPO, worker_env

pytestmark = [pytest.mark.fault_loop, pytest.mark.ray, pytest.mark.django_db(transaction=True)]
MODEL = [{"application": "demo", "deployment": "Model"}]
ROUNDS = int(os.environ.get("FAULT_LOOP_ROUNDS", "20"))
ENDINGS = {ChangeState.SUCCEEDED, ChangeState.ROLLED_BACK, ChangeState.FAILED}


def generation(head) -> str:
    body = httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()
    assert set(body["applications"]) == {"demo", "echo2"}, "an application was lost"
    return body["applications"]["demo"]["deployments"]["Model"]["deployment_config"]["ray_actor_options"][
        "runtime_env"
    ]["env_vars"]["RECYCLE_GENERATION"]


# Where a kill is aimed: before any worker took the change up, while it re-reads the live config,
# around the PUT, and while it verifies (with a rollback, if verification fails).
STAGES = [ChangeState.QUEUED, ChangeState.CHECKING, ChangeState.PUSHING, ChangeState.VERIFYING, ChangeState.VERIFYING]
ORDER = [ChangeState.QUEUED, ChangeState.CHECKING, ChangeState.PUSHING, ChangeState.VERIFYING, ChangeState.ROLLING_BACK]


def wait_for_stage(change_id: int, aim: str, timeout_s: float = 60) -> str:
    """Poll until the change is at `aim` or past it (or final); the state seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = Change.objects.values_list("state", flat=True).get(pk=change_id)
        if state not in ORDER or ORDER.index(state) >= ORDER.index(aim) or time.monotonic() > deadline:
            return state
        time.sleep(0.005)


def test_changes_survive_a_worker_killed_at_random_points(api_as, ray_head, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 90
    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    celery_app.control.purge()
    ray_head.deploy(two_app_config())
    cluster = Cluster.objects.create(
        name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0"
    )
    client = api_as("operator")
    rng = random.Random(20261130)
    seen: dict[str, int] = {}
    try:
        for round_ in range(ROUNDS):
            before = generation(ray_head)
            target = str(int(before) + 1)
            # Replacing replicas takes seconds, which spreads the kill over every step of the protocol.
            options = f"ray_actor_options:\n  runtime_env:\n    env_vars:\n      RECYCLE_GENERATION: '{target}'"
            planned = client.post(
                "/api/v1/changes/",
                {
                    "cluster": cluster.pk,
                    "targets": MODEL,
                    "options_text": options,
                    "reason": f"kill loop round {round_}",
                },
                format="json",
            )
            assert planned.status_code == 201, planned.content
            change_id = planned.json()["id"]
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "controlplane",
                    "worker",
                    "--pool",
                    "solo",
                    "--loglevel",
                    "WARNING",
                ],
                cwd=REPO,
                env=worker_env(),
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                assert client.post(f"/api/v1/changes/{change_id}/apply/").status_code == 202
                # A point of the protocol first, then a moment inside it: a kill timed from the
                # apply alone would mostly land while the worker is still starting.
                aim = rng.choice(STAGES)
                reached = wait_for_stage(change_id, aim)
                time.sleep(rng.uniform(0, 1.5 if reached == ChangeState.VERIFYING else 0.05))
                killed_in = Change.objects.get(pk=change_id).state
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
            finally:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
            seen[killed_in] = seen.get(killed_in, 0) + 1

            # What the beat tick does once the heartbeat is stale: reconcile, and run what it re-queued.
            settings.FLEETDECK_CHANGE_STALE_S = 0
            deadline = time.monotonic() + 180
            change = Change.objects.get(pk=change_id)
            while not change.is_final:
                assert time.monotonic() < deadline, f"round {round_}: change stuck in {change.state}"
                if change.state == ChangeState.QUEUED:
                    protocol.run(change_id)
                else:
                    time.sleep(0.05)
                    protocol.reconcile(change_id)
                change = Change.objects.get(pk=change_id)
            settings.FLEETDECK_CHANGE_STALE_S = 60

            log = "\n".join(f"{s.state}: {s.message}" for s in change.steps.all())
            assert change.state in ENDINGS, f"round {round_} (killed in {killed_in}): {change.state}\n{log}"
            live = generation(ray_head)
            assert live == (target if change.state == ChangeState.SUCCEEDED else before), (
                f"round {round_}: {live}\n{log}"
            )
            if change.state == ChangeState.FAILED:
                assert "nothing" in (change.error + log).lower(), log
    finally:
        print(f"\nkilled in: {seen}")
        ray_head.deploy(two_app_config())
    # The kills must have reached the protocol's middle, not only changes no worker had taken up.
    middle = {state: n for state, n in seen.items() if state in ORDER and state != ChangeState.QUEUED}
    assert len(middle) >= 3 and sum(middle.values()) >= ROUNDS // 2, seen
