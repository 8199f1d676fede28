"""A worker killed with SIGKILL at random points of the push protocol, again and again, on a real
Ray cluster. Every change must end succeeded, rolled back or failed-with-nothing-changed, with a
step log that says what happened and at most one push, the cluster running exactly the base or the
new config, and every other application still there, its replicas untouched.

Three kinds of change go through it: option patches planned through the API, whole applications
deployed and deleted, and a remediation wizard's change, whose steps must then say what happened
to it within one tick whatever moment the worker died at (after the change ended, too).

Long (about 10 s a round): not part of `make test`. Run it with `make fault-loop`
(FAULT_LOOP_ROUNDS=20 by default, for each kind)."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

import httpx
import pytest
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from apps.demo.local_ray import DEMO_APP_DIR
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.incidents.models import Incident
from apps.remediation import diagnosis, wizards
from apps.remediation.models import Wizard, WizardStep
from controlplane.celery import app as celery_app
from tests.conftest import two_app_config
from tests.integration.test_changes_worker import killable_worker

pytestmark = [pytest.mark.fault_loop, pytest.mark.ray, pytest.mark.django_db(transaction=True)]
MODEL = [{"application": "demo", "deployment": "Model"}]
ROUNDS = int(os.environ.get("FAULT_LOOP_ROUNDS", "20"))
ENDINGS = {ChangeState.SUCCEEDED, ChangeState.ROLLED_BACK, ChangeState.FAILED}
BASE_APPS = {"demo", "echo2"}
PUSHED = "Pushing the full config"

# Where a kill is aimed: before any worker took the change up, while it re-reads the live config,
# around the PUT, and while it verifies (with a rollback, if verification fails).
STAGES = [ChangeState.QUEUED, ChangeState.CHECKING, ChangeState.PUSHING, ChangeState.VERIFYING, ChangeState.VERIFYING]
ORDER = [ChangeState.QUEUED, ChangeState.CHECKING, ChangeState.PUSHING, ChangeState.VERIFYING, ChangeState.ROLLING_BACK]
# A wizard's steps are settled by the change's end signal, sent by the process that ends it: a
# kill just after the end, before or while the worker sends it, leaves them to the tick.
ENDED = "ended"


def ray_apps(head) -> dict:
    return httpx.get(f"{head.dashboard_url}/api/serve/applications/", timeout=10).json()["applications"]


def generation(head) -> str:
    apps = ray_apps(head)
    assert set(apps) >= BASE_APPS, f"an application was lost: {sorted(apps)}"
    return apps["demo"]["deployments"]["Model"]["deployment_config"]["ray_actor_options"]["runtime_env"]["env_vars"][
        "RECYCLE_GENERATION"
    ]


def replica_ids(head, names) -> dict[str, set[str]]:
    apps = ray_apps(head)
    return {
        name: {r["replica_id"] for dep in apps[name]["deployments"].values() for r in dep["replicas"]} for name in names
    }


def recycle_options(target: str) -> dict:
    # Replacing replicas takes seconds, which spreads the kill over every step of the protocol.
    return {"ray_actor_options": {"runtime_env": {"env_vars": {"RECYCLE_GENERATION": target}}}}


def wait_for_stage(change_id: int, aim: str, timeout_s: float = 60) -> str:
    """Poll until the change is at `aim` or past it (or final); the state seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = Change.objects.values_list("state", flat=True).get(pk=change_id)
        if state not in ORDER or time.monotonic() > deadline:
            return state
        if aim != ENDED and ORDER.index(state) >= ORDER.index(aim):
            return state
        time.sleep(0.005)


def killed_during(send: Callable[[], int], rng: random.Random, stages: list[str]) -> tuple[int, str]:
    """Start a worker, hand it a change with `send` (which returns the change's id), and SIGKILL it
    at a random point of the protocol; the change's id and the state it was in when the worker died."""
    worker = killable_worker()
    try:
        change_id = send()
        # A point of the protocol first, then a moment inside it: a kill timed from the apply alone
        # would mostly land while the worker is still starting.
        aim = rng.choice(stages)
        reached = wait_for_stage(change_id, aim)
        if aim != ENDED:
            time.sleep(rng.uniform(0, 1.5 if reached == ChangeState.VERIFYING else 0.05))
        killed_in = Change.objects.get(pk=change_id).state
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    return change_id, killed_in


