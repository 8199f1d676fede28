"""A cluster whose demo/Model was just OOM-killed, behind an editable replayed dashboard, its
incident and a calibration of the deployment."""

from __future__ import annotations

import pytest

from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents import services as incidents
from apps.incidents.models import Incident
from tests.factories import ClusterFactory
from tests.unit.remediation.wizard_helpers import (
    DEAD,
    Live,
    calibrate,
)


@pytest.fixture
def live(use_replay):
    live = Live()
    use_replay.routes["/api/serve/applications/"] = live
    use_replay.routes["/api/v0/actors"] = DEAD
    use_replay.routes["/api/v0/nodes"] = "state_nodes.json"
    use_replay.routes["/nodes"] = "nodes_view_summary.json"
    return live


@pytest.fixture
def cluster(team, live):
    cluster = ClusterFactory(name="gpu-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    return Cluster.objects.get(pk=cluster.pk)


@pytest.fixture
def incident(cluster):
    incidents.detect(cluster.pk)
    return Incident.objects.get(application_name="demo", deployment_name="Model", kind="oom_kill")


@pytest.fixture
def calibrated(cluster):
    return calibrate(cluster)
