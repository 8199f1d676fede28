"""What a wizard knows before it proposes anything: evidence, ranked causes, the remedies they
call for, and the measured memory and load the config values are computed from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from django.conf import settings

from apps.clusters.models import Cluster
from apps.core.catalogue import PRESCRIPTION, REMEDIES, REMEDIES_FOR, cause
from apps.fleet.configs import key_settings
from apps.fleet.models import Deployment
from apps.incidents.models import Incident, NodeWindow, OomKillRecord, SignalWindow
from apps.incidents.oom import replica_memory
from apps.maintenance.models import MaintenanceRun
from apps.remediation import (
    capacity,
    margin,
    measurements,
    objectives,
    observed,
    scaler_offer,
    schedulable,
    sizing,
    token_caps,
)
from apps.remediation.models import Finding
from apps.remediation.rules import BY_ID

AUTOSCALING_KEYS = ("min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s")
# user_config keys the values depend on (a request's token caps) or set (R4's batch limit).
USER_CONFIG_KEYS = ("max_prompt_tokens", "max_tokens_cap", "max_batch_tokens")
# Readings kept in an incident's evidence for its charts: the wizard shows the rest, not these.
CHART_SERIES = ("series", "node_memory")


class MemorySummary(TypedDict):
    baseline_bytes: int
    per_request_bytes: int
    source: str  # "calibration", "kill message", "traffic"
    reason: str
    lower_bound: bool  # a kill message or traffic alone: shown, sizing nothing


class BudgetSummary(TypedDict):
    bytes_per_node: int  # the margin already kept free
    nodes: int
    reason: str


class LoadSummary(TypedDict):
    peak_in_flight: float | None
    p50_ms: float | None
    peak_rps: float | None
    cold_starts: bool


class ResourcesSummary(TypedDict):
    per_replica: dict[str, float]
    free: dict[str, float] | None
    reason: str


class MarginSummary(TypedDict):
    fraction: float
    percent: float
    reason: str
    computed: float  # what the calibration's rounds call for
    asked: float | None  # the operator's, where asked
    confirmed: bool  # less than computed, typed as confirmed


class ObjectivesSummary(objectives.Stated):
    price: list[dict[str, Any]]  # objectives.price's rows
    margin: MarginSummary


class RemedyRef(TypedDict):
    id: str
    title: str


class Summary(TypedDict):
    """A wizard's diagnosis, stored as its JSON: what every value was computed from."""

    evidence: dict[str, Any]
    causes: list[dict[str, Any]]
    settings: dict[str, Any]
    memory: MemorySummary | None
    # The incident's traffic beside the request the values are sized from ({"heavier", "text"}).
    traffic: dict[str, Any] | None
    observed: dict[str, Any] | None
    budget: BudgetSummary | None
    load: LoadSummary
    resources: ResourcesSummary
    plan: dict[str, Any] | None  # plan_choice.Plan.as_dict()
    objectives: ObjectivesSummary
    conservative: bool
    needs_calibration: bool
    why_not_sized: str
    remedies: list[RemedyRef]


@dataclass
class Diagnosis:
    summary: Summary
    remedies: list[str]
    sizing: sizing.Sizing
    # R11's values where the load varied more than one fixed config serves; empty where it was steady.
    scaler: dict


class Basis(TypedDict):
    """What a wizard's values were computed from: the deployment's settings, and when."""

    at: str  # ISO 8601
    settings: dict[str, Any]  # settings_of(the effective config)


def basis_of(effective: dict, at: str) -> Basis:
    return {"at": at, "settings": settings_of(effective)}


def settings_of(effective: dict) -> dict:
    """The settings the computed values depend on; a live config that differs from these makes a
    wizard stale."""
    out = {
        "max_ongoing_requests": effective.get("max_ongoing_requests"),
        "max_queued_requests": effective.get("max_queued_requests"),
    }
    auto = effective.get("autoscaling_config")
    if isinstance(auto, dict):
        out["autoscaling_config"] = {k: auto.get(k) for k in AUTOSCALING_KEYS}
    else:
        out["num_replicas"] = effective.get("num_replicas")
    user_config = effective.get("user_config")
    if isinstance(user_config, dict) and (tracked := {k: user_config[k] for k in USER_CONFIG_KEYS if k in user_config}):
        out["user_config"] = tracked
    return out


