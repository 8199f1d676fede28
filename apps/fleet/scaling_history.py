"""A deployment's target and running replicas over time, for the charts of the deployment page
and of incident pages: times in milliseconds for the browser, step lines, decisions as markers."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.fleet.models import Deployment, ScalingSample

# Enough for days of a busy autoscaler at one row per change; the chart needs no more.
MAX_SAMPLES = 2000


def prune() -> None:
    """Samples past the retention go, so the table stays bounded by days of changes, not by the
    fleet's age; one indexed DELETE per tick, which finds nothing most of the time."""
    cutoff = timezone.now() - timedelta(days=settings.FLEETDECK_SCALING_HISTORY_DAYS)
    ScalingSample.objects.filter(observed_at__lt=cutoff).delete()


def scaling_series(
    deployment: Deployment, *, since: datetime | None = None, until: datetime | None = None
) -> dict | None:
    """None when no sample falls in the window."""
    rows = ScalingSample.objects.filter(deployment=deployment)
    if since is not None:
        rows = rows.filter(observed_at__gte=since)
    if until is not None:
        rows = rows.filter(observed_at__lte=until)
    samples = list(rows.order_by("-observed_at", "-id")[:MAX_SAMPLES])[::-1]
    if not samples:
        return None
    target, running, decisions = [], [], []
    for sample in samples:
        t = _ms(sample.observed_at)
        target.append([t, sample.target])
        running.append([t, sample.running])
        if sample.decision:
            at = sample.decision.get("at_s")
            decisions.append(
                {
                    "t": int(at * 1000) if at else t,
                    "from": sample.decision.get("from"),
                    "to": sample.decision.get("to"),
                    "reason": sample.decision.get("reason") or "target changed (seen by the sync)",
                }
            )
    times = [p[0] for p in target] + [d["t"] for d in decisions]
    return {
        "start": min(times),
        "end": max(times),
        "target": target,
        "running": running,
        "decisions": decisions,
        # Without autoscaling a target change is a config change, not an autoscaler's decision.
        "autoscales": deployment.autoscaling_max_replicas is not None,
    }


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)
