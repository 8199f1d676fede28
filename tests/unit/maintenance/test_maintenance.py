"""Maintenance schedules, windows, validation, exactly-once claiming and the pages/API."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.clusters.models import Cluster
from apps.core.redaction import placeholder
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.maintenance import dispatch, execution, recovery, run_log, schedules, timing, warmup_results
from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile
from integrations import serve_http
from integrations.serve_http import Sample
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory
from tests.fake_ray import FakeRay

UTC = UTC


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --- pure timing -----------------------------------------------------------------------------


def test_every_six_hours_inside_an_all_day_window():
    assert timing.next_slot(
        after=at(2026, 12, 1, 3), every_hours=6, cron="", days=[], start_hour=0, end_hour=24, tz="UTC"
    ) == at(2026, 12, 1, 9)


def test_a_slot_outside_the_window_moves_to_the_next_opening():
    # 02:00 + 6 h = 08:00, outside 22–04; the window next opens at 22:00.
    assert timing.next_slot(
        after=at(2026, 12, 1, 2), every_hours=6, cron="", days=[], start_hour=22, end_hour=4, tz="UTC"
    ) == at(2026, 12, 1, 22)


def test_windows_wrap_past_midnight_and_count_the_early_hours_for_the_previous_day():
    # Tuesday 01:00 belongs to Monday's 22–04 window.
    assert timing.in_window(at(2026, 12, 1, 1), [0], 22, 4, "UTC")
    assert not timing.in_window(at(2026, 12, 1, 23), [0], 22, 4, "UTC")


def test_windows_follow_the_time_zone():
    # 09:00 UTC is 10:00 in Paris in winter.
    assert timing.in_window(at(2026, 12, 1, 9), [], 10, 11, "Europe/Paris")
    assert not timing.in_window(at(2026, 12, 1, 9), [], 10, 11, "UTC")


def test_cron_slots_skip_to_one_inside_the_window():
    # Hourly cron, window Saturday only: from Tuesday the next slot is Saturday 00:00.
    assert timing.next_slot(
        after=at(2026, 12, 1, 3), every_hours=None, cron="0 * * * *", days=[5], start_hour=0, end_hour=24, tz="UTC"
    ) == at(2026, 12, 5, 0)


@pytest.mark.parametrize(
    "every, cron, message",
    [
        (None, "", "exactly one"),
        (6, "0 * * * *", "exactly one"),
        (0, "", "exactly one"),
        (1000, "", "between 1 and 720"),
        (None, "61 * * * *", "not a valid"),
    ],
)
def test_bad_timings_are_refused(every, cron, message):
    with pytest.raises(ValidationError, match=message):
        timing.validate_timing(every, cron)


@pytest.mark.parametrize(
    "days, start, end, tz, message",
    [
        ([7], 0, 24, "UTC", "0–6"),
        ([1, 1], 0, 24, "UTC", "twice"),
        ([], 5, 5, "UTC", "empty"),
        ([], 0, 24, "Mars/Olympus", "Unknown time zone"),
        ([], 25, 3, "UTC", "start 0–23"),
    ],
)
def test_bad_windows_are_refused(days, start, end, tz, message):
    with pytest.raises(ValidationError, match=message):
        timing.validate_window(days, start, end, tz)


def test_warmup_results_separate_the_first_request_from_the_steady_state():
    samples = [Sample(0, 200, 900.0)] + [Sample(i, 200, 10.0 + i) for i in range(1, 21)]
    result = warmup_results.summarize(samples, p95_threshold_ms=50)
    assert result["first_ms"] == 900.0 and result["steady_p50_ms"] == 20.5 and result["passed"]
    failing = warmup_results.summarize(
        [*samples[:5], Sample(5, 500, 12.0), Sample(6, None, 3000.0, "timeout")], p95_threshold_ms=50
    )
    assert (
        not failing["passed"] and "2 of 7 responses were not 2xx" in failing["verdict"] and "p95" in failing["verdict"]
    )


# --- with the database ---------------------------------------------------------------------


@pytest.fixture
def deployment(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    sync.sync_cluster(cluster.pk)
    return Deployment.objects.get(application__cluster=cluster, name="Model")


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"])


@pytest.mark.django_db
def test_a_schedule_shows_its_next_run(deployment, operator):
    schedule = schedules.save_schedule(operator, deployment, {"every_hours": 6, "cron": ""})
    assert (
        timezone.now() + timedelta(hours=5, minutes=59)
        < schedule.next_run_at
        <= timezone.now() + timedelta(hours=6, seconds=5)
    )


@pytest.mark.django_db
def test_a_timing_that_never_meets_its_window_is_refused(deployment, operator):
    with pytest.raises(ValidationError, match="never falls inside the maintenance window"):
        schedules.save_schedule(
            operator, deployment, {"cron": "0 */6 * * *", "window_start_hour": 1, "window_end_hour": 5}
        )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data, message",
    [
        ({"path": "/other"}, "under the application's route prefix"),
        ({"path": "/demox"}, "under the application's route prefix"),
        ({"concurrency": 0}, "Concurrency must be between 1 and 64"),
        ({"concurrency": 10_000}, "Concurrency must be between 1 and 64"),
        ({"method": "TRACE"}, "Method must be one of"),
        ({"requests": 0}, "Requests must be between"),
    ],
)
def test_bad_warmup_profiles_are_refused(deployment, operator, data, message):
    with pytest.raises(ValidationError, match=message):
        schedules.save_profile(operator, deployment.application, {"name": "w", "path": "/demo"} | data)


@pytest.mark.django_db
def test_a_warmup_path_may_carry_a_query_under_the_prefix(deployment, operator):
    assert schedules.save_profile(operator, deployment.application, {"name": "w", "path": "/demo/sub?x=1"}).pk


@pytest.mark.django_db(transaction=True)
def test_a_due_slot_is_claimed_exactly_once_by_concurrent_ticks(deployment, operator):
    schedule = schedules.save_schedule(operator, deployment, {"every_hours": 6, "cron": ""})
    RecycleSchedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now() - timedelta(hours=30))
    results, barrier = [], threading.Barrier(4)

    def tick():
        barrier.wait()
        try:
            results.append(dispatch.claim_due())
        finally:
            connection.close()

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(len(r) for r in results) == 1
    assert MaintenanceRun.objects.filter(schedule=schedule).count() == 1
    # 30 hours of downtime: one run, and the next slot is in the future.
    assert RecycleSchedule.objects.get(pk=schedule.pk).next_run_at > timezone.now()
    assert dispatch.claim_due() == []


@pytest.mark.django_db
def test_a_recycle_of_a_vanished_deployment_fails_with_the_reason(deployment, operator):
    run = dispatch.request_recycle(operator, deployment)
    Deployment.objects.filter(pk=deployment.pk).update(removed_at=timezone.now())
    execution.execute(run.pk)
    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.FAILED and "no longer exists" in run.log[-1]["message"]


@pytest.mark.django_db
def test_an_unreachable_cluster_skips_the_recycle(deployment, operator):
    Cluster.objects.filter(pk=deployment.application.cluster_id).update(
        reachability="unreachable", last_error="refused"
    )
    run = dispatch.request_recycle(operator, deployment)
    execution.execute(run.pk)
    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.SKIPPED and "not reachable" in run.log[-1]["message"]


@pytest.mark.django_db
def test_the_api_manages_schedules_and_answers_202_for_recycle_now(api_as, deployment):
    client = api_as("operator")
    created = client.post(
        "/api/v1/maintenance/schedules/",
        {"deployment": deployment.pk, "cron": "0 */6 * * *", "window_start_hour": 0, "window_end_hour": 5},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["next_run_at"]
    bad = client.post(
        "/api/v1/maintenance/schedules/", {"deployment": deployment.pk, "cron": "nonsense"}, format="json"
    )
    assert bad.status_code == 400 and "not a valid" in str(bad.json())
    recycle = client.post(
        "/api/v1/maintenance/runs/recycle/", {"deployment": deployment.pk, "override_reason": "rush"}, format="json"
    )
    assert recycle.status_code == 202 and recycle.json()["override_guards"] is True
    assert (
        api_as("viewer")
        .post("/api/v1/maintenance/runs/recycle/", {"deployment": deployment.pk}, format="json")
        .status_code
        == 403
    )
    profile = client.post(
        "/api/v1/maintenance/warmup-profiles/",
        {"application": deployment.application_id, "name": "w", "path": "/demo", "body": {"text": "hi"}},
        format="json",
    )
    assert profile.status_code == 201, profile.content
    assert client.post(f"/api/v1/maintenance/warmup-profiles/{profile.json()['id']}/run/").status_code == 202
    assert len(api_as("viewer").get("/api/v1/maintenance/runs/").json()["results"]) == 2


@pytest.fixture
def schedule_and_profile(deployment, operator):
    profile = schedules.save_profile(operator, deployment.application, {"name": "w", "path": "/demo"})
    schedule = schedules.save_schedule(operator, deployment, {"every_hours": 6, "cron": "", "warmup": profile})
    return [("schedules", "recycle_schedule.delete", schedule), ("warmup-profiles", "warmup_profile.delete", profile)]


@pytest.mark.django_db
def test_api_deletes_of_schedules_and_profiles_are_audited(api_as, people, deployment, schedule_and_profile):
    for path, action, item in schedule_and_profile:
        response = api_as("operator").delete(f"/api/v1/maintenance/{path}/{item.pk}/")
        assert response.status_code == 204, response.content
        event = AuditEvent.objects.get(action=action)
        assert (event.actor, event.team, event.via) == (people["operator"], deployment.application.cluster.team, "api")
        assert (event.object_type, event.object_id) == (item._meta.label_lower, str(item.pk))
    assert not RecycleSchedule.objects.exists() and not WarmupProfile.objects.exists()


@pytest.mark.django_db
def test_a_viewer_cannot_delete_schedules_or_profiles_and_nothing_is_audited(api_as, schedule_and_profile):
    for path, _, item in schedule_and_profile:
        assert api_as("viewer").delete(f"/api/v1/maintenance/{path}/{item.pk}/").status_code == 403
    assert RecycleSchedule.objects.exists() and WarmupProfile.objects.exists()
    assert not AuditEvent.objects.filter(action__endswith=".delete").exists()


@pytest.mark.django_db
def test_the_deployment_page_offers_scheduling_and_recycle_now(client, people, deployment):
    client.force_login(people["operator"])
    page = client.get(reverse("fleet:deployment", args=[deployment.pk])).content.decode()
    assert "Add a recycle schedule" in page and "Recycle now" in page
    response = client.post(
        reverse("maintenance:schedule", args=[deployment.pk]),
        {
            "enabled": "on",
            "every_hours": "6",
            "cron": "",
            "window_start_hour": "0",
            "window_end_hour": "24",
            "timezone": "UTC",
        },
    )
    assert response.status_code == 302
    assert "Next run" in client.get(reverse("fleet:deployment", args=[deployment.pk])).content.decode()
    run_page = client.post(reverse("maintenance:recycle", args=[deployment.pk]), follow=True).content.decode()
    assert "Recycle run #" in run_page and "Queued" in run_page


@pytest.mark.django_db
def test_the_warmup_page_explains_a_body_that_is_not_json(client, people, deployment):
    client.force_login(people["operator"])
    page = client.post(
        reverse("maintenance:warmups", args=[deployment.application_id]),
        {
            "name": "w",
            "method": "POST",
            "path": "/demo",
            "requests": "5",
            "concurrency": "1",
            "timeout_s": "5",
            "window_start_hour": "0",
            "window_end_hour": "24",
            "timezone": "UTC",
            "enabled": "on",
            "body_text": "{oops",
        },
    ).content.decode()
    assert "Not valid JSON" in page


@pytest.mark.django_db
def test_a_change_that_replaces_replicas_queues_the_applications_warmups(deployment, operator):
    profile = schedules.save_profile(operator, deployment.application, {"name": "w", "path": "/demo"})
    replaces = protocol.plan_change(
        operator,
        deployment.application.cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"ray_actor_options": {"num_cpus": 0.3}},
        reason="more cpu",
    )
    in_place = protocol.plan_change(
        operator,
        deployment.application.cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"max_queued_requests": 10},
        reason="queue",
    )

    protocol._finish(replaces, ChangeState.SUCCEEDED, "Verified.")
    protocol._finish(in_place, ChangeState.SUCCEEDED, "Verified.")

    runs = MaintenanceRun.objects.filter(profile=profile)
    assert [(r.trigger, r.change_id) for r in runs] == [(MaintenanceRun.Trigger.AFTER_CHANGE, replaces.pk)]


# --- the replayed dashboard as a worker meets it -------------------------------------------

SERVE = "/api/serve/applications/"


class WorkerDied(BaseException):
    """What a SIGKILL looks like from inside: nothing after it runs."""


def worker_dies_reading_replicas(replay) -> list[int]:
    """The next read of the Serve applications kills the worker that sends it: the run it was on
    stays running, as its claim left it. Returns the runs that died so; later reads answer again."""
    died = []
    answer = replay.routes[SERVE]

    def die(request):
        replay.routes[SERVE] = answer
        died.append(MaintenanceRun.objects.get(state=MaintenanceRun.State.RUNNING).pk)
        raise WorkerDied

    replay.routes[SERVE] = die
    return died


def replicas_read_slowly(replay, seconds: float, during) -> None:
    """Reads of the Serve applications take `seconds`, calling `during()` before and after: a call
    that blocks without logging or polling."""
    answer = replay.routes[SERVE]

    def slow(request):
        during()
        time.sleep(seconds)
        during()
        return httpx.Response(200, json=ray_fixture(answer))

    replay.routes[SERVE] = slow


class ServeThroughRecycles:
    """The replayed dashboard's Serve applications as Ray keeps them through a recycle: `demo/Model`
    runs two replicas; a PUT takes the config as the shared fake does (the options merged into the
    effective ones, a new deploy time), and a PUT that changes a deployment's ray_actor_options
    replaces its replicas with new ones, as Serve does."""

    def __init__(self, replay):
        self.fake = FakeRay()
        model = self.model()
        model["replicas"] = [{**model["replicas"][0], "replica_id": rid} for rid in ("r1", "r2")]
        self.started = 2
        replay.routes[SERVE] = self

    def model(self) -> dict:
        return self.fake.serve["applications"]["demo"]["deployments"]["Model"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method != "PUT":
            return httpx.Response(200, json=self.fake.serve)
        before = json.dumps(self.model()["deployment_config"].get("ray_actor_options"), sort_keys=True)
        self.fake.apply(json.loads(request.content))
        if json.dumps(self.model()["deployment_config"].get("ray_actor_options"), sort_keys=True) != before:
            replicas = self.model()["replicas"]
            self.model()["replicas"] = [
                {**replica, "replica_id": f"r{self.started + i + 1}"} for i, replica in enumerate(replicas)
            ]
            self.started += len(replicas)
        return httpx.Response(200, json={})


def queued_recycle(deployment) -> MaintenanceRun:
    """A queued recycle that was never sent to the broker, for tests whose worker runs in this
    process: a message left in the broker could be taken by a later test's worker."""
    return MaintenanceRun.objects.create(
        kind=MaintenanceRun.Kind.RECYCLE,
        trigger=MaintenanceRun.Trigger.MANUAL,
        cluster=deployment.application.cluster,
        deployment=deployment,
    )