def with_patch(settings: dict, patch: dict) -> dict:
    """`settings_of` after a config patch, as Serve will report it."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in settings.items()}
    for key, value in patch.items():
        if key == "autoscaling_config" and isinstance(value, dict):
            auto = out.pop("autoscaling_config", None) or {k: None for k in AUTOSCALING_KEYS}
            auto.update({k: v for k, v in value.items() if k in AUTOSCALING_KEYS})
            out["autoscaling_config"] = auto
            out.pop("num_replicas", None)
        elif key == "autoscaling_config" and value is None:
            # A null turns autoscaling off; the planner requires the num_replicas Serve then runs
            # wherever the deployment autoscaled.
            out.pop("autoscaling_config", None)
            out["num_replicas"] = patch.get("num_replicas", out.get("num_replicas"))
        elif key == "num_replicas" and isinstance(value, int):
            # A fixed count makes the planner set autoscaling_config to null.
            out["num_replicas"] = value
            if "autoscaling_config" not in patch:
                out.pop("autoscaling_config", None)
        elif key == "user_config" and isinstance(value, dict):
            # Serve replaces user_config wholesale, but the change planner merges the patch into the
            # running one, so the keys the patch leaves out keep their values; a null is sent as
            # null, and Serve reports it back as one.
            tracked = {**(out.get("user_config") or {}), **{k: v for k, v in value.items() if k in USER_CONFIG_KEYS}}
            if tracked:
                out["user_config"] = tracked
        elif key == "user_config" and value is None:
            out.pop("user_config", None)
        elif key in out or key in ("max_ongoing_requests", "max_queued_requests"):
            out[key] = value
    return out


def diagnose(
    cluster: Cluster,
    app: str,
    dep: str,
    effective: dict,
    *,
    incident: Incident | None,
    finding: Finding | None,
    latency_objective_ms: int | None,
    failure_objective: float | None = None,
    curve=None,
    margin_asked: float | None = None,
    margin_confirmed: bool = False,
) -> Diagnosis:
    """`latency_objective_ms` and `failure_objective` are the operator's; None: suggested, and said so."""
    window = SignalWindow.objects.filter(cluster=cluster, application_name=app, deployment_name=dep).first()
    points = window.points if window else []
    load = measurements.load_from_points(points)
    current = sizing.Current.of(effective, cluster.ray_version)
    live = capacity.read(cluster)
    seen = observed.from_points(points)
    computed_margin = margin.from_curve(curve) if curve is not None else margin.unmeasured()
    safety = margin.with_request(computed_margin, margin_asked, margin_confirmed)
    memory, budget = _memory_and_budget(cluster, app, dep, incident, current, points, curve, live, seen, safety)
    resources = schedulable.resources_from(effective, live.node_resources, _others(cluster, app, dep))
    service_s, service_source = _service_time(memory, load)
    started = incident.started_at.timestamp() if incident is not None else None
    goals = objectives.chosen(
        objectives.suggest(points, started, service_s, service_source), latency_objective_ms, failure_objective
    )
    computed = sizing.compute(
        current,
        memory,
        budget,
        load,
        latency_objective_ms=goals.latency_ms,
        curve=curve,
        resources=resources,
        kept_bytes=_kept_at_rest(memory, seen),
    )
    if goals.suggested:
        _say_where_objectives_come_from(computed, goals)

    if incident is not None:
        causes = incident.causes
        evidence = {
            "incident": incident.pk,
            "kind": incident.kind,
            "title": incident.title,
            "signals": incident.signal_count,
            "started_at": incident.started_at.isoformat(),
            **{k: v for k, v in incident.evidence.items() if k not in CHART_SERIES},
        }
    else:
        rule = BY_ID[finding.rule]
        causes = _finding_causes(finding.rule, rule.remedy)
        evidence = {
            "finding": finding.pk,
            "rule": finding.rule,
            "title": rule.title,
            "why": rule.why,
            **finding.evidence,
        }
    remedies = relevant_remedies(causes, current)
    bound = (computed.patch("R10") or {}).get("max_queued_requests", current.max_queued_requests)
    offer = scaler_offer.assess(
        points,
        computed.plan,
        bound,
        effective,
        cluster.ray_version,
        autoscaling=(computed.patch("R2") or {}).get("autoscaling_config"),
        reading_s=settings.FLEETDECK_SYNC_INTERVAL_S,
        start_s=_measured_start_s(cluster, app, dep),
        latency_objective_ms=goals.latency_ms,
    )
    if offer:
        remedies.append(scaler_offer.REMEDY)
    summary: Summary = {
        "evidence": evidence,
        "causes": causes,
        "settings": key_settings(effective),
        "memory": _describe_memory(memory),
        "traffic": _traffic_against_sized(memory, load, current),
        "observed": seen.as_dict() if seen is not None else None,
        "budget": {"bytes_per_node": budget.bytes_per_node, "nodes": budget.nodes, "reason": budget.reason}
        if budget
        else None,
        "load": {
            "peak_in_flight": load.peak_in_flight,
            "p50_ms": load.p50_ms,
            "peak_rps": load.peak_rps,
            "cold_starts": load.cold_starts,
        },
        "resources": {"per_replica": resources.per_replica, "free": resources.free, "reason": resources.reason},
        "plan": computed.plan,
        "objectives": {
            **goals.as_dict(),
            "price": objectives.price(computed.plan, summary_load(load), goals.latency_ms, service_s),
            "margin": {
                "fraction": safety.fraction,
                "percent": round(safety.fraction * 100, 1),
                "reason": safety.reason,
                "computed": computed_margin.fraction,
                "asked": margin_asked,
                "confirmed": margin_confirmed,
            },
        },
        "conservative": computed.conservative,
        "needs_calibration": computed.needs_calibration,
        "why_not_sized": computed.why_not_sized,
        "remedies": [{"id": r, "title": REMEDIES[r]} for r in remedies],
    }
    return Diagnosis(summary, remedies, computed, offer)


