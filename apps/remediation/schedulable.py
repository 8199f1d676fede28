"""What one replica asks Ray for (CPUs, GPUs, memory, custom resources) against what the cluster
can still schedule for the deployment. Pure functions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.remediation.measurements import GIB, MIB

# Serve's own default when a deployment sets no num_cpus.
SERVE_DEFAULT_CPUS = 1.0


@dataclass(frozen=True)
class Resources:
    """What one replica asks Ray for, and what the cluster can still schedule for this
    deployment: the nodes' totals minus what every other deployment's replicas hold."""

    per_replica: dict[str, float]
    free: dict[str, float] | None  # None: the cluster's resources could not be read
    reason: str

    def replicas(self) -> tuple[int | None, str]:
        """How many replicas the resources schedule, and the resource that binds."""
        if self.free is None:
            return None, ""
        best: tuple[int, str] | None = None
        for name, need in sorted(self.per_replica.items()):
            if need <= 0:
                continue
            fits = int(math.floor(self.free.get(name, 0.0) / need + 1e-9))
            if best is None or fits < best[0]:
                best = (fits, name)
        if best is None:
            return None, ""
        return max(best[0], 0), best[1]


def resources_from(
    effective: dict, node_totals: list[dict[str, float]] | None, others: list[tuple[dict, int]]
) -> Resources:
    """Per-replica demand from the deployment's `ray_actor_options` (Serve's default of 1 CPU when
    it names none), against the alive nodes' totals minus `others`: (actor options, replicas) of
    every other deployment on the cluster."""
    per_replica = _demand(effective.get("ray_actor_options") or {})
    if node_totals is None:
        return Resources(
            per_replica, None, "The cluster's resources could not be read: replicas are not checked against them."
        )
    totals: dict[str, float] = {}
    for node in node_totals:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + float(amount)
    held: dict[str, float] = {}
    for options, replicas in others:
        for name, amount in _demand(options or {}).items():
            held[name] = held.get(name, 0.0) + amount * replicas
    free = {name: max(totals.get(name, 0.0) - held.get(name, 0.0), 0.0) for name in per_replica}
    wants = ", ".join(f"{amount_text(v)} {k}" for k, v in sorted(per_replica.items()) if v > 0) or "no resources"
    has = ", ".join(
        f"{amount_text(free[k])} of {amount_text(totals.get(k, 0.0))} {k}"
        for k in sorted(per_replica)
        if per_replica[k] > 0
    )
    return Resources(
        per_replica,
        free,
        f"A replica asks for {wants}; the cluster has {has or 'nothing asked'} free for this "
        "deployment (its alive nodes' totals less what the other deployments' replicas hold).",
    )


def _demand(options: dict) -> dict[str, float]:
    cpus = options.get("num_cpus")
    demand = {"CPU": float(SERVE_DEFAULT_CPUS if cpus is None else cpus), "GPU": float(options.get("num_gpus") or 0)}
    if options.get("memory"):
        demand["memory"] = float(options["memory"])
    for name, amount in (options.get("resources") or {}).items():
        demand[str(name)] = float(amount)
    return {k: v for k, v in demand.items() if v > 0}


def amount_text(value: float) -> str:
    return f"{value / GIB:.1f} GiB" if value >= MIB else f"{value:g}"