@pytest.fixture
def quick_changes(settings):
    settings.FLEETDECK_RAY_TIMEOUT_S = 1.0
    settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S = 1.5
    settings.FLEETDECK_CHANGE_POLL_S = 0.1


# --- runs whose message was lost or sent twice -----------------------------------------------


@pytest.mark.django_db
def test_a_queued_run_nobody_took_up_is_sent_again_once(deployment, operator, settings):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    run = dispatch.request_recycle(operator, deployment)
    sent = run.enqueued_at
    assert recovery.requeue_lost(now=sent + timedelta(seconds=30)) == []
    later = sent + timedelta(seconds=61)
    assert recovery.requeue_lost(now=later) == [run.pk]
    # A second tick at the same moment finds it claimed.
    assert recovery.requeue_lost(now=later) == []
    run.refresh_from_db()
    assert run.enqueued_at == later and "sent to the workers again" in run.log[-1]["message"]
    execution.execute(run.pk)
    assert recovery.requeue_lost(now=later + timedelta(hours=1)) == []


@pytest.mark.django_db(transaction=True)
def test_a_run_delivered_twice_at_once_runs_once(deployment, operator, monkeypatch, use_replay):
    run = dispatch.request_recycle(operator, deployment)
    barrier = threading.Barrier(2)
    calls = worker_dies_reading_replicas(use_replay)
    real_first = MaintenanceRun.objects.filter

    def both_read_it_queued(*args, **kwargs):
        rows = real_first(*args, **kwargs)
        if "state" in kwargs and not barrier.broken:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=2)
        return rows

    monkeypatch.setattr(MaintenanceRun.objects, "filter", both_read_it_queued)

    def deliver():
        try:
            execution.execute(run.pk)
        except WorkerDied:
            pass
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [run.pk]
    assert MaintenanceRun.objects.get(pk=run.pk).state == MaintenanceRun.State.RUNNING


