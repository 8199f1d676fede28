"""The worker's sync of a batch: the digest short-cut of an unchanged cluster, and reads that overlap."""

from __future__ import annotations

import asyncio
import copy
import time
from datetime import timedelta

import httpx
import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.clusters.models import Cluster, Reachability
from apps.core import jobs
from apps.fleet import llm, sync
from apps.fleet.models import Application, Deployment
from apps.incidents import ingest
from apps.incidents.models import Incident, ScrapeState
from apps.maintenance.models import RecycleSchedule
from apps.remediation import findings
from apps.remediation.models import Finding
from integrations.ray.async_dashboard import AsyncRayDashboard
from tests.conftest import ray_fixture
from workers import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(team, use_replay):
    return [Cluster.objects.create(name=f"c{i}", team=team, dashboard_url=f"http://c{i}.test:8265") for i in range(5)]


def synced(clusters) -> list[int]:
    ids = [cluster.pk for cluster in clusters]
    tasks.sync_batch(ids)
    return ids


def test_unchanged_clusters_cost_at_most_one_update_each_and_the_batch_three_queries(fleet):
    ids = synced(fleet)

    with CaptureQueriesContext(connection) as queries:
        tasks.sync_batch(ids)

    updates = [q["sql"] for q in queries if q["sql"].startswith("UPDATE")]
    # Stamped together when their answers arrive together; never more than one each.
    assert 1 <= len(updates) <= len(fleet) and all('"last_sync_at"' in sql for sql in updates)
    assert Cluster.objects.filter(pk__in=ids, last_sync_at__gte=timezone.now() - timedelta(seconds=30)).count() == 5
    # The batch's own: its clusters, quiet incidents, Kubernetes links.
    assert len(queries) == len(updates) + 3


def test_unchanged_clusters_whose_answers_wait_together_are_stamped_in_one_update(fleet, monkeypatch):
    ids = synced(fleet)
    observations = sync._observations

    def all_waiting(clusters):
        answers = list(observations(clusters))
        for index, (cluster, observed, duration_ms, _) in enumerate(answers):
            yield cluster, observed, duration_ms, index < len(answers) - 1

    monkeypatch.setattr(sync, "_observations", all_waiting)
    with CaptureQueriesContext(connection) as queries:
        outcomes = sync.sync_and_announce(ids)

    assert all(outcome.unchanged for outcome in outcomes) and len(outcomes) == len(fleet)
    assert len([q for q in queries if q["sql"].startswith("UPDATE")]) == 1


def test_a_row_changed_while_its_answer_waited_is_applied_in_full_and_the_rest_stamped(fleet, monkeypatch):
    ids = synced(fleet)
    observations = sync._observations

    def one_edited(clusters):
        answers = list(observations(clusters))
        Cluster.objects.filter(pk=fleet[3].pk).update(observed_digest="")  # e.g. its registration edited
        for index, (cluster, observed, duration_ms, _) in enumerate(answers):
            yield cluster, observed, duration_ms, index < len(answers) - 1

    monkeypatch.setattr(sync, "_observations", one_edited)
    outcomes = {outcome.cluster_id: outcome for outcome in sync.sync_and_announce(ids)}

    assert not outcomes[fleet[3].pk].unchanged and outcomes[fleet[3].pk].ok
    assert all(outcomes[cluster.pk].unchanged for cluster in fleet if cluster != fleet[3])


def test_the_tick_claims_any_number_of_clusters_in_two_queries(fleet):
    with CaptureQueriesContext(connection) as queries:
        assert len(sync.claim_due_clusters()) == len(fleet)
    assert len([q for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]) == 2


def test_a_changed_serve_status_is_applied(fleet, use_replay):
    ids = synced(fleet)
    use_replay.routes["/api/serve/applications/"] = "serve_applications_after_put_without_demo.json"

    outcomes = sync.sync_clusters(ids, then=lambda outcome: None)

    assert all(outcome.ok and not outcome.unchanged for outcome in outcomes)
    live = set(Application.objects.filter(cluster=fleet[0], removed_at__isnull=True).values_list("name", flat=True))
    assert live == set(ray_fixture("serve_applications_after_put_without_demo.json")["applications"])


