"""Memory seen in normal traffic, between calibrations: a deployment's replicas' resident memory
(Ray's `ray_component_rss_mb`, summed over the processes that carry the replica's title) next to
the requests they held at the same reading. Pure functions over a deployment's signal window.

At rest, memory over replicas is a replica's baseline; a reading is at rest only when the requests
gauges stayed at zero for an export interval after it, since they trail the memory beside them.
Busy, what the replicas hold above their baselines, spread over the most requests shown in the
busy spell around the reading (the gauge is sampled apart and can understate), is a LOWER BOUND per request;
only readings inside a busy spell count (requests in flight at the readings around them too, no
replica starting), since a burst from rest or a replaced replica outruns every gauge near it.
Admitted is not resident (a handler that allocates on its event loop holds one at a time until the
others reach their allocation), and Ray samples process memory every few seconds, so a short peak
is missed. Such a figure may lower a calibrated value that traffic has since outgrown; it never
raises concurrency or replicas."""

from __future__ import annotations

from dataclasses import dataclass

from apps.fleet.metric_readings import PROCESS_MB

MIB = 2**20
# Ray's metrics_report_interval_ms (10 s by default): the requests gauge and counter can trail the
# process memory sampled beside them by this long, so a request's memory shows up a reading before
# the request does.
EXPORT_LAG_S = 10.0


@dataclass(frozen=True)
class Observed:
    baseline_bytes: int | None  # one replica at rest: the largest such reading, so it is never understated
    per_request_bytes: int | None  # a lower bound; None without a busy reading above the baseline
    idle_readings: int
    busy_readings: int
    reason: str
    # The least reading at rest: every one holds at least a replica's baseline, and the larger ones
    # also what the allocator kept from earlier peaks, which depends on the concurrency the replica
    # ran at, not on the values being sized. None without a reading at rest.
    rest_floor_bytes: int | None = None

    def as_dict(self) -> dict:
        return {
            "baseline_bytes": self.baseline_bytes,
            "rest_floor_bytes": self.rest_floor_bytes,
            "per_request_bytes": self.per_request_bytes,
            "lower_bound": True,
            "idle_readings": self.idle_readings,
            "busy_readings": self.busy_readings,
            "reason": self.reason,
        }


def from_points(points: list[dict]) -> Observed | None:
    """The baseline and a per-request lower bound from a window's raw readings (summaries mix the
    worst of each figure from different moments, so they are left out)."""
    readings = [p for p in points if "summary" not in p]
    raw = [p for p in readings if p.get("replicas") and p.get("rss_mb")]
    measured = {id(p) for p in raw}
    if not raw:
        return None
    resting = {id(p) for p, rest in zip(readings, _at_rest(readings), strict=True) if rest}
    idle = [p["rss_mb"] * PROCESS_MB / p["replicas"] for p in raw if id(p) in resting]
    # Without a reading at rest, the least a replica was ever seen using is at least its baseline.
    baseline = max(idle) if idle else min(p["rss_mb"] * PROCESS_MB / p["replicas"] for p in raw)
    best, busy, spell_most = 0.0, 0, _spell_most(readings)
    for i, p in enumerate(readings):
        if id(p) not in measured or (held := _settled(readings, i, spell_most)) is None:
            continue
        busy += 1
        best = max(best, (p["rss_mb"] * PROCESS_MB - p["replicas"] * baseline) / held)
    per_request = int(best) if best >= MIB else None
    base_text = (
        f"{_mib(baseline)} per replica at rest (the largest of {len(idle)} reading(s) with no request in flight or "
        "served, then or for an export interval after)"
        if idle
        else f"no reading at rest; a replica was never seen below {_mib(baseline)}"
    )
    if per_request:
        text = (
            f"{base_text}; under traffic its replicas held at least {_mib(per_request)} per request admitted (the "
            f"most of {busy} reading(s) inside a busy spell). A lower bound: admitted requests are not all resident, "
            "and Ray samples process memory every few seconds."
        )
    elif busy:
        text = f"{base_text}; {busy} reading(s) inside a busy spell showed no memory above it per request."
    else:
        text = f"{base_text}; no reading inside a busy spell yet (requests in flight at it and the readings around it)."
    return Observed(
        int(baseline),
        per_request,
        len(idle),
        busy,
        f"Ray's per-process memory: {text}",
        int(min(idle)) if idle else None,
    )


def _quiet(p: dict) -> bool:
    return (p.get("ongoing") or 0) < 1 and p.get("rps") == 0


def _at_rest(readings: list[dict]) -> list[bool]:
    """Per reading: no request in flight or served at it, nor at the readings after it until one
    export interval has passed; only then can its memory not be a request's that the gauges had
    yet to show. A reading too recent to be confirmed is not at rest."""
    out, confirmed_until = [False] * len(readings), None
    # From the newest back: a quiet reading is at rest when the quiet run it starts reaches past it
    # by an export interval.
    for i in range(len(readings) - 1, -1, -1):
        if not _quiet(readings[i]):
            confirmed_until = None
            continue
        confirmed_until = readings[i]["t"] if confirmed_until is None else confirmed_until
        out[i] = confirmed_until >= readings[i]["t"] + EXPORT_LAG_S
    return out


def _spell_most(readings: list[dict]) -> list[float | None]:
    """Per reading: the most requests shown by the busy spell it belongs to (consecutive readings
    with requests in flight, on as many replicas, none starting), or None outside one."""
    out: list[float | None] = [None] * len(readings)
    start = 0
    while start < len(readings):
        end = start
        if _busy(readings[start], readings[start].get("replicas")):
            while end + 1 < len(readings) and _busy(readings[end + 1], readings[start].get("replicas")):
                end += 1
            most = max(q["ongoing"] for q in readings[start : end + 1])
            out[start : end + 1] = [most] * (end + 1 - start)
        start = end + 1
    return out


def _busy(q: dict, replicas) -> bool:
    return (q.get("ongoing") or 0.0) >= 1 and not q.get("starts") and q.get("replicas", replicas) == replicas


def _settled(readings: list[dict], i: int, spell_most: list[float | None]) -> float | None:
    """The most requests the memory at reading i may hold, if it lies inside a busy spell: the
    readings around it (the one before, the one after and all within an export interval) belong to
    its spell too. As requests start from rest the memory outruns every gauge near it (a real run
    showed more than a request's memory beside a gauge of one), and around a replica start the
    readings mix two processes' lives.

    The memory is spread over the most requests the whole spell showed, not only those near the
    reading: the gauge is sampled apart from the memory and can understate what is in flight for
    longer than an export interval (a real run with 8 clients throughout showed 3 and 4 for 15 s
    beside memory that held nearly five requests, and 'at least 574 MiB' was reported for
    requests of 500). Dividing by more only lowers a lower bound."""
    if not 0 < i < len(readings) - 1 or spell_most[i] is None:
        return None
    t = readings[i]["t"]
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(readings) and (abs(j - i) <= 1 or abs(readings[j]["t"] - t) <= EXPORT_LAG_S):
            if not _busy(readings[j], readings[i].get("replicas")):
                return None
            j += step
    return spell_most[i]


def _mib(value: float) -> str:
    return f"{value / MIB:,.0f} MiB"