@pytest.mark.django_db
def test_a_broker_that_refuses_the_message_delays_a_recycle_and_fails_nothing(
    api_as, deployment, monkeypatch, django_capture_on_commit_callbacks
):
    from kombu.exceptions import OperationalError

    from controlplane.celery import app

    def refused(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", refused)
    with django_capture_on_commit_callbacks(execute=True):
        response = api_as("operator").post(
            "/api/v1/maintenance/runs/recycle/", {"deployment": deployment.pk}, format="json"
        )
    assert response.status_code == 202, response.content
    run = MaintenanceRun.objects.get(pk=response.json()["id"])
    assert run.state == MaintenanceRun.State.QUEUED
    # The tick finds it once the broker is back.
    assert recovery.requeue_lost(now=run.enqueued_at + timedelta(hours=1)) == [run.pk]


@pytest.mark.django_db
def test_the_run_page_says_when_no_worker_has_taken_the_run_up(client, people, deployment, operator, settings):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    run = dispatch.request_recycle(operator, deployment)
    client.force_login(people["viewer"])
    url = reverse("maintenance:run", args=[run.pk])
    assert "Waiting for a worker" not in client.get(url).content.decode()

    MaintenanceRun.objects.filter(pk=run.pk).update(enqueued_at=timezone.now() - timedelta(seconds=42))
    page = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "Waiting for a worker" in page and "42 s ago" in page and "sends it again after 60 s" in page

    MaintenanceRun.objects.filter(pk=run.pk).update(state=MaintenanceRun.State.RUNNING)
    assert "Waiting for a worker" not in client.get(url).content.decode()


# --- runs whose worker died ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_recycle_whose_worker_died_is_failed_once_with_how_far_it_got_and_frees_the_cluster(
    deployment, operator, settings, use_replay
):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    worker_dies_reading_replicas(use_replay)  # the worker dies mid-recycle
    run = dispatch.request_recycle(operator, deployment)
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    live, _ = execution.running_replicas(deployment.application.cluster, deployment)
    change = protocol.plan_change(
        operator,
        deployment.application.cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"ray_actor_options": {"num_cpus": 0.3}},
        reason="recycle",
    )
    protocol._finish(change, ChangeState.SUCCEEDED, "Verified.")
    MaintenanceRun.objects.filter(pk=run.pk).update(change=change, replicas_before=[*live, "replaced-1"])
    beat = MaintenanceRun.objects.get(pk=run.pk).heartbeat_at

    assert recovery.abandon_stale(now=beat + timedelta(seconds=30)) == []
    later = beat + timedelta(seconds=61)
    assert recovery.abandon_stale(now=later) == [run.pk]
    assert recovery.abandon_stale(now=later) == []  # a second tick at the same moment finds it failed
    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.FAILED and run.finished_at
    assert run.log[-1]["message"] == run.error
    assert run.error.startswith("The worker stopped during the run")
    assert f"1 of {len(live) + 1} replica(s) had been recycled (change #{change.pk} succeeded)" in run.error
    assert f"still running from before: {', '.join(live)}" in run.error
    assert AuditEvent.objects.filter(action="recycle.failed", object_id=str(run.pk)).count() == 1

    calls = worker_dies_reading_replicas(use_replay)
    following = dispatch.request_recycle(operator, deployment)
    with pytest.raises(WorkerDied):
        execution.execute(following.pk)
    following.refresh_from_db()
    assert calls == [following.pk] and following.state == MaintenanceRun.State.RUNNING and not following.skip_reason