def test_the_digest_is_stored_only_after_the_steps_that_act_on_a_sync(fleet, monkeypatch):
    ids = [fleet[0].pk, fleet[1].pk]

    def failing(outcome):
        if outcome.cluster_id == fleet[0].pk:
            raise RuntimeError("detection failed")

    outcomes = sync.sync_clusters(ids, then=failing)

    assert [outcome.cluster_id for outcome in outcomes] == [fleet[1].pk]  # the other one is not held up
    fleet[0].refresh_from_db()
    assert fleet[0].observed_digest == ""  # the next sync applies and detects again

    tasks.sync_batch(ids)
    fleet[0].refresh_from_db()
    assert fleet[0].observed_digest


def test_an_unchanged_sync_still_resolves_quiet_incidents(fleet):
    ids = synced(fleet)
    long_ago = timezone.now() - timedelta(days=1)
    incident = Incident.objects.create(
        kind=Incident.Kind.OOM_KILL,
        cluster=fleet[0],
        application_name="demo",
        deployment_name="Model",
        title="OOM",
        started_at=long_ago,
        last_signal_at=long_ago,
    )

    tasks.sync_batch(ids)

    incident.refresh_from_db()
    assert incident.status == Incident.Status.RESOLVED


def test_an_unchanged_sync_asks_for_a_metrics_reading_and_does_not_take_it(fleet, monkeypatch):
    Cluster.objects.filter(pk=fleet[0].pk).update(metrics_url="http://c0.test:8080/metrics")
    ids = synced(fleet)
    ScrapeState.objects.update(claimed_at=None)  # the reading the first sync asked for has run
    sent, read, recomputed = [], [], []
    monkeypatch.setattr(jobs, "enqueue", lambda job, *args, **options: sent.append((job, *args)) or True)
    monkeypatch.setattr(ingest, "collect_metrics", lambda cluster_id: read.append(cluster_id) or [])
    monkeypatch.setattr(findings, "recompute", lambda cluster_id: recomputed.append(cluster_id) or {})

    tasks.sync_batch(ids)

    # The reading is a job of its own (a slow endpoint must not hold the batch); the findings
    # its windows feed are recomputed when it is taken.
    assert sent == [(jobs.COLLECT_METRICS, fleet[0].pk)] and read == [] and recomputed == []
    tasks.collect_metrics(fleet[0].pk)
    assert read == [fleet[0].pk] and recomputed == [fleet[0].pk]


def test_a_new_recycle_schedule_makes_the_next_sync_recompute_findings(fleet, monkeypatch):
    ids = synced(fleet)
    recomputed = []
    monkeypatch.setattr(findings, "recompute", lambda cluster_id: recomputed.append(cluster_id) or {})

    RecycleSchedule.objects.create(deployment=Deployment.objects.filter(application__cluster=fleet[1]).first())
    tasks.sync_batch(ids)

    assert recomputed == [fleet[1].pk]


def test_a_cluster_that_recovers_is_applied_in_full(fleet):
    ids = synced(fleet)
    Cluster.objects.filter(pk=fleet[0].pk).update(reachability=Reachability.UNREACHABLE)

    outcomes = {outcome.cluster_id: outcome for outcome in sync.sync_clusters(ids)}

    assert not outcomes[fleet[0].pk].unchanged and "recovered" in outcomes[fleet[0].pk].events
    assert all(outcomes[cluster.pk].unchanged for cluster in fleet[1:])


