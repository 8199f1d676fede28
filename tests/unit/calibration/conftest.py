"""A synced cluster behind the replayed dashboard that accepts jobs, its demo/Model deployment, an
operator, and a login per role."""

from __future__ import annotations

import pytest

from apps.accounts.audit import Actor
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.factories import ClusterFactory


@pytest.fixture
def cluster(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/nodes"] = "nodes_view_summary.json"
    return Cluster.objects.get(pk=cluster.pk)


@pytest.fixture
def model(cluster) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="demo", name="Model"
    )


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"], via="test")


@pytest.fixture
def login(client, people):
    def as_(who: str):
        client.force_login(people[who])
        return client

    return as_
