"""A synced cluster behind the replayed dashboard, its demo/Model deployment calibrated (1, 2 and
4 requests in flight), one 16 GiB node with 8 GiB used and 2 CPUs, and an operator."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.calibration.models import MemoryCalibration
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from apps.incidents.models import NodeWindow, SignalWindow
from tests.factories import ClusterFactory

GIB = 2**30
MIB = 2**20


@pytest.fixture
def cluster(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    Cluster.objects.filter(pk=cluster.pk).update(node_resources={"10.0.0.1": {"CPU": [0.5, 2.0]}})
    NodeWindow.objects.create(
        cluster=cluster, node_ip="10.0.0.1", recent=[{"t": time.time(), "mem_used": 8 * GIB, "mem_total": 16 * GIB}]
    )
    return Cluster.objects.get(pk=cluster.pk)


@pytest.fixture
def model(cluster) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="demo", name="Model"
    )


@pytest.fixture
def calibrated(model, people) -> MemoryCalibration:
    """Half a second a request up to 4 at once; 512 MiB at rest, +256 MiB a request."""
    now = timezone.now()
    return MemoryCalibration.objects.create(
        deployment=model,
        cluster=model.application.cluster,
        application_name="demo",
        deployment_name="Model",
        submission_id="fleetdeck-calibration-scaler",
        state=MemoryCalibration.State.SUCCEEDED,
        axis="concurrency",
        device="cpu",
        baseline_bytes=512 * MIB,
        points=[
            {"x": 1, "peak_bytes": 768 * MIB, "service_s": 0.5},
            {"x": 2, "peak_bytes": 1024 * MIB, "service_s": 0.5},
            {"x": 4, "peak_bytes": 1536 * MIB, "service_s": 0.5},
        ],
        monotone=True,
        levels=[1, 2, 4],
        started_at=now,
        finished_at=now,
    )


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"], via="test")


def record_readings(deployment: Deployment, rates: list[float], *, end: float | None = None, **extra) -> float:
    """Metrics readings 30 s apart, the last at `end` (now), as the sync's reading stores them;
    returns the last one's time."""
    end = time.time() if end is None else end
    points = [
        {
            "t": round(end - 30 * (len(rates) - 1 - i), 1),
            "rps": rps,
            "ongoing": rps * 0.5,
            "queued": 0.0,
            "seconds": 30.0,
            **extra,
        }
        for i, rps in enumerate(rates)
    ]
    application = deployment.application
    window, _ = SignalWindow.objects.get_or_create(
        cluster_id=application.cluster_id, application_name=application.name, deployment_name=deployment.name
    )
    window.save_points(points)
    return points[-1]["t"]