def test_a_hung_dashboard_delays_no_other_and_each_error_is_recorded(team, replay_ray, monkeypatch):
    clusters = {
        name: Cluster.objects.create(name=name, team=team, dashboard_url=f"http://{name}.test:8265")
        for name in ("good", "hung", "refusing", "failing")
    }

    async def route(request):
        host = request.url.host
        if host == "hung.test":
            await asyncio.sleep(1.0)
            raise httpx.ReadTimeout("timed out")
        if host == "refusing.test":
            raise httpx.ConnectError("[Errno 111] Connection refused")
        if host == "failing.test":
            return httpx.Response(500, text="Traceback (most recent call last): boom")
        return replay_ray(request)

    monkeypatch.setattr(
        sync,
        "async_dashboard_for",
        lambda c: AsyncRayDashboard(c.dashboard_url, transport=httpx.MockTransport(route)),
    )
    applied = {}
    apply = sync.apply_observation

    def timed(cluster_id, *args, **kwargs):
        applied[cluster_id] = time.monotonic()
        return apply(cluster_id, *args, **kwargs)

    monkeypatch.setattr(sync, "apply_observation", timed)
    started = time.monotonic()
    outcomes = {outcome.cluster_id: outcome for outcome in sync.sync_clusters([c.pk for c in clusters.values()])}

    assert applied[clusters["good"].pk] - started < 0.8  # not after the hung one's timeout
    assert time.monotonic() - started >= 1.0
    assert outcomes[clusters["good"].pk].ok
    errors = {name: outcomes[cluster.pk].error for name, cluster in clusters.items() if name != "good"}
    assert errors["hung"] == "Ray dashboard did not answer /api/version in time (ReadTimeout)."
    assert errors["refusing"] == "Cannot reach the Ray dashboard: [Errno 111] Connection refused."
    assert errors["failing"].startswith("The Ray dashboard failed on /api/version with HTTP 500")
    states = dict(Cluster.objects.values_list("name", "reachability"))
    assert states == {
        "good": Reachability.OK,
        "hung": Reachability.UNREACHABLE,
        "refusing": Reachability.UNREACHABLE,
        "failing": Reachability.ERROR,
    }


def test_a_waiting_replica_keeps_every_sync_applying_in_full_until_its_finding_opens(team, use_replay, settings):
    waiting = copy.deepcopy(ray_fixture("serve_applications_autoscaling_waiting.json"))
    waiting["applications"]["huge"]["deployments"]["Echo"]["replicas"][0]["start_time_s"] = time.time() - 30
    use_replay.routes["/api/serve/applications/"] = waiting
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    cluster = Cluster.objects.create(name="scaled", team=team, dashboard_url="http://scaled.test:8265")
    settings.FLEETDECK_WAITING_REPLICA_S = 60

    first = sync.sync_and_announce([cluster.pk])[0]
    assert not first.unchanged and first.waiting
    assert not Finding.objects.filter(cluster=cluster, rule="replicas-unschedulable").exists()

    # The dashboard answers the same bytes; only the clock says the replica has now waited too long.
    settings.FLEETDECK_WAITING_REPLICA_S = 10
    reads_before = status_reads(use_replay)
    second = sync.sync_and_announce([cluster.pk])[0]

    assert not second.unchanged  # no digest was stored while it waited
    assert status_reads(use_replay) == reads_before + 1  # the nodes are read again while it waits
    assert Finding.objects.filter(cluster=cluster, rule="replicas-unschedulable", resolved_at__isnull=True).exists()


def test_an_old_reading_of_the_nodes_is_read_again_and_only_moves_its_time_when_it_says_the_same(fleet, use_replay):
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    ids = synced(fleet)
    long_ago = timezone.now() - timedelta(hours=1)
    Cluster.objects.filter(pk__in=ids).update(node_resources_at=long_ago)
    reads_before = status_reads(use_replay)

    outcomes = sync.sync_and_announce(ids)

    assert status_reads(use_replay) == reads_before + len(fleet)
    assert all(outcome.unchanged for outcome in outcomes)
    assert not Cluster.objects.filter(pk__in=ids, node_resources_at__lte=long_ago).exists()


def test_a_reading_of_the_nodes_that_differs_applies_the_sync_in_full(fleet, use_replay):
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    ids = synced(fleet)
    Cluster.objects.filter(pk=fleet[0].pk).update(node_resources_at=timezone.now() - timedelta(hours=1))
    use_replay.routes["/api/cluster_status"] = "cluster_status_after_oom.json"

    outcomes = {outcome.cluster_id: outcome for outcome in sync.sync_and_announce(ids)}

    assert not outcomes[fleet[0].pk].unchanged
    assert all(outcomes[cluster.pk].unchanged for cluster in fleet[1:])
    fleet[0].refresh_from_db()
    assert fleet[0].node_resources == sync._node_resources(fleet[0], outcomes[fleet[0].pk].observation)