@pytest.mark.django_db
def test_a_running_run_with_a_fresh_heartbeat_or_an_active_change_is_left_alone(
    deployment, operator, settings, use_replay
):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    worker_dies_reading_replicas(use_replay)
    run = dispatch.request_recycle(operator, deployment)
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    beat = MaintenanceRun.objects.get(pk=run.pk).heartbeat_at
    assert recovery.abandon_stale(now=beat + timedelta(seconds=59)) == []
    # Stale, but its change is still on its way: the change's reconciler finishes that first.
    change = protocol.plan_change(
        operator,
        deployment.application.cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"ray_actor_options": {"num_cpus": 0.3}},
        reason="recycle",
    )
    protocol.request_apply(operator, change)
    MaintenanceRun.objects.filter(pk=run.pk).update(change=change)
    assert recovery.abandon_stale(now=beat + timedelta(hours=1)) == []
    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.RUNNING and not run.error


@pytest.mark.django_db(transaction=True)
def test_a_recycle_touches_its_heartbeat_at_the_claim_each_log_line_and_each_poll_of_its_change(
    deployment, operator, use_replay
):
    change = protocol.plan_change(
        operator,
        deployment.application.cluster,
        targets=[{"application": "demo", "deployment": "Model"}],
        options={"ray_actor_options": {"num_cpus": 0.3}},
        reason="recycle",
    )
    run = queued_recycle(deployment)
    beats = []

    def beat():
        beats.append(MaintenanceRun.objects.get(pk=run.pk).heartbeat_at)

    worker_dies_reading_replicas(use_replay)
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    claimed = MaintenanceRun.objects.get(pk=run.pk)
    beat()
    run_log.log_line(claimed, "a step")
    beat()

    def replicas_come_back():
        # While the run waits between two polls of its change.
        try:
            time.sleep(0.2)
            beat()
            Change.objects.filter(pk=change.pk).update(state=ChangeState.SUCCEEDED)
        finally:
            connection.close()

    elsewhere = threading.Thread(target=replicas_come_back)
    elsewhere.start()
    execution._wait_final(claimed, change)
    elsewhere.join()
    assert beats[0] is not None and beats[0] < beats[1] < beats[2]


