"""A scaler's policy, from what Fleetdeck knows of its deployment: the latest calibration (the
concurrency a replica holds and how long a request takes there), the nodes' memory headroom and
the resources the cluster can still schedule (the ceiling), the deployment's queue bound. Reads
the database only; the sizing arithmetic is the remediation wizard's, so the scaler and the
wizard cannot disagree about what a replica costs."""

from __future__ import annotations

from dataclasses import dataclass

from apps.calibration.services import latest_curve
from apps.fleet.metric_readings import PROCESS_MB
from apps.fleet.models import Deployment
from apps.incidents.models import NodeWindow, OomKillRecord, SignalWindow
from apps.remediation import margin, measurements, schedulable
from apps.scaler.decision import Policy
from apps.scaler.models import Scaler


@dataclass(frozen=True)
class Built:
    """The policy, or None with the reason no decision can be made."""

    policy: Policy | None
    why_not: str = ""
    ceiling_reason: str = ""


def build(scaler: Scaler) -> Built:
    deployment = scaler.deployment
    curve = latest_curve(deployment)
    memory = measurements.memory_from_curve(curve) if curve is not None else None
    concurrency = _concurrency(scaler, memory)
    if concurrency is None:
        return Built(
            None,
            "The deployment has no calibration on the concurrency axis and the scaler names no concurrency: "
            "calibrate it (or set the scaler's concurrency) so a replica's capacity is measured, not guessed.",
        )
    service_s = scaler.service_s or (memory.service_s(concurrency) if memory is not None else None)
    if not service_s:
        return Built(
            None,
            "No service time: the calibration measured none and the scaler names none, so the arrival rate "
            "cannot be turned into requests in flight.",
        )
    peak = memory.peak(concurrency) if memory is not None else None
    budget = _budget(deployment, curve, memory.baseline_bytes if memory is not None else None)
    ceiling, ceiling_reason = _ceiling(budget, _resources(deployment), peak)
    bound = deployment.max_queued_requests
    policy = Policy(
        concurrency=concurrency,
        service_s=service_s,
        min_replicas=scaler.min_replicas,
        max_replicas=scaler.max_replicas,
        memory_ceiling=ceiling,
        peak_bytes=peak,
        # Serve's -1 is no bound at all.
        queue_bound=bound if bound is not None and bound >= 0 else None,
        latency_objective_ms=scaler.latency_objective_ms,
    )
    return Built(policy, ceiling_reason=ceiling_reason)


def _concurrency(scaler: Scaler, memory: measurements.Memory | None) -> int | None:
    """Requests a replica takes: the scaler's own setting, else the calibrated level Serve admits, and
    never more than Serve admits to it, whatever memory would allow."""
    cap = scaler.deployment.max_ongoing_requests
    concurrency = scaler.concurrency or _calibrated_concurrency(memory, cap)
    if concurrency is not None and cap:
        concurrency = min(concurrency, cap)
    return concurrency


def _calibrated_concurrency(memory: measurements.Memory | None, cap: int | None) -> int | None:
    """The highest measured level a replica is allowed to reach: past the last measured level the
    curve is a guess, and above `max_ongoing_requests` Serve never admits."""
    if memory is None or not memory.measured_levels:
        return None
    levels = [level for level in memory.measured_levels if cap is None or level <= cap]
    return max(levels) if levels else min(memory.measured_levels)


def _budget(deployment: Deployment, curve, baseline: int | None) -> measurements.Budget | None:
    """The tightest node's headroom below the kill threshold, plus what this deployment's running
    replicas hold now (room they grow into: at rest they are far below their peak), less the margin
    the calibration's repeated rounds call for, as the wizard keeps it."""
    cluster = deployment.application.cluster
    windows = {
        window.node_ip: point
        for window in NodeWindow.objects.filter(cluster=cluster)
        if (point := measurements.newest_node_memory(window.points))
    }
    if not windows:
        return None
    threshold, threshold_reason = _kill_threshold(cluster, windows)
    mine, mine_reason = _replicas_memory(deployment, baseline)
    # Spread evenly: which node holds how many of them is not in the readings.
    share = mine / len(windows)
    points = [{**p, "mem_used": max(p.get("mem_used", 0) - share, 0)} for p in windows.values()]
    return measurements.budget_from_nodes(
        points,
        margin=margin.from_curve(curve) if curve is not None else None,
        threshold=threshold,
        threshold_reason=threshold_reason,
        running=f"{mine_reason}, counted as room they grow into",
    )