def test_an_operator_s_llm_inputs_make_the_next_sync_recompute_findings(fleet, monkeypatch):
    ids = synced(fleet)
    recomputed = []
    monkeypatch.setattr(findings, "recompute", lambda cluster_id: recomputed.append(cluster_id) or {})

    deployment = Deployment.objects.filter(application__cluster=fleet[2]).first()
    llm.set_plan_inputs(Actor.system(via="test"), deployment, gpu_memory_gib=80.0, model_config=None)
    tasks.sync_batch(ids)

    assert recomputed == [fleet[2].pk]


def status_reads(replay) -> int:
    return sum(1 for request in replay.requests if request.url.path == "/api/cluster_status")


def reads_of(replay, path: str) -> int:
    return sum(1 for request in replay.requests if request.url.path == path)


def test_an_unchanged_sync_does_not_ask_for_the_version(fleet, use_replay):
    ids = synced(fleet)
    versions, statuses = reads_of(use_replay, "/api/version"), reads_of(use_replay, "/api/serve/applications/")

    outcomes = sync.sync_and_announce(ids)

    assert all(outcome.unchanged for outcome in outcomes)
    assert reads_of(use_replay, "/api/version") == versions
    assert reads_of(use_replay, "/api/serve/applications/") == statuses + len(fleet)


def test_a_restart_shows_in_the_serve_status_so_the_skipped_version_misses_no_session(fleet, use_replay):
    ids = synced(fleet)
    restarted = copy.deepcopy(ray_fixture("serve_applications_two_apps.json"))
    # A new session starts a new controller: Ray gives its actor and worker new ids.
    restarted["controller_info"].update(actor_id="f" * 32, worker_id="e" * 56)
    version = {**ray_fixture("version.json"), "session_name": "session_2026_12_03_08_00_00_000000_1"}
    use_replay.routes["/api/serve/applications/"] = restarted
    use_replay.routes["/api/version"] = version

    outcomes = sync.sync_and_announce(ids)

    assert all("session_changed" in outcome.events for outcome in outcomes)
    assert set(Cluster.objects.filter(pk__in=ids).values_list("session_name", flat=True)) == {version["session_name"]}


def test_a_cluster_without_serve_stores_no_digest_and_reads_its_version_at_every_sync(fleet, use_replay):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_no_serve.json"
    ids = synced(fleet)
    versions = reads_of(use_replay, "/api/version")

    outcomes = sync.sync_and_announce(ids)

    # Nothing in an empty Serve status tells one session from the next: only the version does.
    assert not any(outcome.unchanged for outcome in outcomes)
    assert reads_of(use_replay, "/api/version") == versions + len(fleet)
    assert set(Cluster.objects.filter(pk__in=ids).values_list("observed_digest", flat=True)) == {""}


def test_a_digest_cleared_while_the_dashboards_were_read_still_applies_in_full_with_the_version(
    fleet, use_replay, monkeypatch
):
    ids = synced(fleet)
    versions = reads_of(use_replay, "/api/version")
    observations = sync._observations

    def cleared_meanwhile(clusters):
        for cluster, observed, duration_ms, more in observations(clusters):
            Cluster.objects.filter(pk=cluster.pk).update(observed_digest="")  # e.g. a new recycle schedule
            yield cluster, observed, duration_ms, more

    monkeypatch.setattr(sync, "_observations", cleared_meanwhile)
    outcomes = sync.sync_and_announce(ids)

    assert all(outcome.ok and not outcome.unchanged for outcome in outcomes)
    assert reads_of(use_replay, "/api/version") == versions + len(fleet)  # asked after all
    # The edit made meanwhile still counts: the next sync applies in full again.
    assert set(Cluster.objects.filter(pk__in=ids).values_list("observed_digest", flat=True)) == {""}


def test_a_failed_stamp_is_logged_and_the_batch_goes_on(fleet, monkeypatch, caplog):
    ids = synced(fleet)

    def broken(unchanged):
        raise DatabaseError("server closed the connection unexpectedly")

    monkeypatch.setattr(sync, "_stamp_unchanged", broken)
    outcomes = sync.sync_and_announce(ids)

    assert outcomes == []  # none was stamped, so none is reported synced; the next cycle reads them again
    assert "stamping" in caplog.text and "server closed the connection" in caplog.text