@pytest.mark.django_db(transaction=True)
def test_a_run_blocked_in_a_long_call_keeps_its_heartbeat(deployment, operator, monkeypatch, use_replay):
    # The inline change run and a warmup's requests neither log nor poll for minutes.
    monkeypatch.setattr(execution, "HEARTBEAT_S", 0.05)
    run = queued_recycle(deployment)
    beats = []
    replicas_read_slowly(use_replay, 0.5, lambda: beats.append(MaintenanceRun.objects.get(pk=run.pk).heartbeat_at))
    execution.execute(run.pk)
    assert beats[0] is not None and beats[1] > beats[0]


@pytest.mark.django_db
def test_the_warmup_after_a_recycle_runs_once_however_long_it_takes(
    deployment, operator, settings, monkeypatch, use_replay, quick_changes
):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    profile = schedules.save_profile(operator, deployment.application, {"name": "w", "path": "/demo"})
    schedule = RecycleSchedule.objects.create(
        deployment=deployment, every_hours=6, warmup=profile, created_by=operator.user
    )
    run = dispatch.request_recycle(operator, deployment)
    MaintenanceRun.objects.filter(pk=run.pk).update(schedule=schedule)
    ServeThroughRecycles(use_replay)
    seen = []

    def slow_requests(base_url, **request):
        # An hour later, as far as the tick can tell: a queued follow-up would look lost and be sent again.
        follow = MaintenanceRun.objects.get(after=run)
        seen.append((follow.state, recovery.requeue_lost(now=timezone.now() + timedelta(hours=1))))
        return [Sample(0, 200, 12.0)]

    # The warmup's requests go to Serve's HTTP route, which no replay stands in for: its adapter does.
    monkeypatch.setattr(serve_http, "send", slow_requests)
    execution.execute(run.pk)

    assert MaintenanceRun.objects.get(pk=run.pk).state == MaintenanceRun.State.SUCCEEDED
    assert seen == [(MaintenanceRun.State.RUNNING, [])]
    follow = MaintenanceRun.objects.get(after=run)
    assert follow.state == MaintenanceRun.State.SUCCEEDED and follow.started_at


