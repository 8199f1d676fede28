"""A scaler's signals, built from what Fleetdeck already collects: the deployment's signal window
(the metrics reading taken with each sync, apps.incidents), its replica counts as the last sync
saw them, the OOM kills the incident detector recorded, and the scaler's own last scale-up."""

from __future__ import annotations

from datetime import UTC, datetime

from apps.fleet.metric_readings import PROCESS_MB
from apps.incidents.models import OomKillRecord, SignalWindow
from apps.scaler.decision import Current, Policy, Sample, Signals
from apps.scaler.models import Scaler, ScalerDecision


def signals_for(scaler: Scaler, policy: Policy, now: float) -> Signals:
    deployment = scaler.deployment
    application = deployment.application
    window = SignalWindow.objects.filter(
        cluster_id=application.cluster_id, application_name=application.name, deployment_name=deployment.name
    ).first()
    # Only the raw readings (the 5-minute summaries are older than any window the decision reads),
    # and always the newest one, however old: its age is what tells a stale pipeline from a quiet one.
    raw = sorted(
        (p for p in (window.recent if window else []) if "t" in p and "summary" not in p), key=lambda p: p["t"]
    )
    since = now - max(policy.stable_window_s, policy.stale_after_s) * 2
    points = [p for p in raw if p["t"] >= since] or raw[-1:]
    samples = tuple(sample_of(point) for point in points)
    kills = list(
        OomKillRecord.objects.filter(
            incident__deployment=deployment, seen_at__gte=datetime.fromtimestamp(now - policy.oom_memory_s, tz=UTC)
        ).values_list("seen_at", flat=True)
    )
    last_up = scaler.decisions.filter(kind=ScalerDecision.Kind.UP).order_by("-at").values_list("at", flat=True).first()
    return Signals(
        now=now,
        samples=samples,
        current=Current(
            # Before the first sync that saw a target, what runs is the best guess of one.
            target=deployment.target_replicas
            if deployment.target_replicas is not None
            else deployment.running_replicas,
            running=deployment.running_replicas,
            starting=deployment.waiting_replicas,
        ),
        oom_kills=tuple(sorted(at.timestamp() for at in kills)),
        killed_at_replicas=replicas_at(raw, [at.timestamp() for at in kills]),
        last_upscale_at=last_up.timestamp() if last_up is not None else None,
    )


def sample_of(point: dict) -> Sample:
    """One signal-window point (apps.fleet.metric_readings.point) as a reading. The proxy's 503s
    are the application's, copied into each of its deployments: for the ingress deployment a
    scaler usually watches, they are its own shed requests."""
    seconds = point.get("seconds") or 0
    shed = float((point.get("http_errors") or {}).get("503", 0) or 0)
    rps = point.get("rps")
    arrival = None
    if rps is not None:
        arrival = rps + (shed / seconds if seconds else 0.0)
    rss_mb, replicas = point.get("rss_mb"), point.get("replicas")
    return Sample(
        at=float(point["t"]),
        ongoing=float(point.get("ongoing") or 0),
        queued=float(point.get("queued") or 0),
        arrival_rps=arrival,
        shed=shed,
        # What clients saw, queueing included, where the proxy exports it; else the replicas' own.
        p99_ms=point.get("http_p99") if point.get("http_p99") is not None else point.get("p99"),
        rss_bytes_per_replica=rss_mb * PROCESS_MB / replicas if rss_mb and replicas else None,
    )


# A kill is recorded at the sync after it: the readings of the minute before tell what ran then.
KILL_LOOK_BACK_S = 60.0


def replicas_at(points: list[dict], kills: list[float]) -> int | None:
    """The fewest replicas that ran at any of `kills`: the most any reading counted in the minute
    before each kill (a killed replica is gone from the reading after it), the smallest of those."""
    counts = []
    for kill in kills:
        seen = [p["replicas"] for p in points if p.get("replicas") and kill - KILL_LOOK_BACK_S <= p["t"] <= kill]
        if seen:
            counts.append(max(seen))
    return min(counts) if counts else None