def summary_load(load: measurements.Load) -> dict:
    return {"peak_in_flight": load.peak_in_flight, "p50_ms": load.p50_ms}


def _traffic_against_sized(memory, load: measurements.Load, current) -> dict | None:
    """The incident's own traffic beside the request the values are sized from: its replicas'
    processing p50 against what the calibration measured for the representative request. Heavier
    than the request at the most the replicas could have held at once, or lighter than it alone,
    by more than TRAFFIC_RATIO (the verification's own), is another traffic: sized from that request, the
    values would be too small for it, or the request stands for something the traffic is not."""
    if memory is None or memory.lower_bound or not load.p50_ms:
        return None
    alone = memory.service_s(1)
    if not alone:
        return None
    cap = current.max_ongoing_requests or 1
    held = max(1, min(cap, round(load.peak_in_flight or 1)))
    crowded = memory.service_s(held) or alone
    p50 = load.p50_ms
    if p50 > measurements.TRAFFIC_RATIO * crowded * 1000:
        return {
            "heavier": True,
            "text": (
                f"The replicas processed the incident's requests in a p50 of {p50:,.0f} ms; the calibration's "
                f"representative request takes {crowded * 1000:,.0f} ms with {held} at once. The incident's requests "
                "are much heavier than the one the values are sized from, so they would be too small for them: "
                "calibrate again with a request like those (a warmup profile's, or one you give)."
            ),
        }
    if p50 * measurements.TRAFFIC_RATIO < alone * 1000:
        return {
            "heavier": False,
            "text": (
                f"The replicas processed the incident's requests in a p50 of {p50:,.0f} ms, against "
                f"{alone * 1000:,.0f} ms for the calibration's representative request alone: the traffic was "
                "lighter (cached answers or smaller requests), and the values are on the safe side for it."
            ),
        }
    return {
        "heavier": False,
        "text": (
            f"Like the sized request: the incident's processing p50 of {p50:,.0f} ms is within "
            f"{measurements.TRAFFIC_RATIO}× of the calibrated {alone * 1000:,.0f} ms alone and "
            f"{crowded * 1000:,.0f} ms with {held} at once."
        ),
    }


def _service_time(memory, load: measurements.Load) -> tuple[float | None, str]:
    """One request's service time: calibrated at concurrency 1, else the replicas' steady processing p50."""
    calibrated = memory.service_s(1) if memory is not None and not memory.lower_bound else None
    if calibrated:
        return calibrated, "calibrated"
    if load.p50_ms:
        return load.p50_ms / 1000, "the replicas' steady processing p50"
    return None, ""


def _say_where_objectives_come_from(computed: sizing.Sizing, goals: objectives.Objectives) -> None:
    """Every value sized from an objective nobody stated says so, and what it was made of."""
    for remedy in ("R1", "R2", "R10"):
        value = computed.values.get(remedy)
        if value:
            value["reasons"] = {option: f"{why} {goals.note()}" for option, why in value["reasons"].items()}


def relevant_remedies(causes: list[dict], current: sizing.Current) -> list[str]:
    """The causes' remedies in prescription order. Lowering concurrency (R1) moves requests into
    the queue and onto more replicas, so R2 and an unbounded queue's R10 come with it."""
    wanted = {r["id"] for c in causes for r in c.get("remedies", [])}
    if "R1" in wanted:
        wanted.add("R2")
        if current.max_queued_requests in (None, -1):
            wanted.add("R10")
    return [r for r in PRESCRIPTION if r in wanted]


def _finding_causes(rule_id: str, remedy: str) -> list[dict]:
    matching = [cid for cid, remedies in REMEDIES_FOR.items() if remedy and remedy in remedies]
    if not matching:
        return []
    return (
        [
            cause(cid, f"Finding {rule_id} points at remedy {remedy}, which answers this cause.", rank)
            for rank, cid in enumerate(matching[:3], start=1)
        ]
        if remedy
        else []
    )


def _kept_at_rest(memory, seen: observed.Observed | None) -> int:
    """How much more than the sized baseline the replicas were seen holding at rest (the largest such
    reading): what the allocator kept, which an in-place change leaves them holding."""
    if memory is None or seen is None or not seen.baseline_bytes:
        return 0
    return max(seen.baseline_bytes - memory.baseline_bytes, 0)


