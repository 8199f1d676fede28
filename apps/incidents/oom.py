"""OOM kills as Ray's state API records them. The Serve API never shows one: a replica killed
by the memory monitor is an actor DEAD with `death_cause.oom_context`. Pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from integrations.ray.payloads import Actor

USAGE = re.compile(r"Memory usage (\d+)B exceeded threshold of (\d+)B")
NODE = re.compile(r"\(IP: ([^,]+),")


@dataclass(frozen=True)
class OomKill:
    actor_id: str
    application: str
    deployment: str
    replica: str
    node_ip: str
    used_bytes: int | None
    threshold_bytes: int | None
    message: str


def replica_of(actor_name: str) -> tuple[str, str, str] | None:
    """'SERVE_REPLICA::app#Deployment#replica' -> (app, deployment, replica)."""
    if not actor_name.startswith("SERVE_REPLICA::"):
        return None
    parts = actor_name.split("::", 1)[1].split("#")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def oom_kills(actors: list[Actor]) -> list[OomKill]:
    kills = []
    for actor in actors:
        context = (actor.death_cause or {}).get("oom_context")
        where = replica_of(actor.name)
        if actor.state != "DEAD" or not context or where is None:
            continue
        message = str(context.get("error_message") or "")
        usage, node = USAGE.search(message), NODE.search(message)
        kills.append(
            OomKill(
                actor_id=actor.actor_id,
                application=where[0],
                deployment=where[1],
                replica=where[2],
                node_ip=node.group(1) if node else "",
                used_bytes=int(usage.group(1)) if usage else None,
                threshold_bytes=int(usage.group(2)) if usage else None,
                message=message[:4000],
            )
        )
    return kills


GIB = 2**30
WORKER = re.compile(r"task name=SERVE_REPLICA::([^#\s]+)#([^#\s]+)#([^:\s]+):[^\n]*?actual memory used=([\d.]+)GB")


@dataclass(frozen=True)
class ReplicaMemory:
    application: str
    deployment: str
    replica: str
    used_bytes: int
    killed: bool


def replica_memory(message: str) -> list[ReplicaMemory]:
    """Per-replica memory listed in a memory-monitor kill message: the replicas it killed
    ("Selected to kill") and their peers at that moment. Ray's "GB" are GiB, two decimals."""
    found = []
    for line in message.splitlines():
        for match in WORKER.finditer(line):
            app, dep, replica, gb = match.groups()
            found.append(
                ReplicaMemory(app, dep, replica, int(float(gb) * GIB), line.lstrip().startswith("Selected to kill"))
            )
    return found


# A killed replica that held less than half of what the largest replica in the kill message held
# did not cause the kill.
COLLATERAL_RATIO = 2


def culprit(kill: OomKill) -> tuple[str, str]:
    """The (application, deployment) whose replica held the memory when Ray's monitor killed
    `kill`'s replica. Since Ray 2.56 the monitor kills several workers at once, chosen by how
    recently their task started, so an innocent replica can die beside the greedy one: blaming
    it would send the operator to tune the wrong deployment."""
    listed = replica_memory(kill.message)
    own = next((r for r in listed if r.replica == kill.replica), None)
    largest = max(listed, key=lambda r: r.used_bytes, default=None)
    if own is None or largest is None or largest.used_bytes < COLLATERAL_RATIO * max(own.used_bytes, 1):
        return kill.application, kill.deployment
    return largest.application, largest.deployment
