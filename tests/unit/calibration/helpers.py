"""What the calibration tests share: a job's result line, a curve, a job's state as Ray reports it,
the deployment page."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.urls import reverse

from apps.calibration.curve import Curve
from tests.conftest import ray_fixture

MIB = 2**20
WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def result_line(**overrides) -> str:
    body = {
        "device": "cpu",
        "axis": "concurrency",
        "baseline_bytes": 100 * MIB,
        "points": [
            {"concurrency": 1, "peak_bytes": 164 * MIB},
            {"concurrency": 2, "peak_bytes": 228 * MIB},
            {"concurrency": 4, "peak_bytes": 356 * MIB},
        ],
    }
    body.update(overrides)
    return "FLEETDECK_CALIBRATION " + json.dumps(body)


def curve(points, baseline=100, monotone=True) -> Curve:
    return Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=baseline,
        points=points,
        measured_at=WHEN,
        calibration_id=1,
        monotone=monotone,
    )


def job_says(replay, calibration, status, *, logs="", message="", end=True):
    payload = {
        **ray_fixture("jobs_get_one.json"),
        "submission_id": calibration.submission_id,
        "status": status,
        "message": message,
        "end_time": 1796044014770 if end else None,
    }
    replay.routes[f"/api/jobs/{calibration.submission_id}"] = payload
    replay.routes[f"/api/jobs/{calibration.submission_id}/logs"] = {"logs": logs}


def page_of(client, deployment) -> str:
    return client.get(reverse("fleet:deployment", args=[deployment.pk])).content.decode()