def settled(change_id: int, settings, round_: int) -> Change:
    """What the beat tick does once the heartbeat is stale: reconcile, and run what it re-queued."""
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
    return change


def step_log(change: Change) -> str:
    return "\n".join(f"{s.state}: {s.message}" for s in change.steps.all())


def check_ending(change: Change, round_: int, killed_in: str) -> str:
    """The change ended as one of the three allowed endings, pushed at most once; its log."""
    log = step_log(change)
    assert change.state in ENDINGS, f"round {round_} (killed in {killed_in}): {change.state}\n{log}"
    assert change.steps.filter(message__startswith=PUSHED).count() <= 1, f"round {round_}: pushed twice\n{log}"
    if change.state == ChangeState.FAILED:
        assert "nothing" in (change.error + log).lower(), log
    return log


def reached_the_middle(seen: dict[str, int]) -> None:
    """The kills must have reached the protocol's middle, not only changes no worker had taken up."""
    middle = {state: n for state, n in seen.items() if state in ORDER and state != ChangeState.QUEUED}
    assert len(middle) >= 3 and sum(middle.values()) >= ROUNDS // 2, seen


@pytest.fixture
def cluster(ray_head, team, settings):
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 90
    settings.FLEETDECK_CHANGE_POLL_S = 0.3
    celery_app.control.purge()
    ray_head.deploy(two_app_config())
    yield Cluster.objects.create(name="local", team=team, dashboard_url=ray_head.dashboard_url, ray_version="2.60.0")
    ray_head.deploy(two_app_config())


def test_changes_survive_a_worker_killed_at_random_points(api_as, ray_head, cluster, settings):
    client = api_as("operator")
    rng = random.Random(20261130)
    seen: dict[str, int] = {}
    try:
        for round_ in range(ROUNDS):
            before = generation(ray_head)
            target = str(int(before) + 1)
            options = f"ray_actor_options:\n  runtime_env:\n    env_vars:\n      RECYCLE_GENERATION: '{target}'"
            planned = client.post(
                "/api/v1/changes/",
                {"cluster": cluster.pk, "targets": MODEL, "options_text": options, "reason": f"kill loop {round_}"},
                format="json",
            )
            assert planned.status_code == 201, planned.content
            planned_id = planned.json()["id"]

            def send(change_id=planned_id) -> int:
                assert client.post(f"/api/v1/changes/{change_id}/apply/").status_code == 202
                return change_id

            change_id, killed_in = killed_during(send, rng, STAGES)
            seen[killed_in] = seen.get(killed_in, 0) + 1
            change = settled(change_id, settings, round_)

            log = check_ending(change, round_, killed_in)
            live = generation(ray_head)
            assert live == (target if change.state == ChangeState.SUCCEEDED else before), (
                f"round {round_}: {live}\n{log}"
            )
    finally:
        print(f"\nkilled in: {seen}")
    reached_the_middle(seen)


def new_app() -> dict:
    return {
        "name": "echo3",
        "route_prefix": "/echo3",
        "import_path": "demo_app:echo_only",
        "runtime_env": {"env_vars": {"PYTHONPATH": str(DEMO_APP_DIR)}},
        "deployments": [{"name": "Echo", "num_replicas": 1}],
    }