@pytest.mark.django_db
def test_a_worker_that_wakes_after_the_reaper_failed_its_run_overwrites_nothing(
    deployment, operator, settings, use_replay
):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    worker_dies_reading_replicas(use_replay)
    run = dispatch.request_recycle(operator, deployment)
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    worker_copy = MaintenanceRun.objects.get(pk=run.pk)  # what the paused worker holds
    beat = worker_copy.heartbeat_at
    assert recovery.abandon_stale(now=beat + timedelta(seconds=61)) == [run.pk]

    run_log.log_line(worker_copy, "Change #1 bumps the generation.")
    assert run_log.end_run(worker_copy, MaintenanceRun.State.SUCCEEDED, "Recycled.") is False

    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.FAILED and run.log[-1]["message"].startswith("The worker stopped")
    assert not AuditEvent.objects.filter(action="recycle.succeeded").exists()


@pytest.mark.django_db
def test_a_recycle_that_raises_is_failed_with_its_error_not_left_running(deployment, operator, use_replay):
    serve, pushed = ServeThroughRecycles(use_replay), []

    def unreadable_after_the_push(request):
        # An answer nothing foresaw, past the guards and the reads a recycle expects to fail.
        if pushed:
            raise KeyError("replica_id")
        pushed.extend([request.method] if request.method == "PUT" else [])
        return serve(request)

    use_replay.routes[SERVE] = unreadable_after_the_push
    run = dispatch.request_recycle(operator, deployment)
    with pytest.raises(KeyError):
        execution.execute(run.pk)
    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.FAILED and "replica_id" in run.error and run.started_at


