"""The autoscaler in view: Serve's autoscaling_detail and replicas waiting to be placed, replayed
from payloads captured on a real Ray 2.60 head (tests/fixtures/ray/README.txt), stored by the
sync, charted and served by the API."""

from __future__ import annotations

import copy
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from ray.serve.schema import DeploymentAutoscalingDetail

from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment, ScalingSample
from integrations.ray.parsing import parse_serve_status
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db

WAITING = "serve_applications_autoscaling_waiting.json"
UPSCALED = "serve_applications_autoscaling_upscaled.json"


@pytest.fixture
def cluster(team):
    return ClusterFactory(name="scaled", team=team)


def waiting_now(name: str = WAITING, *, waited_s: float = 120.0) -> dict:
    """The captured payload with the waiting replica started `waited_s` ago by our clock."""
    body = copy.deepcopy(ray_fixture(name))
    body["applications"]["huge"]["deployments"]["Echo"]["replicas"][0]["start_time_s"] = time.time() - waited_s
    return body


def status_reads(replay) -> int:
    return sum(1 for r in replay.requests if r.url.path == "/api/cluster_status")


def test_the_captured_payload_parses_required_resources_and_no_autoscaling_detail():
    serve = parse_serve_status(ray_fixture(WAITING))
    huge = serve.applications["huge"].deployments["Echo"]
    model = serve.applications["scaled"].deployments["Model"]
    assert huge.required_resources == {"CPU": 4.0}
    assert [r.state for r in huge.replicas] == ["STARTING"]
    assert model.required_resources == {"CPU": 0.2}
    # The 2.60.0 controller never fills it, and the dashboard leaves the key out.
    assert model.autoscaling_detail is None


def test_an_autoscaling_detail_in_serve_s_own_schema_is_parsed_whole():
    detail = DeploymentAutoscalingDetail.model_validate(
        {
            "scaling_status": "UPSCALING",
            "decisions": [
                {
                    "timestamp_s": 1796165200.5,
                    "reason": "queue 6 > target 1",
                    "prev_num_replicas": 1,
                    "curr_num_replicas": 4,
                }
            ],
            "metrics_health": "delayed",
            "errors": ["handle metrics 12 s old"],
        }
    ).model_dump(mode="json")
    body = ray_fixture(UPSCALED)
    body["applications"]["scaled"]["deployments"]["Model"]["autoscaling_detail"] = detail
    parsed = parse_serve_status(body).applications["scaled"].deployments["Model"].autoscaling_detail
    assert parsed.scaling_status == "UPSCALING" and parsed.metrics_health == "delayed"
    assert parsed.errors == ["handle metrics 12 s old"]
    assert [(d.prev_num_replicas, d.curr_num_replicas, d.reason) for d in parsed.decisions] == [
        (1, 4, "queue 6 > target 1")
    ]


