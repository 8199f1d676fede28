"""A deployment's observed request sizes, read from its signal window: for its page, its API and a
calibration's observed mix. The arithmetic is apps.fleet.request_sizes'."""

from __future__ import annotations

import time

from apps.fleet import llm, request_sizes
from apps.fleet.metric_readings import bound_text
from apps.fleet.models import Deployment
from apps.incidents.models import SignalWindow


def points(deployment: Deployment) -> list[dict]:
    window = SignalWindow.objects.filter(
        cluster_id=deployment.application.cluster_id,
        application_name=deployment.application.name,
        deployment_name=deployment.name,
    ).first()
    return list(window.points) if window is not None else []


def observed(deployment: Deployment, *, hours: float = 24, now: float | None = None) -> dict:
    """{"source": where the sizes come from or None, "hours", "input": <side>, "output": <side> or None},
    a side being {"buckets": [{"le", "label", "requests"}], "quantiles": {...}, "over_time": [...]}; a
    side with no request counted in the span is None."""
    source = request_sizes.source(deployment, llm.could_serve_llm(deployment))
    since = (time.time() if now is None else now) - hours * 3600
    recent = [p for p in points(deployment) if p.get("t", 0) >= since]
    sides = {key: _side(recent, key) for key in ("size_in", "size_out")}
    return {"source": source, "hours": hours, "input": sides["size_in"], "output": sides["size_out"]}


def _side(recent: list[dict], key: str) -> dict | None:
    buckets = request_sizes.merged(recent, key)
    total = sum(count for _, count in buckets)
    if not total:
        return None
    return {
        "buckets": [
            {
                "le": bound_text(bound),
                "label": request_sizes.bucket_label(bound),
                "requests": count,
                "share": round(count / total, 4),
            }
            for bound, count in buckets
        ],
        "quantiles": request_sizes.quantiles(buckets),
        "over_time": request_sizes.over_time(recent, key),
    }
