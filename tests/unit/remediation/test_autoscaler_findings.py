"""Why a deployment is not at its target, and the graceful-shutdown lint: pure rules on configs
and node readings captured from a real Ray 2.60 head, then through a replayed sync."""

from __future__ import annotations

import copy
import time

import pytest

from apps.fleet import sync
from apps.remediation import rules
from apps.remediation.models import Finding
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory


def captured(app: str, dep: str) -> dict:
    body = ray_fixture("serve_applications_autoscaling_waiting.json")
    return copy.deepcopy(body["applications"][app]["deployments"][dep])


def nodes() -> dict:
    """The captured /api/cluster_status as the sync stores it: {IP: {resource: [used, total]}}."""
    by_node = ray_fixture("cluster_status_replica_waiting.json")["data"]["clusterStatus"]["loadMetricsReport"][
        "usageByNode"
    ]
    (usage,) = by_node.values()
    return {"192.0.2.2": usage}


def subject(dep: dict, **facts) -> rules.Subject:
    return rules.Subject(
        cluster_name="c",
        ray_version="2.60.0",
        application="scaled",
        deployment=dep["name"],
        effective=dep["deployment_config"],
        submitted={},
        required_resources=dep["required_resources"],
        target_replicas=dep["target_num_replicas"],
        **facts,
    )


def waiting(**facts) -> rules.Subject:
    facts = {"waiting_replicas": 1, "waiting_since_s": time.time() - 90, "waiting_for_s": 90.0, **facts}
    return subject(captured("huge", "Echo"), **facts)


def test_a_replica_no_node_can_place_names_the_resource_and_the_shortfall():
    hit = rules.replicas_unschedulable(waiting(node_resources=nodes()))
    assert hit.rule == "replicas-unschedulable" and hit.severity == "major"
    # 4 CPU asked; the node has 2 CPU of which 0.3 are held.
    assert hit.evidence["missing"] == {"CPU": pytest.approx(2.3)}
    assert hit.evidence["most_free_on_one_node"] == {"CPU": pytest.approx(1.7)}
    assert (
        hit.message
        == "A replica asks for 4 CPU, and the most free on one node is 1.7 CPU (2.3 CPU short): no node can place it."
    )


def test_a_replica_waiting_less_than_the_threshold_is_no_finding_yet():
    assert rules.replicas_unschedulable(waiting(node_resources=nodes(), waiting_for_s=30.0)) is None


def test_a_waiting_replica_on_a_node_with_room_is_not_a_resource_problem():
    roomy = {"192.0.2.2": {"CPU": [0.3, 8.0], "memory": [0, 23509880832.0]}}
    assert rules.replicas_unschedulable(waiting(node_resources=roomy)) is None


def test_memory_and_custom_resources_are_weighed_on_one_node_each():
    dep = captured("huge", "Echo")
    dep["required_resources"] = {"CPU": 1.0, "memory": 8 * 2**30, "accel": 1.0}
    split = {
        "10.0.0.1": {"CPU": [0.0, 4.0], "memory": [0.0, 16 * 2**30]},
        "10.0.0.2": {"CPU": [0.0, 4.0], "accel": [0.0, 1.0], "memory": [12 * 2**30, 16 * 2**30]},
    }
    hit = rules.replicas_unschedulable(
        subject(dep, waiting_replicas=1, waiting_since_s=1.0, waiting_for_s=600.0, node_resources=split)
    )
    # Each resource is free on some node, but no node has all three.
    assert hit.evidence["missing"] == {}
    assert "no node has all of them free" in hit.message


def test_nodes_that_report_no_resources_get_a_clear_message():
    hit = rules.replicas_unschedulable(waiting(node_resources={"": {}}))
    assert hit.evidence["nodes_report_no_resources"] is True
    assert hit.message.startswith("The cluster's nodes report no resources")
    assert rules.max_replicas_unreachable(waiting(node_resources={"": {}})) is None


def test_unread_resources_say_so():
    hit = rules.replicas_unschedulable(waiting(node_resources=None))
    assert "could not be read" in hit.message and "missing" not in hit.evidence