def test_a_sync_stores_waiting_replicas_and_reads_the_nodes_resources(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = waiting_now()
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    assert sync.sync_cluster(cluster.pk).ok

    huge = Deployment.objects.get(application__cluster=cluster, application__name="huge")
    assert (huge.waiting_replicas, huge.running_replicas, huge.target_replicas) == (1, 0, 1)
    assert huge.required_resources == {"CPU": 4.0}
    assert time.time() - huge.waiting_since_s == pytest.approx(120, abs=30)
    cluster.refresh_from_db()
    assert cluster.node_resources["192.0.2.2"]["CPU"] == [pytest.approx(0.3), 2.0]
    assert cluster.node_resources_at is not None
    assert ScalingSample.objects.filter(deployment=huge).values_list("target", "running", "waiting").get() == (1, 0, 1)


def test_a_fresh_reading_with_nothing_waiting_is_not_read_again(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = ray_fixture(UPSCALED)
    del use_replay.routes["/api/serve/applications/"]["applications"]["huge"]
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    sync.sync_cluster(cluster.pk)
    sync.sync_cluster(cluster.pk)
    assert status_reads(use_replay) == 1
    Cluster.objects.filter(pk=cluster.pk).update(node_resources_at=timezone.now() - timedelta(minutes=6))
    sync.sync_cluster(cluster.pk)
    assert status_reads(use_replay) == 2


def test_a_waiting_replica_reads_the_nodes_at_every_sync(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = waiting_now()
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    sync.sync_cluster(cluster.pk)
    sync.sync_cluster(cluster.pk)
    assert status_reads(use_replay) == 2


def test_an_unreadable_cluster_status_leaves_the_sync_ok_and_is_not_asked_at_every_sync(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = "serve_applications_two_apps.json"
    assert sync.sync_cluster(cluster.pk).ok  # /api/cluster_status answers 404 here
    assert sync.sync_cluster(cluster.pk).ok
    assert status_reads(use_replay) == 1
    cluster.refresh_from_db()
    assert cluster.node_resources == {} and cluster.node_resources_at is not None


def test_an_unchanged_sync_adds_no_sample_and_a_new_target_adds_one_with_its_move(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = waiting_now()
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    sync.sync_cluster(cluster.pk)
    sync.sync_cluster(cluster.pk)
    model = Deployment.objects.get(application__cluster=cluster, application__name="scaled", name="Model")
    assert ScalingSample.objects.filter(deployment=model).count() == 1

    use_replay.routes["/api/serve/applications/"] = waiting_now(UPSCALED)
    sync.sync_cluster(cluster.pk)
    latest = ScalingSample.objects.filter(deployment=model).latest("observed_at")
    assert (latest.target, latest.running) == (4, 4)
    assert latest.decision == {"from": 1, "to": 4, "reason": "", "at_s": None, "source": "sync"}


def test_the_tick_deletes_samples_past_the_retention_and_keeps_the_rest(use_replay, cluster, settings):
    from apps.core import ticks
    from apps.fleet import scaling_history

    settings.FLEETDECK_SCALING_HISTORY_DAYS = 7
    use_replay.routes["/api/serve/applications/"] = waiting_now()
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    sync.sync_cluster(cluster.pk)
    model = Deployment.objects.get(application__cluster=cluster, application__name="scaled", name="Model")
    now = timezone.now()
    ScalingSample.objects.create(deployment=model, observed_at=now - timedelta(days=8), target=1, running=1)
    ScalingSample.objects.create(deployment=model, observed_at=now - timedelta(days=6), target=2, running=2)
    assert scaling_history.prune in ticks.handlers()

    scaling_history.prune()

    kept = ScalingSample.objects.filter(deployment=model)
    assert kept.count() == 2 and not kept.filter(observed_at__lt=now - timedelta(days=7)).exists()


def test_serve_s_own_decision_explains_a_new_target(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = waiting_now()
    sync.sync_cluster(cluster.pk)
    body = waiting_now(UPSCALED)
    body["applications"]["scaled"]["deployments"]["Model"]["autoscaling_detail"] = {
        "scaling_status": "UPSCALING",
        "decisions": [
            {"timestamp_s": 1796165200.0, "reason": "queue 6", "prev_num_replicas": 1, "curr_num_replicas": 4}
        ],
        "metrics_health": "healthy",
        "errors": [],
    }
    use_replay.routes["/api/serve/applications/"] = body
    sync.sync_cluster(cluster.pk)
    model = Deployment.objects.get(application__cluster=cluster, application__name="scaled", name="Model")
    assert model.autoscaling_detail["scaling_status"] == "UPSCALING"
    latest = ScalingSample.objects.filter(deployment=model).latest("observed_at")
    assert latest.decision["reason"] == "queue 6" and latest.decision["source"] == "serve"


@pytest.fixture
def scaled(use_replay, cluster):
    use_replay.routes["/api/serve/applications/"] = waiting_now()
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    sync.sync_and_announce([cluster.pk])
    use_replay.routes["/api/serve/applications/"] = waiting_now(UPSCALED)
    sync.sync_and_announce([cluster.pk])
    return cluster


def test_the_api_serves_the_fields_the_series_and_why_not_at_target(scaled, api_as):
    huge = Deployment.objects.get(application__cluster=scaled, application__name="huge")
    client = api_as("viewer")
    row = client.get(f"/api/v1/deployments/{huge.pk}/").json()
    assert row["required_resources"] == {"CPU": 4.0} and row["waiting_replicas"] == 1
    assert row["autoscaling_detail"] is None and row["waiting_since_s"] > 0

    body = client.get(f"/api/v1/deployments/{huge.pk}/scaling/").json()
    assert body["series"]["target"][0][1] == 1 and body["series"]["running"][0][1] == 0
    [why] = body["why_not_at_target"]
    assert why["rule"] == "replicas-unschedulable"
    assert why["evidence"]["missing"] == {"CPU": pytest.approx(2.3)}
    assert "4 CPU" in why["message"] and "2.3 CPU short" in why["message"]

    model = Deployment.objects.get(application__cluster=scaled, application__name="scaled", name="Model")
    series = client.get(f"/api/v1/deployments/{model.pk}/scaling/").json()["series"]
    assert [p[1] for p in series["target"]] == [1, 4]
    assert [(d["from"], d["to"]) for d in series["decisions"]] == [(1, 4)]


def test_another_team_s_deployment_has_no_scaling(scaled, api_as, other_team, django_user_model):
    from apps.accounts.models import Membership, Role

    stranger = django_user_model.objects.create_user(username="stranger")
    Membership.objects.create(user=stranger, team=other_team, role=Role.VIEWER)
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(stranger)
    huge = Deployment.objects.get(application__cluster=scaled, application__name="huge")
    assert client.get(f"/api/v1/deployments/{huge.pk}/scaling/").status_code == 404


def test_the_deployment_page_charts_the_replicas_and_says_what_is_missing(scaled, client, people):
    client.force_login(people["viewer"])
    model = Deployment.objects.get(application__cluster=scaled, application__name="scaled", name="Model")
    page = client.get(reverse("fleet:deployment", args=[model.pk])).content.decode()
    assert 'id="scaling-chart"' in page and 'id="scaling-chart-data"' in page and "js/scaling_chart.js" in page
    # Its markers are named for what they are: an autoscaler's decisions only where it autoscales.
    autoscales = model.autoscaling_max_replicas is not None
    assert ("the autoscaler's decisions (" in page) == autoscales
    assert ("does not autoscale" in page) == (not autoscales)
    huge = Deployment.objects.get(application__cluster=scaled, application__name="huge")
    page = client.get(reverse("fleet:deployment", args=[huge.pk])).content.decode()
    assert "replicas-unschedulable" in page and "2.3 CPU short" in page


def test_an_incident_page_charts_its_deployment_s_replicas(scaled, client, people):
    client.force_login(people["viewer"])
    model = Deployment.objects.get(application__cluster=scaled, application__name="scaled", name="Model")
    now = timezone.now()
    incident = IncidentFactory(
        kind="latency_spike",
        cluster=scaled,
        deployment=model,
        application_name="scaled",
        title="Latency",
        started_at=now - timedelta(minutes=1),
        last_signal_at=now,
    )
    page = client.get(reverse("incidents:detail", args=[incident.pk])).content.decode()
    assert 'id="scaling-chart-data"' in page and "chart.umd.min.js" in page
    elsewhere = IncidentFactory(
        cluster=scaled,
        deployment=model,
        application_name="scaled",
        title="Last week",
        started_at=now - timedelta(days=7),
        resolved_at=now - timedelta(days=6),
    )
    page = client.get(reverse("incidents:detail", args=[elsewhere.pk])).content.decode()
    assert "scaling-chart-data" not in page
