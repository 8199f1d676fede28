"""Inventory sync against payloads replayed from a real Ray 2.60 cluster."""

from __future__ import annotations

import contextlib
import threading

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.clusters.models import ClusterEvent, Reachability
from apps.fleet import sync
from apps.fleet.models import Application, ConfigRevision, Deployment
from integrations.ray.async_dashboard import AsyncRayDashboard
from integrations.ray.parsing import parse_serve_status
from integrations.ray.payloads import VersionInfo
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(team):
    return ClusterFactory(name="vision-prod", team=team, session_name=ray_fixture("version.json")["session_name"])


def writes(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].split()[0].upper() in {"INSERT", "UPDATE", "DELETE"}]


def test_a_first_sync_creates_applications_deployments_and_one_revision_each(use_replay, cluster):
    outcome = sync.sync_cluster(cluster.pk)

    assert outcome.ok
    apps = {app.name: app for app in Application.objects.filter(cluster=cluster)}
    assert set(apps) == {"demo", "echo2"}
    assert apps["demo"].status == "RUNNING" and apps["demo"].route_prefix == "/demo"
    assert apps["demo"].import_path == "demo_app:app"
    model = Deployment.objects.get(application=apps["demo"], name="Model")
    assert model.status == "HEALTHY"
    assert model.max_ongoing_requests == 8
    assert model.max_queued_requests == 100
    assert (model.autoscaling_min_replicas, model.autoscaling_max_replicas) == (1, 2)
    assert model.autoscaling_target_ongoing_requests == 4.0
    assert model.num_cpus == 0.2 and model.num_gpus is None
    assert model.replica_states == {"RUNNING": 1} and model.running_replicas == 1
    assert model.submitted_config["user_config"] == {"alloc_mb": 0, "hold_s": 0.05}
    assert model.effective_config["graceful_shutdown_timeout_s"] == 20.0
    assert ConfigRevision.objects.filter(cluster=cluster).count() == 2
    cluster.refresh_from_db()
    assert cluster.reachability == Reachability.OK
    assert cluster.serve_running and cluster.serve_http_port == 8000
    assert cluster.last_sync_at is not None
    assert (cluster.application_count, cluster.deployment_count) == (2, Deployment.objects.count())


def test_an_unchanged_cluster_costs_no_inventory_writes(use_replay, cluster):
    sync.sync_cluster(cluster.pk)

    with CaptureQueriesContext(connection) as queries:
        outcome = sync.sync_cluster(cluster.pk)

    assert outcome.writes == 0 and outcome.revisions == 0
    statements = writes(queries.captured_queries)
    # Only the cluster's own sync timestamps are written.
    assert len(statements) == 1, statements
    assert statements[0].startswith('UPDATE "clusters_cluster"')
    assert "last_sync_at" in statements[0]


