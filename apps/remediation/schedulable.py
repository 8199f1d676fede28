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
            fits = math.floor(self.free.get(name, 0.0) / need + 1e-9)
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
    per_replica = demand_of(effective.get("ray_actor_options") or {})
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
        for name, amount in demand_of(options or {}).items():
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


def demand_of(options: dict) -> dict[str, float]:
    cpus = options.get("num_cpus")
    demand = {"CPU": float(SERVE_DEFAULT_CPUS if cpus is None else cpus), "GPU": float(options.get("num_gpus") or 0)}
    if options.get("memory"):
        demand["memory"] = float(options["memory"])
    for name, amount in (options.get("resources") or {}).items():
        demand[str(name)] = float(amount)
    return {k: v for k, v in demand.items() if v > 0}


def amount_text(value: float) -> str:
    return f"{value / GIB:.1f} GiB" if value >= MIB else f"{value:g}"


# Resources every node reports that no replica asks for by name.
NODE_MARKERS = ("node:", "objectStoreMemory", "object_store_memory")


def node_figures(nodes: dict) -> dict[str, dict[str, tuple[float, float]]]:
    """{node IP: {resource: (free, total)}} from the stored `/api/cluster_status` reading
    ({IP: {resource: [used, total]}}), leaving out the per-node markers."""
    out = {}
    for ip, resources in (nodes or {}).items():
        figures = {}
        for name, pair in (resources or {}).items():
            if name.startswith(NODE_MARKERS) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
                continue
            used, total = float(pair[0]), float(pair[1])
            figures[name] = (max(total - used, 0.0), total)
        out[ip] = figures
    return out


def reports_no_resources(nodes: dict) -> bool:
    return not any(total > 0 for figures in node_figures(nodes).values() for _, total in figures.values())


@dataclass(frozen=True)
class Shortfall:
    """What one replica lacks: per resource, how much more it asks for than the node with the
    most of it free has, i.e. the least that would have to be freed or added."""

    missing: dict[str, float]
    most_free: dict[str, float]  # the most free on one node, for each resource the replica asks for

    def text(self, per_replica: dict[str, float]) -> str:
        parts = [
            f"{amount_text(per_replica[name])} {name}, and the most free on one node is "
            f"{amount_text(self.most_free[name])} {name} ({amount_text(short)} {name} short)"
            for name, short in sorted(self.missing.items())
        ]
        if not parts:
            asked = ", ".join(f"{amount_text(v)} {k}" for k, v in sorted(per_replica.items()) if v > 0)
            return f"A replica asks for {asked}: each is free on some node, but no node has all of them free."
        return "A replica asks for " + "; ".join(parts) + ": no node can place it."


def unplaceable(per_replica: dict[str, float], nodes: dict) -> Shortfall | None:
    """None when some node has every resource a replica asks for free."""
    demand = {name: need for name, need in per_replica.items() if need > 0}
    figures = node_figures(nodes)
    if any(all(f.get(name, (0.0, 0.0))[0] + 1e-9 >= need for name, need in demand.items()) for f in figures.values()):
        return None
    most_free = {name: max((f.get(name, (0.0, 0.0))[0] for f in figures.values()), default=0.0) for name in demand}
    missing = {name: need - most_free[name] for name, need in demand.items() if most_free[name] + 1e-9 < need}
    return Shortfall(missing, most_free)


def replicas_that_fit(per_replica: dict[str, float], nodes: dict) -> tuple[int, str]:
    """How many replicas the nodes could hold if nothing else ran on them (each node as many as
    its scarcest resource allows), and the resource that binds across the cluster."""
    demand = {name: need for name, need in per_replica.items() if need > 0}
    if not demand:
        return 0, ""
    figures = node_figures(nodes).values()
    count = sum(
        min(math.floor(f.get(name, (0.0, 0.0))[1] / need + 1e-9) for name, need in demand.items()) for f in figures
    )
    totals = {name: sum(f.get(name, (0.0, 0.0))[1] for f in figures) for name in demand}
    return count, min(demand, key=lambda name: (totals[name] / demand[name], name))


def total_of(resource: str, nodes: dict) -> float:
    return sum(f.get(resource, (0.0, 0.0))[1] for f in node_figures(nodes).values())