@pytest.mark.django_db
def test_a_run_claimed_before_heartbeats_existed_is_reaped_by_its_start(deployment, operator, settings, use_replay):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    worker_dies_reading_replicas(use_replay)
    run = dispatch.request_recycle(operator, deployment)
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    started = timezone.now() - timedelta(minutes=10)
    MaintenanceRun.objects.filter(pk=run.pk).update(heartbeat_at=None, started_at=started)
    assert recovery.abandon_stale() == [run.pk]


@pytest.mark.django_db
def test_a_worker_killed_as_it_applies_the_recycle_change_leaves_a_run_that_names_it(
    deployment, operator, settings, monkeypatch, use_replay
):
    settings.FLEETDECK_CHANGE_STALE_S = 60
    ServeThroughRecycles(use_replay)  # two replicas: no guard holds the recycle

    def dies(actor, change):
        raise WorkerDied

    monkeypatch.setattr(protocol, "request_apply", dies)
    run = dispatch.request_recycle(operator, deployment)
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    run.refresh_from_db()
    assert run.state == MaintenanceRun.State.RUNNING and run.change_id is not None
    assert recovery.abandon_stale(now=run.heartbeat_at + timedelta(seconds=61)) == [run.pk]
    assert f"change #{run.change_id}" in MaintenanceRun.objects.get(pk=run.pk).error


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_stops_once_a_run_outlives_the_longest_it_could_take(
    deployment, operator, monkeypatch, use_replay
):
    monkeypatch.setattr(execution, "HEARTBEAT_S", 0.05)
    # Kept private: the longest a recycle may take is at least 300 s by its formula, and no setting
    # brings it under a second without also breaking the change it waits for.
    monkeypatch.setattr(execution, "_longest_s", lambda run: 0.2)
    run = queued_recycle(deployment)
    beats = []

    def stuck(request):
        # Past the longest the run could take (0.2 s), and then later still: no beat in between.
        time.sleep(0.5)
        beats.append(MaintenanceRun.objects.get(pk=run.pk).heartbeat_at)
        time.sleep(0.4)
        beats.append(MaintenanceRun.objects.get(pk=run.pk).heartbeat_at)
        raise WorkerDied

    use_replay.routes[SERVE] = stuck
    with pytest.raises(WorkerDied):
        execution.execute(run.pk)
    assert beats[0] == beats[1]


@pytest.mark.django_db
def test_a_warmup_profile_read_back_with_redacted_headers_and_patched_keeps_its_key(api_as, deployment, operator):
    profile = schedules.save_profile(
        operator,
        deployment.application,
        {"name": "w", "path": "/demo", "headers": {"X-Api-Key": "k_live_1", "Content-Type": "application/json"}},
    )
    read = api_as("viewer").get(f"/api/v1/maintenance/warmup-profiles/{profile.pk}/").json()
    assert read["headers"] == {"X-Api-Key": placeholder("k_live_1"), "Content-Type": "application/json"}
    assert "k_live_1" not in json.dumps(list(AuditEvent.objects.values_list("changes", flat=True)))

    url = f"/api/v1/maintenance/warmup-profiles/{profile.pk}/"
    sent = {"path": "/demo", "headers": {**read["headers"], "X-Team": "v"}}
    patched = api_as("operator").patch(url, sent, format="json")
    assert patched.status_code == 200, patched.content
    profile.refresh_from_db()
    assert profile.headers == {"X-Api-Key": "k_live_1", "Content-Type": "application/json", "X-Team": "v"}
    guessed = api_as("operator").patch(
        url, {"path": "/demo", "headers": {"X-Api-Key": placeholder("guess")}}, format="json"
    )
    assert guessed.status_code == 400 and "headers.X-Api-Key holds a redacted placeholder" in guessed.content.decode()