def test_max_replicas_beyond_what_the_nodes_can_ever_hold():
    dep = captured("scaled", "Model")  # 0.2 CPU a replica, max_replicas 4, on a 2-CPU node
    assert rules.max_replicas_unreachable(subject(dep, node_resources=nodes())) is None
    dep["deployment_config"]["autoscaling_config"]["max_replicas"] = 25
    hit = rules.max_replicas_unreachable(subject(dep, node_resources=nodes()))
    assert hit.evidence == {
        "max_replicas": 25,
        "replicas_that_fit": 10,
        "resource": "CPU",
        "needed": pytest.approx(5.0),
        "cluster_total": 2.0,
        "short": pytest.approx(3.0),
    }
    assert hit.patch == {"autoscaling_config": {"max_replicas": 10}}
    assert "max_replicas 25 × 0.2 CPU per replica needs 5 CPU" in hit.message and "3 CPU short" in hit.message


def test_a_deployment_without_autoscaling_has_no_max_replicas_finding():
    assert rules.max_replicas_unreachable(subject(captured("huge", "Echo"), node_resources=nodes())) is None


def test_unhealthy_autoscaling_metrics():
    dep = captured("scaled", "Model")
    detail = {"scaling_status": "STABLE", "decisions": [], "metrics_health": "unavailable", "errors": ["no metrics"]}
    hit = rules.autoscaling_metrics_unhealthy(subject(dep, autoscaling_detail=detail))
    assert hit.evidence == {"metrics_health": "unavailable", "scaling_status": "STABLE", "errors": ["no metrics"]}
    assert "unavailable" in hit.message and "no metrics" in hit.message
    healthy = {**detail, "metrics_health": "healthy"}
    assert rules.autoscaling_metrics_unhealthy(subject(dep, autoscaling_detail=healthy)) is None
    assert rules.autoscaling_metrics_unhealthy(subject(dep, autoscaling_detail=None)) is None


def test_a_graceful_shutdown_shorter_than_the_p99_gets_a_computed_timeout():
    dep = captured("scaled", "Model")  # Serve's defaults: timeout 20 s, wait loop 2 s
    hit = rules.graceful_shutdown_short(subject(dep, p99_processing_ms=31_400))
    assert hit.evidence == {
        "graceful_shutdown_timeout_s": 20.0,
        "graceful_shutdown_wait_loop_s": 2.0,
        "p99_processing_s": 31.4,
        "suggested_timeout_s": 34,
    }
    assert hit.patch == {"graceful_shutdown_timeout_s": 34}
    assert rules.graceful_shutdown_short(subject(dep, p99_processing_ms=19_000)) is None
    assert rules.graceful_shutdown_short(subject(dep, p99_processing_ms=None)) is None


@pytest.mark.django_db
def test_a_sync_opens_the_finding_and_resolves_it_once_the_replica_runs(use_replay, team, settings):
    settings.FLEETDECK_WAITING_REPLICA_S = 30
    cluster = ClusterFactory(name="c", team=team)
    body = ray_fixture("serve_applications_autoscaling_waiting.json")
    body["applications"]["huge"]["deployments"]["Echo"]["replicas"][0]["start_time_s"] = time.time() - 45
    use_replay.routes["/api/serve/applications/"] = body
    use_replay.routes["/api/cluster_status"] = "cluster_status_replica_waiting.json"
    sync.sync_and_announce([cluster.pk])
    finding = Finding.objects.get(cluster=cluster, rule="replicas-unschedulable", resolved_at__isnull=True)
    assert (finding.application_name, finding.deployment_name) == ("huge", "Echo")
    assert "2.3 CPU short" in finding.message

    del body["applications"]["huge"]
    sync.sync_and_announce([cluster.pk])
    finding.refresh_from_db()
    assert finding.resolved_at is not None


@pytest.mark.django_db
def test_a_cluster_whose_nodes_report_nothing_gets_the_message_through_a_sync(use_replay, team, settings):
    settings.FLEETDECK_WAITING_REPLICA_S = 30
    cluster = ClusterFactory(name="c", team=team)
    body = ray_fixture("serve_applications_autoscaling_waiting.json")
    body["applications"]["huge"]["deployments"]["Echo"]["replicas"][0]["start_time_s"] = time.time() - 45
    status = ray_fixture("cluster_status_replica_waiting.json")
    status["data"]["clusterStatus"]["loadMetricsReport"].update(usage={}, usageByNode={})
    use_replay.routes.update({"/api/serve/applications/": body, "/api/cluster_status": status})
    sync.sync_and_announce([cluster.pk])
    finding = Finding.objects.get(cluster=cluster, rule="replicas-unschedulable")
    assert finding.message.startswith("The cluster's nodes report no resources")