def _memory_and_budget(
    cluster,
    app,
    dep,
    incident,
    current,
    points,
    curve,
    live: capacity.Capacity,
    seen: observed.Observed | None,
    safety: margin.Margin,
):
    """Memory from the calibration, its baseline lifted to what real replicas were seen using at
    rest (in the kill message or in traffic) and its peaks priced at least at what traffic showed
    per request; a kill message or traffic alone gives only a lower bound. The budget from the
    kill (its threshold less everything else on the node), else from the nodes' memory now."""
    kill = (
        OomKillRecord.objects.filter(
            incident__cluster=cluster, incident__application_name=app, incident__deployment_name=dep
        )
        .exclude(message="")
        .order_by("-seen_at", "-id")
        .first()
    )
    listed = replica_memory(kill.message) if kill is not None else []
    floor, floor_reason = measurements.replica_floor_from_kill(listed, app, dep)
    # The least reading at rest, not the largest: after a burst at the old concurrency a replica
    # keeps what the allocator held from its peaks (4.4 GiB against 318 MiB calibrated, measured on
    # the reference app), and lifting the baseline to that sized every replica for the old peaks.
    if seen is not None and seen.rest_floor_bytes and seen.rest_floor_bytes > (floor or 0):
        floor, floor_reason = (
            seen.rest_floor_bytes,
            "the least of its replicas' readings at rest in Ray's per-process memory",
        )
    # A token-sum curve prices a request by its tokens: the deployment's own caps when it has them.
    memory = measurements.memory_from_curve(
        curve, *token_caps.request_tokens(current.user_config), replica_floor_bytes=floor, floor_reason=floor_reason
    )
    if memory is not None:
        memory = measurements.with_traffic_floor(memory, seen)
    budget = None
    nodes = max(NodeWindow.objects.filter(cluster=cluster).count(), len(live.node_memory or []), 1)
    if kill is not None:
        if memory is None:
            at_detection = (incident.evidence.get("settings_at_detection") or {}) if incident is not None else {}
            cap = at_detection.get("max_ongoing_requests") or current.max_ongoing_requests
            in_flight = _in_flight_per_replica(points, cap, at_detection.get("running_replicas") or 1)
            memory = measurements.memory_from_kill(listed, app, dep, in_flight, cap, observed=seen)
        budget = measurements.budget_from_kill(kill.used_bytes, kill.threshold_bytes, listed, app, dep, nodes, safety)
    if memory is None:
        memory = measurements.memory_from_traffic(seen)
    if budget is None and live.node_memory:
        budget = measurements.budget_from_nodes(
            [{"mem_total": n.total_bytes, "mem_used": n.total_bytes - n.available_bytes} for n in live.node_memory],
            safety,
        )
    if budget is None:
        budget = measurements.budget_from_nodes(
            [p for w in NodeWindow.objects.filter(cluster=cluster) if (p := measurements.newest_node_memory(w.points))],
            safety,
        )
    return memory, budget


def _others(cluster, app: str, dep: str) -> list[tuple[dict, int]]:
    """What every other deployment on the cluster holds: its actor options and replica count."""
    rows = (
        Deployment.objects.filter(
            application__cluster=cluster, removed_at__isnull=True, application__removed_at__isnull=True
        )
        .exclude(application__name=app, name=dep)
        .values_list("effective_config", "running_replicas", "target_replicas")
    )
    return [
        ((config or {}).get("ray_actor_options") or {}, max(running or 0, target or 0))
        for config, running, target in rows
    ]


def _measured_start_s(cluster: Cluster, app: str, dep: str) -> float | None:
    """How long the deployment's replicas took to start at its last recycle (push to verified)."""
    return (
        MaintenanceRun.objects.filter(
            deployment__application__cluster=cluster,
            deployment__application__name=app,
            deployment__name=dep,
            cold_start_s__isnull=False,
        )
        .order_by("-created_at")
        .values_list("cold_start_s", flat=True)
        .first()
    )


def _in_flight_per_replica(points: list[dict], cap: int | None, replicas: int) -> float | None:
    """The most requests a replica held at once in the recorded window: the deployment's ongoing
    requests spread over the replicas running when the incident was detected."""
    ongoing = [p["ongoing"] for p in points if p.get("ongoing")]
    if not ongoing:
        return None
    value = max(ongoing) / max(replicas, 1)
    return min(value, cap) if cap else value


def _describe_memory(memory: measurements.Memory | None) -> MemorySummary | None:
    if memory is None:
        return None
    return {
        "baseline_bytes": memory.baseline_bytes,
        "per_request_bytes": memory.per_request_bytes,
        "source": memory.source,
        "reason": memory.reason,
        "lower_bound": memory.lower_bound,
    }