def test_a_sync_reads_the_inventory_in_a_constant_number_of_queries(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    with CaptureQueriesContext(connection) as queries:
        sync.sync_cluster(cluster.pk)
    assert len(queries.captured_queries) <= 8


def test_a_changed_config_records_a_new_revision_and_updates_key_settings(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["deployments"]["Model"]["deployment_config"]["max_ongoing_requests"] = 2
    use_replay.routes["/api/serve/applications/"] = payload

    outcome = sync.sync_cluster(cluster.pk)

    assert outcome.revisions == 1
    demo = Application.objects.get(cluster=cluster, name="demo")
    assert demo.revisions.count() == 2
    assert Deployment.objects.get(application=demo, name="Model").max_ongoing_requests == 2
    assert Application.objects.get(cluster=cluster, name="echo2").revisions.count() == 1


def test_an_application_that_disappears_is_marked_removed_and_keeps_its_history(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/serve/applications/"] = "serve_applications_after_put_without_demo.json"

    sync.sync_cluster(cluster.pk)

    demo = Application.objects.get(cluster=cluster, name="demo")
    assert demo.removed_at is not None and demo.status == "REMOVED"
    assert demo.revisions.count() == 1
    cluster.refresh_from_db()
    live = Deployment.objects.filter(application__cluster=cluster, removed_at__isnull=True)
    assert (cluster.application_count, cluster.deployment_count) == (1, live.count()) and live.exists()
    assert all(dep.removed_at is not None for dep in demo.deployments.all())
    assert Application.objects.get(cluster=cluster, name="echo2").removed_at is None


def test_an_application_that_comes_back_is_no_longer_removed(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/serve/applications/"] = "serve_applications_after_put_without_demo.json"
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/serve/applications/"] = "serve_applications_two_apps.json"

    sync.sync_cluster(cluster.pk)

    demo = Application.objects.get(cluster=cluster, name="demo")
    assert demo.removed_at is None and demo.status == "RUNNING"
    assert demo.deployments.filter(removed_at__isnull=True).count() == 2


def test_a_failed_deploy_is_shown_but_records_no_revision(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_deploy_failed_bad_import.json"

    sync.sync_cluster(cluster.pk)

    failed = [app for app in Application.objects.filter(cluster=cluster) if app.status == "DEPLOY_FAILED"]
    assert failed, "the fixture holds a DEPLOY_FAILED application"
    assert "Traceback" in failed[0].message or failed[0].message
    assert not ConfigRevision.objects.filter(application=failed[0]).exists()


def test_a_rebuild_listing_no_deployments_does_not_remove_them(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    payload = ray_fixture("serve_applications_two_apps.json")
    payload["applications"]["demo"]["status"] = "DEPLOYING"
    payload["applications"]["demo"]["deployments"] = {}
    use_replay.routes["/api/serve/applications/"] = payload

    sync.sync_cluster(cluster.pk)

    demo = Application.objects.get(cluster=cluster, name="demo")
    assert demo.status == "DEPLOYING"
    assert demo.deployments.filter(removed_at__isnull=True).count() == 2
    assert demo.revisions.count() == 1


def test_a_serve_controller_restart_in_the_same_session_is_noticed(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/serve/applications/"] = "serve_applications_oom_t1_modelonly_first_non_running.json"

    outcome = sync.sync_cluster(cluster.pk)

    assert ClusterEvent.Kind.CONTROLLER_RESTARTED in outcome.events
    assert cluster.events.filter(kind=ClusterEvent.Kind.CONTROLLER_RESTARTED).count() == 1
    sync.sync_cluster(cluster.pk)
    assert cluster.events.filter(kind=ClusterEvent.Kind.CONTROLLER_RESTARTED).count() == 1


def test_a_new_session_is_recorded_as_a_cluster_restart(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    version = ray_fixture("version.json") | {"session_name": "session_2026-12-01_00-00-00_000000_1"}
    use_replay.routes["/api/version"] = version

    outcome = sync.sync_cluster(cluster.pk)

    assert outcome.events == [ClusterEvent.Kind.SESSION_CHANGED]
    cluster.refresh_from_db()
    assert cluster.session_name == version["session_name"]


def test_serve_shutting_down_is_an_event_and_empties_nothing_but_status(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/serve/applications/"] = "serve_applications_no_serve.json"

    outcome = sync.sync_cluster(cluster.pk)

    assert ClusterEvent.Kind.SERVE_STOPPED in outcome.events
    cluster.refresh_from_db()
    assert cluster.serve_running is False
    assert Application.objects.filter(cluster=cluster, removed_at__isnull=True).count() == 0
    assert ConfigRevision.objects.filter(cluster=cluster).count() == 2


def test_an_unreachable_cluster_keeps_its_inventory_and_says_why(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/version"] = httpx.ConnectError("connection refused")

    outcome = sync.sync_cluster(cluster.pk)

    assert not outcome.ok
    cluster.refresh_from_db()
    assert cluster.reachability == Reachability.UNREACHABLE
    assert "Cannot reach the Ray dashboard" in cluster.last_error
    assert Application.objects.filter(cluster=cluster, removed_at__isnull=True).count() == 2
    assert cluster.events.filter(kind=ClusterEvent.Kind.UNREACHABLE).count() == 1


def test_a_cluster_that_answers_again_records_a_recovery(use_replay, cluster):
    sync.sync_cluster(cluster.pk)
    use_replay.routes["/api/version"] = httpx.Response(500, text="Traceback (most recent call last): boom")
    sync.sync_cluster(cluster.pk)
    cluster.refresh_from_db()
    assert cluster.reachability == Reachability.ERROR
    use_replay.routes["/api/version"] = "version.json"

    outcome = sync.sync_cluster(cluster.pk)

    assert ClusterEvent.Kind.RECOVERED in outcome.events
    cluster.refresh_from_db()
    assert cluster.reachability == Reachability.OK and cluster.last_error == ""


def test_a_deleted_cluster_is_skipped_quietly(db):
    assert sync.sync_cluster(987654) is None


def test_due_clusters_are_claimed_once(team):
    for name in ("a", "b"):
        ClusterFactory(name=name, team=team, dashboard_url=f"http://{name}.test:8265")

    first = sync.claim_due_clusters()
    second = sync.claim_due_clusters()

    assert len(first) == 2
    assert second == []


def test_one_broken_cluster_does_not_stop_the_others(monkeypatch, team, replay_ray):
    good = ClusterFactory(name="good", team=team, dashboard_url="http://good.test:8265")
    bad = ClusterFactory(name="bad", team=team, dashboard_url="http://bad.test:8265")

    def route(request):
        if request.url.host == "bad.test":
            return httpx.Response(502, text="<html>Bad Gateway</html>")
        return replay_ray(request)

    monkeypatch.setattr(
        sync, "async_dashboard_for", lambda c: AsyncRayDashboard(c.dashboard_url, transport=httpx.MockTransport(route))
    )
    outcomes = {cid: sync.sync_cluster(cid) for cid in sync.claim_due_clusters()}

    assert outcomes[bad.pk].ok is False and outcomes[good.pk].ok is True
    assert Application.objects.filter(cluster=good).count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_syncs_that_write_at_the_same_time_wait_for_each_other(monkeypatch, team):
    # Both read their cluster row, then both write: on SQLite a deferred transaction failed at once
    # with "database is locked" here, so a worker pool of two lost syncs.
    clusters = [
        ClusterFactory(name=f"twin-{i}", team=team, dashboard_url=f"http://twin-{i}.test:8265") for i in range(2)
    ]
    both_read = threading.Barrier(2)
    upsert = sync._upsert_applications

    def after_the_read(*args):
        # The other sync waits for our transaction to end: nothing to meet.
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait(timeout=1)
        return upsert(*args)

    # Kept private: the race is between the row's read and the write inside one transaction, and
    # apply_observation takes parsed payloads, so no transport stands between the two.
    monkeypatch.setattr(sync, "_upsert_applications", after_the_read)
    version = VersionInfo("2.60.0", "abc", "session_1")
    serve = parse_serve_status(ray_fixture("serve_applications_two_apps.json"))
    errors = []

    def run(cluster_id):
        try:
            sync.apply_observation(cluster_id, version, serve, duration_ms=1)
        except Exception as exc:  # the assertion below shows it
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(cluster.pk,)) for cluster in clusters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert Application.objects.filter(cluster__in=clusters).count() == 4
