"""A scaler beside Serve's autoscaler on the deployment's own traffic, over a span of time: what each
would have cost in replica-seconds, how often each changed direction, and what clients got while
the scaler wanted more replicas than Serve ran, fewer, or the same.

Every decision records both counts: `current`, what Serve ran (its autoscaler's, for a shadow
scaler), and `target`, what the scaler wanted. Each holds until the next decision, as a count does.
The clients' figures are the deployment's metrics readings (the proxy's requests and failures),
each put in the state that held just before its end, since a reading covers the seconds up to it.
So an operator reads, before handing the scaler the count, whether the failures came while it was
asking for more."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from itertools import pairwise

from django.utils import timezone

from apps.incidents.models import SignalWindow
from apps.scaler.models import Scaler, ScalerDecision

MAX_HOURS = 24 * 7


@dataclass(frozen=True)
class Step:
    """A decision as the comparison reads it: from `t` (Unix seconds) on, Serve ran `current` and
    the scaler wanted `target`, under a memory ceiling of `ceiling` replicas (None: none known)."""

    t: float
    current: int
    target: int
    kind: str = ScalerDecision.Kind.HOLD
    ceiling: int | None = None


@dataclass
class Clients:
    seconds: float = 0.0
    requests: float = 0.0
    failed: float = 0.0

    @property
    def failed_share(self) -> float | None:
        return self.failed / self.requests if self.requests else None


@dataclass
class Comparison:
    since: float
    until: float
    decisions: int = 0
    serve_replica_seconds: float = 0.0
    scaler_replica_seconds: float = 0.0
    serve_reversals: int = 0
    scaler_reversals: int = 0
    # Seconds Serve ran more replicas than the scaler's memory ceiling let it add.
    serve_over_ceiling_s: float = 0.0
    at_ceiling: int = 0
    hand_backs: int = 0
    ahead: Clients = field(default_factory=Clients)  # the scaler wanted more replicas than Serve ran
    level: Clients = field(default_factory=Clients)
    behind: Clients = field(default_factory=Clients)  # the scaler wanted fewer

    @property
    def sides(self) -> list[tuple[str, Clients]]:
        return [("more replicas than Serve ran", self.ahead), ("the same", self.level), ("fewer", self.behind)]

    @property
    def replica_seconds_ratio(self) -> float | None:
        return self.scaler_replica_seconds / self.serve_replica_seconds if self.serve_replica_seconds else None

    def as_dict(self) -> dict:
        shown = asdict(self)
        for side in ("ahead", "level", "behind"):
            shown[side]["failed_share"] = getattr(self, side).failed_share
        shown["replica_seconds_ratio"] = self.replica_seconds_ratio
        return shown


def compare(steps: list[Step], points: list[dict], since: float, until: float) -> Comparison:
    """`steps` in time order, the first one holding at `since` (or starting after it: the time before
    it is left out); `points` the deployment's readings, each with `t` and the proxy's `http` and
    `http_errors`."""
    out = Comparison(since=since, until=until)
    held = [s for s in steps if s.t < until]
    for i, step in enumerate(held):
        start = max(step.t, since)
        end = held[i + 1].t if i + 1 < len(held) else until
        end = min(max(end, start), until)
        span = end - start
        if step.t >= since:
            out.decisions += 1
            out.at_ceiling += step.kind == ScalerDecision.Kind.AT_CEILING
            out.hand_backs += step.kind == ScalerDecision.Kind.HAND_BACK
        out.serve_replica_seconds += step.current * span
        out.scaler_replica_seconds += step.target * span
        if step.ceiling is not None and step.current > step.ceiling:
            out.serve_over_ceiling_s += span
        side = _side(out, step)
        side.seconds += span
    out.serve_reversals = reversals([s.current for s in held])
    out.scaler_reversals = reversals([s.target for s in held])
    # A day of readings against a day of decisions: found by bisection, not by a scan per reading.
    starts = [s.t for s in held]
    for point in points:
        t = point.get("t")
        if not isinstance(t, (int, float)) or not since < t <= until or not isinstance(point.get("http"), (int, float)):
            continue
        before = bisect_left(starts, t)
        if before == 0:
            continue
        state = held[before - 1]
        side = _side(out, state)
        side.requests += point["http"]
        side.failed += sum(n for n in (point.get("http_errors") or {}).values() if isinstance(n, (int, float)))
    return out


def _side(out: Comparison, step: Step) -> Clients:
    if step.target > step.current:
        return out.ahead
    return out.behind if step.target < step.current else out.level


def reversals(counts: list[int]) -> int:
    """How often a count turned from going up to going down or back; holds in between do not count."""
    directions = [1 if b > a else -1 for a, b in pairwise(counts) if b != a]
    return sum(1 for a, b in pairwise(directions) if a != b)


def for_scaler(scaler: Scaler, hours: float = 24) -> Comparison:
    """The comparison over the last `hours` (at most a week), from the decisions kept and the
    deployment's readings."""
    now = timezone.now()
    since = now - timedelta(hours=min(max(hours, 0.1), MAX_HOURS))
    rows = list(scaler.decisions.filter(at__gte=since).order_by("at", "id"))
    before = scaler.decisions.filter(at__lt=since).order_by("-at", "-id").first()
    steps = [
        Step(
            t=row.at.timestamp(),
            current=row.current,
            target=row.target,
            kind=row.kind,
            ceiling=(row.inputs or {}).get("memory_ceiling"),
        )
        for row in ([before] if before else []) + rows
    ]
    deployment = scaler.deployment
    window = SignalWindow.objects.filter(
        cluster_id=deployment.application.cluster_id,
        application_name=deployment.application.name,
        deployment_name=deployment.name,
    ).first()
    return compare(steps, window.points if window else [], since.timestamp(), now.timestamp())