def _resources(deployment: Deployment) -> schedulable.Resources:
    """What the nodes' totals less every other deployment's replicas schedule of this one."""
    totals = [
        {name: float(pair[1]) for name, pair in (resources or {}).items() if isinstance(pair, (list, tuple))}
        for resources in (deployment.application.cluster.node_resources or {}).values()
    ]
    return schedulable.resources_from(deployment.effective_config or {}, totals or None, _others(deployment))


def _ceiling(
    budget: measurements.Budget | None, resources: schedulable.Resources, peak: int | None
) -> tuple[int | None, str]:
    """Replicas memory and schedulable resources hold: by memory, the budget on every node divided
    by the calibrated peak."""
    reasons, bounds = [], []
    if peak and budget is not None:
        by_memory = (budget.bytes_per_node // peak) * budget.nodes
        bounds.append(by_memory)
        reasons.append(
            f"memory holds {by_memory} of {measurements.mib(peak)} at their calibrated peak ({budget.reason})"
        )
    by_resources, binding = resources.replicas()
    if by_resources is not None:
        bounds.append(by_resources)
        reasons.append(f"{binding} schedules {by_resources} ({resources.reason})")
    if not bounds:
        return None, "Neither node memory nor node resources are known: no ceiling."
    return min(bounds), "; ".join(reasons)


def _replicas_memory(deployment: Deployment, baseline: int | None) -> tuple[float, str]:
    """What the deployment's running replicas hold now, and where the figure comes from: their
    unique memory in the newest reading (what the node gets back if they go; their resident memory
    counts the pages all workers share once per replica, and overstated the room), else their
    resident memory, else the calibrated baseline of each."""
    application = deployment.application
    window = SignalWindow.objects.filter(
        cluster_id=application.cluster_id, application_name=application.name, deployment_name=deployment.name
    ).first()
    newest = next((p for p in reversed(window.points if window else []) if p.get("rss_mb")), None)
    if newest is not None:
        held = (newest.get("uss_mb") or newest["rss_mb"]) * PROCESS_MB
        own = " of their own" if newest.get("uss_mb") else ""
        return held, f"its replicas hold {measurements.mib(held)}{own} now"
    running = deployment.running_replicas
    rest = running * (baseline or 0)
    return rest, f"its {running} running replica(s) at their calibrated {measurements.mib(baseline or 0)} at rest"


def _kill_threshold(cluster, latest: dict[str, dict]) -> tuple[float | None, str]:
    """The fraction of node memory where Ray's monitor kills, as the newest kill on the cluster
    reported it: operators lower RAY_memory_usage_threshold (or a container limit sits below the
    node), and a ceiling under Ray's default would then hold replicas the monitor kills."""
    kill = (
        OomKillRecord.objects.filter(incident__cluster=cluster, threshold_bytes__isnull=False)
        .order_by("-seen_at", "-id")
        .only("threshold_bytes", "node_ip", "seen_at")
        .first()
    )
    if kill is None or not kill.threshold_bytes:
        return None, ""
    node = latest.get(kill.node_ip) or (next(iter(latest.values())) if len(latest) == 1 else None)
    if not node or not node.get("mem_total"):
        return None, ""
    where = kill.node_ip or "the node"
    reason = f"Ray's kill on {where} at {kill.seen_at:%Y-%m-%d %H:%M} named {kill.threshold_bytes / 2**30:.2f} GiB"
    return min(kill.threshold_bytes / node["mem_total"], 1.0), reason


def _others(deployment: Deployment) -> list[tuple[dict, int]]:
    """What every other deployment on the cluster holds: its actor options and replica count."""
    rows = (
        Deployment.objects.filter(
            application__cluster_id=deployment.application.cluster_id,
            removed_at__isnull=True,
            application__removed_at__isnull=True,
        )
        .exclude(pk=deployment.pk)
        .values_list("effective_config", "running_replicas", "target_replicas")
    )
    return [
        ((config or {}).get("ray_actor_options") or {}, max(running or 0, target or 0))
        for config, running, target in rows
    ]
