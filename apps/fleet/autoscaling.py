"""Serve's autoscaler as the sync stores it: which replicas wait to be placed, the
`autoscaling_detail` as JSON, and the decision behind a new target. Pure functions."""

from __future__ import annotations

from dataclasses import asdict

from integrations.ray.payloads import AutoscalingDetail, Replica


def is_waiting(state: str) -> bool:
    """A replica Ray has not placed or started yet: STARTING (its actor is not scheduled, or its
    constructor runs) or one of the PENDING_* states."""
    return state == "STARTING" or state.startswith("PENDING")


def waiting_since(replicas: list[Replica]) -> float | None:
    """Ray's start time of the oldest waiting replica (seconds since the epoch, Ray's clock)."""
    times = [r.start_time_s for r in replicas if is_waiting(r.state) and r.start_time_s is not None]
    return min(times) if times else None


def detail_json(detail: AutoscalingDetail | None) -> dict | None:
    return asdict(detail) if detail is not None else None


def sample_decision(detail: AutoscalingDetail | None, old_target: int | None, new_target: int | None) -> dict | None:
    """Why the target moved from `old_target` to `new_target`: Serve's latest decision that set it
    when Serve reports decisions, else the move itself, marked as seen by the sync. None when the
    target did not move (or there was none before)."""
    if old_target is None or new_target is None or old_target == new_target:
        return None
    for decision in reversed(detail.decisions if detail else []):
        if decision.curr_num_replicas == new_target:
            return {
                "from": decision.prev_num_replicas,
                "to": decision.curr_num_replicas,
                "reason": decision.reason,
                "at_s": decision.timestamp_s,
                "source": "serve",
            }
    return {"from": old_target, "to": new_target, "reason": "", "at_s": None, "source": "sync"}