def test_deploying_and_deleting_applications_survive_a_worker_killed_at_random_points(
    ray_head, cluster, people, settings
):
    operator = Actor(user=people["operator"], via="api")
    rng = random.Random(20261206)
    seen: dict[str, int] = {}
    others = replica_ids(ray_head, BASE_APPS)
    try:
        for round_ in range(ROUNDS):
            present = "echo3" in ray_apps(ray_head)
            if present:
                change = protocol.plan_delete_app(operator, cluster, application="echo3", reason=f"kill loop {round_}")
            else:
                change = protocol.plan_create_app(operator, cluster, app=new_app(), reason=f"kill loop {round_}")

            def send(change=change, present=present) -> int:
                return protocol.request_apply(operator, change, confirm="echo3" if present else None).pk

            change_id, killed_in = killed_during(send, rng, STAGES)
            seen[killed_in] = seen.get(killed_in, 0) + 1
            change = settled(change_id, settings, round_)

            log = check_ending(change, round_, killed_in)
            apps = ray_apps(ray_head)
            wanted = present != (change.state == ChangeState.SUCCEEDED)
            assert ("echo3" in apps) == wanted, f"round {round_} ({change.kind}, {change.state}): {sorted(apps)}\n{log}"
            # Nothing brings a replica of the other applications down, whatever the worker died in.
            assert replica_ids(ray_head, BASE_APPS) == others, f"round {round_}: another application restarted\n{log}"
    finally:
        print(f"\nkilled in: {seen}")
    reached_the_middle(seen)


def open_wizard(cluster: Cluster, operator: Actor, incident: Incident, target: str) -> Wizard:
    """A wizard on demo/Model whose one config step is ready to apply, as a computed remedy is:
    its values were computed from the config live now."""
    sync.sync_cluster(cluster.pk)
    deployment = Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")
    wizard = Wizard.objects.create(
        incident=incident,
        cluster=cluster,
        deployment=deployment,
        application_name="demo",
        deployment_name="Model",
        basis=diagnosis.basis_of(deployment.effective_config, timezone.now().isoformat()),
        created_by=operator.user,
        updated_by=operator.user,
    )
    WizardStep.objects.create(
        wizard=wizard,
        position=1,
        kind=WizardStep.Kind.CONFIG,
        remedy="R1",
        title="Replace the replicas",
        patch=recycle_options(target),
    )
    return wizard


def test_a_wizard_s_change_survives_a_worker_killed_at_random_points_and_its_steps_say_so(
    ray_head, cluster, people, settings
):
    operator = Actor(user=people["operator"], via="api")
    rng = random.Random(20261207)
    seen: dict[str, int] = {}
    now = timezone.now()
    incident = Incident.objects.create(
        kind=Incident.Kind.OOM_KILL,
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        title="demo/Model: replica killed by the memory monitor",
        started_at=now,
        last_signal_at=now,
    )
    try:
        for round_ in range(ROUNDS):
            before = generation(ray_head)
            target = str(int(before) + 1)
            wizard = open_wizard(cluster, operator, incident, target)

            def send(wizard=wizard) -> int:
                return wizards.apply(operator, wizard, [1], revision=wizard.revision).pk

            change_id, killed_in = killed_during(send, rng, [*STAGES, ENDED])
            seen[killed_in] = seen.get(killed_in, 0) + 1
            change = settled(change_id, settings, round_)
            log = check_ending(change, round_, killed_in)

            # One tick: nothing is left applying, and the step says what the change did.
            wizards.settle_orphaned_steps()
            step = WizardStep.objects.get(wizard=wizard, position=1)
            assert step.status == (
                WizardStep.Status.APPLIED if change.state == ChangeState.SUCCEEDED else WizardStep.Status.FAILED
            ), f"round {round_} (killed in {killed_in}): step {step.status}, change {change.state}\n{log}"
            assert step.change_id == change.pk
            assert Change.objects.filter(reason__startswith=f"Wizard #{wizard.pk} ").count() == 1
            live = generation(ray_head)
            assert live == (target if change.state == ChangeState.SUCCEEDED else before), (
                f"round {round_}: {live}\n{log}"
            )
            # Done with: the next round's wizard is the deployment's only open one, as `wizards.start` keeps it.
            Wizard.objects.filter(pk=wizard.pk).update(state=Wizard.State.ABANDONED, finished_at=timezone.now())
    finally:
        print(f"\nkilled in: {seen}")
    reached_the_middle(seen)
    # Some kills came once the change had ended, when only the tick could still settle the step.
    assert set(seen) & ENDINGS, seen
