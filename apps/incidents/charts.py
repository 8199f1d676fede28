"""The series an incident page charts, from the evidence kept with the incident: times in
milliseconds for the browser, memory in binary units (MiB per replica, GiB per node), each OOM
kill as a marker at the moment Fleetdeck saw it. Pure, apart from reading the kill records."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.fleet.metric_readings import PROCESS_MB
from apps.fleet.scaling_history import scaling_series
from apps.incidents.models import Incident
from apps.incidents.oom import replica_memory

MIB, GIB = 2**20, 2**30
# The replica counts charted around an incident: from a while before it started, to see what
# the autoscaler did as it built up, until it was resolved (or now).
SCALING_LEAD = timedelta(minutes=15)
# Ray's per-process memory metrics count decimal megabytes.


def chart_data(incident: Incident) -> dict | None:
    """None when the incident kept no readings."""
    evidence = incident.evidence or {}
    node_series = evidence.get("node_series") or []
    if node_series:
        # A node incident: its detectors judge the share of the node's memory in use.
        return _framed(
            {"node_share": {"mem": _line(node_series, "mem"), "gpu": _line(node_series, "gpu")}}, node_series, []
        )
    series = evidence.get("series") or []
    nodes = evidence.get("node_memory") or {}
    if not series and not nodes:
        return None
    kills = _kills(incident)
    data: dict = {"kills": kills}
    if series:
        data["latency"] = {"p50": _line(series, "p50"), "p99": _line(series, "p99")}
        data["load"] = {key: _line(series, key) for key in ("ongoing", "queued", "rps")}
        per_replica = [
            [_ms(p), round(p["rss_mb"] * PROCESS_MB / p["replicas"] / MIB, 1)]
            for p in series
            if p.get("rss_mb") and p.get("replicas")
        ]
        if per_replica:
            data["replica_mib"] = per_replica
    if nodes:
        data["nodes"] = [_node(ip, points, kills) for ip, points in sorted(nodes.items())]
    return _framed(data, [*series, *(p for points in nodes.values() for p in points)], kills)


def incident_scaling(incident: Incident) -> dict | None:
    """The incident's deployment's target and running replicas over the incident's span; None
    for a node incident or when nothing was sampled then."""
    if incident.deployment_id is None:
        return None
    until = incident.resolved_at or timezone.now()
    return scaling_series(incident.deployment, since=incident.started_at - SCALING_LEAD, until=until)


def _framed(data: dict, points: list[dict], kills: list[dict]) -> dict:
    """The time axis spans the readings kept and the kills, nothing more."""
    times = [_ms(p) for p in points] + [kill["t"] for kill in kills]
    return {"start": min(times), "end": max(times), **data}


def _kills(incident: Incident) -> list[dict]:
    out = []
    for kill in incident.oom_kills.all():
        listed = [r for r in replica_memory(kill.message) if r.killed and r.replica == kill.replica]
        out.append(
            {
                "t": int(kill.seen_at.timestamp() * 1000),
                "replica": kill.replica,
                "node": kill.node_ip,
                "node_gib": _gib(kill.used_bytes),
                "threshold_gib": _gib(kill.threshold_bytes),
                # What the killed replica itself held, from the memory monitor's list of top consumers.
                "replica_mib": round(listed[0].used_bytes / MIB, 1) if listed else None,
            }
        )
    return out


def _node(ip: str, points: list[dict], kills: list[dict]) -> dict:
    thresholds = [kill["threshold_gib"] for kill in kills if kill["node"] == ip and kill["threshold_gib"]]
    totals = [p["mem_total"] for p in points if p.get("mem_total")]
    return {
        "ip": ip,
        "used_gib": [[_ms(p), _gib(p["mem_used"])] for p in points if p.get("mem_total")],
        "total_gib": _gib(max(totals)) if totals else None,
        "threshold_gib": min(thresholds) if thresholds else None,
    }


def _line(points: list[dict], key: str) -> list[list]:
    return [[_ms(p), p.get(key)] for p in points]


def _ms(point: dict) -> int:
    return int(point["t"] * 1000)


def _gib(value) -> float | None:
    return round(value / GIB, 3) if value else None
