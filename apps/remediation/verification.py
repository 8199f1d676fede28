"""A wizard's verification: the same signals as the incident, watched under live traffic for a
window after the fix, compared with before; then the outcome on the incident."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

from django.db import transaction
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.core.catalogue import REMEDIES, REMEDIES_FOR
from apps.fleet import metric_readings
from apps.incidents import actions as incidents
from apps.incidents.models import Incident, IncidentEvent, OomKillRecord, SignalWindow
from apps.remediation import measurements
from apps.remediation.models import Wizard, WizardStep
from apps.remediation.wizards import WizardError, changing

Status = WizardStep.Status
LOOKBACK = timedelta(minutes=15)
DONE = (Status.APPLIED, Status.DONE, Status.PASSED)
LATENCY_KINDS = (Incident.Kind.LATENCY_SPIKE, Incident.Kind.QUEUE_BUILDUP)
MIN_WINDOW_S, MAX_WINDOW_S = 30, 24 * 3600
ROUNDING_S = 0.2  # readings store their time and interval to a tenth of a second each
FAILURE_OBJECTIVE = Wizard._meta.get_field("failure_objective").default
LATENCY_OBJECTIVE_MS = Wizard._meta.get_field("latency_objective_ms").default


class WindowFigures(TypedDict):
    """What clients (`client_*`, `goodput_rps`: the proxy; None without proxy series) and the
    replicas (the rest) saw in a window's readings."""

    points: int
    p50_ms: float | None
    p99_ms: float | None
    errors: float
    error_rate: float | None
    queued_max: float | None
    ongoing_max: float | None
    rps_mean: float | None
    replica_requests: float
    client_requests: float | None
    client_failed: float | None
    client_failed_by_code: dict[str, float] | None
    client_failed_share: float | None
    goodput_rps: float | None
    client_p50_ms: float | None
    client_p99_ms: float | None
    client_p99_between_ms: list[float | None] | None  # the proxy's bucket the p99 fell in


class Window(WindowFigures):
    """A wizard's before or after: the figures, the OOM kills, and whether they met the objectives."""

    since: str
    until: str
    oom_kills: int
    healthy: NotRequired[bool | None]  # None: no metrics, only kills counted
    why: NotRequired[str]


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    RUNNING = "running"


def start(actor: Actor, wizard: Wizard, *, window_s: int | None = None, revision: int | None) -> Wizard:
    window_s = window_s or wizard.verification_window_s
    if not MIN_WINDOW_S <= window_s <= MAX_WINDOW_S:
        raise WizardError(f"The verification window must be between {MIN_WINDOW_S} s and {MAX_WINDOW_S // 3600} h.")
    with changing(wizard, actor, revision) as wizard:
        if wizard.state != Wizard.State.OPEN:
            raise WizardError("Verification is already running.")
        steps = WizardStep.objects.filter(wizard=wizard)
        if steps.filter(status=Status.APPLYING).exists():
            raise WizardError("A change of this wizard is still being applied: verify once it has finished.")
        if (
            not steps.filter(status__in=DONE)
            # A shadow scaler changes nothing live: there is nothing of it to verify.
            .exclude(kind__in=[WizardStep.Kind.DIAGNOSIS, WizardStep.Kind.CALIBRATION, WizardStep.Kind.SCALER])
            .exists()
        ):
            raise WizardError("No remedy is applied or confirmed yet: there is nothing to verify.")
        now = timezone.now()
        wizard.before = measure(wizard, _before_start(wizard), _first_change_at(wizard) or now)
        wizard.after = {}
        wizard.state, wizard.verification_window_s = Wizard.State.VERIFYING, window_s
        wizard.verify_started_at, wizard.verify_ends_at = now, now + timedelta(seconds=window_s)
        wizard.save(
            update_fields=["before", "after", "state", "verification_window_s", "verify_started_at", "verify_ends_at"]
        )
        steps.filter(kind=WizardStep.Kind.VERIFICATION).update(status=Status.PENDING, check_result={})
        record(actor, "wizard.verify", wizard, team=wizard.cluster.team, changes={"window_s": window_s})
    return wizard


def _before_start(wizard: Wizard) -> datetime:
    anchor = wizard.incident.started_at if wizard.incident is not None else wizard.created_at
    return anchor - LOOKBACK


def _first_change_at(wizard: Wizard) -> datetime | None:
    step = (
        WizardStep.objects.filter(wizard=wizard, change__isnull=False, change__started_at__isnull=False)
        .order_by("change__started_at")
        .select_related("change")
        .first()
    )
    return step.change.started_at if step is not None and step.change is not None else None


def measure(wizard: Wizard, since: datetime, until: datetime) -> Window:
    """OOM kills Fleetdeck recorded, and the deployment's signal points, between two instants;
    with whether the window was healthy against the wizard's objectives, and why not."""
    kills = OomKillRecord.objects.filter(
        incident__cluster=wizard.cluster,
        incident__application_name=wizard.application_name,
        incident__deployment_name=wizard.deployment_name,
        seen_at__gte=since,
        seen_at__lt=until,
    ).count()
    window = SignalWindow.objects.filter(
        cluster=wizard.cluster, application_name=wizard.application_name, deployment_name=wizard.deployment_name
    ).first()
    points = [p for p in (window.points if window else []) if _within(p, since.timestamp(), until.timestamp())]
    out: Window = {"since": since.isoformat(), "until": until.isoformat(), "oom_kills": kills, **summarize(points)}
    failing = problems(
        out, failure_objective=wizard.failure_objective, latency_objective_ms=wizard.latency_objective_ms
    )
    if failing:
        out["healthy"], out["why"] = False, " ".join(failing)
    elif not points:
        out["healthy"] = None
        out["why"] = "No metrics in the window: only OOM kills were counted, and there were none."
    else:
        out["healthy"] = True
        out["why"] = (
            f"Clients: {_client_line(out)}."
            if out["client_requests"] is not None
            else f"Replicas: {_replica_line(out)}."
        )
    return out


def _within(point: dict, since: float, until: float) -> bool:
    """Whether a reading's whole interval lies in the window. A reading stands for the `seconds`
    since the one before it: the first reading after a fix often began before it, and counting it
    put the old failures (the kill's 500s) in the fix's window, or a quiet spell in a failing one."""
    start = point["t"] - (point.get("seconds") or 0)
    return since - ROUNDING_S <= start and point["t"] < until


def summarize(points: list[dict]) -> WindowFigures:
    """Client side (the proxy's counts and end-to-end latency, `client_*` and `goodput_rps`;
    None where the cluster exports no proxy series) and replica side (the rest), kept apart."""

    def values(key, among=points):
        return [p[key] for p in among if isinstance(p.get(key), (int, float))]

    rps, p50, errors = values("rps"), values("p50"), values("errors")
    requests = _requests(points)
    served = [p for p in points if isinstance(p.get("http"), (int, float))]
    failed_by_code: dict[str, float] = {}
    for p in served:
        for code, n in (p.get("http_errors") or {}).items():
            if metric_readings.is_failure(code) and n:
                failed_by_code[code] = failed_by_code.get(code, 0) + n
    answered, failed = sum(values("http", served)), sum(failed_by_code.values())
    seconds, client_p50 = sum(values("seconds", served)), values("http_p50", served)
    slowest = max(
        (p for p in served if isinstance(p.get("http_p99"), (int, float))), key=lambda p: p["http_p99"], default=None
    )
    return {
        "points": len(points),
        "p50_ms": round(statistics.median(p50), 1) if p50 else None,
        "p99_ms": max(values("p99"), default=None),
        "errors": sum(errors),
        "error_rate": round(sum(errors) / requests, 4) if requests else None,
        "queued_max": max(values("queued"), default=None),
        "ongoing_max": max(values("ongoing"), default=None),
        "rps_mean": round(statistics.mean(rps), 3) if rps else None,
        "replica_requests": round(requests, 1),
        "client_requests": round(answered, 1) if served else None,
        "client_failed": round(failed, 1) if served else None,
        "client_failed_by_code": dict(sorted(failed_by_code.items(), key=lambda kv: -kv[1])) if served else None,
        "client_failed_share": round(failed / answered, 4) if answered else None,
        "goodput_rps": round((answered - failed) / seconds, 3) if seconds else None,
        "client_p50_ms": round(statistics.median(client_p50), 1) if client_p50 else None,
        "client_p99_ms": slowest["http_p99"] if slowest else None,
        "client_p99_between_ms": slowest.get("http_p99_between") if slowest else None,
    }


def _requests(points: list[dict]) -> float:
    """Requests served across the points: each point's rate times the interval it stands for (its
    `seconds`; for points stored before they carried it, the time since the one before)."""
    total = 0.0
    for i, point in enumerate(points):
        seconds = point.get("seconds") or (max(point["t"] - points[i - 1]["t"], 0) if i else 0)
        total += (point.get("rps") or 0) * seconds
    return total


def problems(summary: Mapping[str, Any], *, failure_objective: float, latency_objective_ms: float) -> list[str]:
    """Why a window is failing, one sentence per figure, with its numbers: OOM kills, client
    requests failed or too slow against the objectives, requests admitted that never completed."""
    out = []
    if summary.get("oom_kills"):
        out.append(f"{summary['oom_kills']} OOM kill(s).")
    clients = summary.get("client_requests")
    share = summary.get("client_failed_share")
    if share is not None and share > failure_objective:
        out.append(
            f"Clients: {_n(summary['client_failed'])} of {_n(summary['client_requests'])} requests failed "
            f"({_pct(share)}; {_codes(summary)}), above the {_objective(failure_objective)} objective."
        )
    p99 = summary.get("client_p99_ms")
    spans = False
    if p99 is not None:
        low, high = summary.get("client_p99_between_ms") or (p99, p99)
        spans = low < latency_objective_ms and (high is None or high > latency_objective_ms)
    if p99 is not None and p99 > latency_objective_ms and not spans:
        out.append(f"Clients: p99 {_latency(summary)} end to end, above the {latency_objective_ms:.0f} ms objective.")
    elif spans:
        # An interpolated p99 inside a bucket that spans the objective proves nothing either way:
        # between 10 and 60 s it could be 11 s or 59 s.
        out.append(
            f"Clients: p99 {_latency(summary)} end to end: the proxy's histogram bucket spans the "
            f"{latency_objective_ms:.0f} ms objective, so it cannot be shown to be met. Give the proxy a bucket "
            "boundary at the objective (RAY_SERVE_REQUEST_LATENCY_BUCKETS_MS on the cluster) or set the objective at "
            "one of its boundaries."
        )
    admitted, completed = summary.get("ongoing_max") or 0, summary.get("rps_mean")
    if clients == 0 and (completed or admitted):
        out.append(
            f"Clients: no request completed at the proxy while replicas had work "
            f"({_n(summary.get('replica_requests') or 0)} served, up to {_n(admitted)} in flight)."
        )
    if not completed and admitted:
        out.append(f"Replicas: up to {_n(admitted)} request(s) in flight and none completed.")
    rate = summary.get("error_rate")
    if clients is None and rate is not None and rate > failure_objective:
        out.append(
            f"Replicas: {_n(summary['errors'])} errors, {_pct(rate)} of requests, above the "
            f"{_objective(failure_objective)} objective."
        )
    return out


def _latency(summary: Mapping[str, Any]) -> str:
    """The client p99, with the histogram bucket it lies in where that bucket is wide."""
    p99 = summary["client_p99_ms"]
    low, high = summary.get("client_p99_between_ms") or (p99, p99)
    if high is None:
        return f"above {low:.0f} ms (the proxy's last bucket)"
    if high > 2 * max(low, 1):
        return f"{p99:.0f} ms interpolated, between {low:.0f} and {high:.0f} ms (the proxy's histogram bucket)"
    return f"{p99:.0f} ms"


def _n(value: float) -> str:
    return f"{value:.0f}"


def _pct(share: float) -> str:
    return f"{share * 100:.1f} %"


def _objective(share: float) -> str:
    return f"{share * 100:g} %"


def _codes(summary: Mapping[str, Any]) -> str:
    return (
        ", ".join(f"{code} ×{_n(n)}" for code, n in (summary.get("client_failed_by_code") or {}).items()) or "no code"
    )


def _client_line(s: Mapping[str, Any]) -> str:
    failed = (
        f"{_n(s['client_failed'])} failed ({_pct(s['client_failed_share'])}; {_codes(s)})"
        if s.get("client_failed")
        else "none failed"
    )
    parts = [f"{_n(s['client_requests'])} requests, {failed}"]
    if s.get("goodput_rps") is not None:
        parts.append(f"goodput {s['goodput_rps']:.2f} req/s")
    if s.get("client_p99_ms") is not None:
        parts.append(f"p50 {s['client_p50_ms'] or 0:.0f} ms, p99 {_latency(s)} end to end")
    return "; ".join(parts)


def _replica_line(s: Mapping[str, Any]) -> str:
    parts = [f"{_n(s.get('replica_requests') or 0)} requests, {_n(s.get('errors') or 0)} errors"]
    if s.get("p99_ms") is not None:
        parts.append(f"processing p99 {s['p99_ms']:.0f} ms")
    if s.get("queued_max") is not None:
        parts.append(f"queue peak {s['queued_max']:.0f}")
    return "; ".join(parts)


def _side(who: str, line, after: Mapping[str, Any], before: Mapping[str, Any], present: str) -> str:
    was = f" (before the fix: {line(before)})" if before.get("points") and before.get(present) is not None else ""
    return f"{who}: {line(after)}{was}."


def verdict(
    kind: str,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    *,
    window_over: bool,
    failure_objective: float = FAILURE_OBJECTIVE,
    latency_objective_ms: float = LATENCY_OBJECTIVE_MS,
    metrics_expected: bool = False,
    sized_service_s: float | None = None,
) -> tuple[Verdict, str]:
    """(verdict, why). An OOM kill fails at once; the rest is judged when the window is over, by
    what clients saw at the proxy first. A window whose requests were processed far faster or
    slower than the request the values were sized for (`sized_service_s`) cannot pass: it did not
    test the fix."""
    if after["oom_kills"]:
        return (
            Verdict.FAILED,
            f"{after['oom_kills']} OOM kill(s) during verification (before: {before.get('oom_kills', 0)}).",
        )
    if not window_over:
        return Verdict.RUNNING, "No OOM kill so far."
    lines = [f"No OOM kill in the window (before: {before.get('oom_kills', 0)})."]
    if not after["points"] and metrics_expected:
        # The cluster has a metrics source, so no reading means no evidence, not a clean window.
        lines.append(
            "No metrics reading lies wholly inside the window: the cluster's metrics did not answer, or the "
            "window is shorter than the time between readings. Start it again with a longer window."
        )
        return Verdict.INCONCLUSIVE, " ".join(lines)
    if not after["points"]:
        lines.append(
            "Latency, errors and queues were not compared: the cluster reports no metrics (set its metrics URL)."
        )
        return (Verdict.PASSED if kind not in LATENCY_KINDS else Verdict.INCONCLUSIVE), " ".join(lines)
    clients = after.get("client_requests") is not None
    if clients:
        lines.append(_side("Clients", _client_line, after, before, "client_requests"))
    else:
        lines.append("The cluster exports no proxy counters for this application: what clients saw is unknown.")
    lines.append(_side("Replicas", _replica_line, after, before, "replica_requests"))
    failing = problems(after, failure_objective=failure_objective, latency_objective_ms=latency_objective_ms)
    if failing:
        return Verdict.FAILED, " ".join(failing + lines)
    if not after["rps_mean"] and not after.get("client_requests"):
        return (
            Verdict.INCONCLUSIVE,
            "No traffic reached the deployment during the window: verification needs live traffic. Start it again.",
        )
    side = "client_p99_ms" if before.get("client_p99_ms") and after.get("client_p99_ms") else "p99_ms"
    before_p99, after_p99 = before.get(side), after.get(side)
    if kind in LATENCY_KINDS and before_p99 and after_p99 and after_p99 > 0.8 * before_p99:
        return Verdict.FAILED, " ".join(
            [*lines, f"p99 {before_p99:.0f} ms → {after_p99:.0f} ms did not come down by at least 20 %."]
        )
    if kind in LATENCY_KINDS and not clients:
        return Verdict.INCONCLUSIVE, " ".join(
            [
                *lines,
                "A latency fix is judged by the latency clients see, queueing included; "
                "replica processing time alone cannot pass it. Export the Serve proxy's metrics.",
            ]
        )
    if unlike := unlike_sized(after, sized_service_s):
        return Verdict.INCONCLUSIVE, " ".join([*lines, unlike])
    return Verdict.PASSED, " ".join(lines)


def unlike_sized(after: Mapping[str, Any], sized_service_s: float | None) -> str | None:
    """Why the window's traffic is not the traffic the values were sized for, or None."""
    p50 = after.get("p50_ms")
    if not p50 or not sized_service_s:
        return None
    sized_ms = sized_service_s * 1000
    if p50 * measurements.TRAFFIC_RATIO < sized_ms:
        return (
            f"The replicas processed requests in a p50 of {p50:,.0f} ms against the {sized_ms:,.0f} ms the calibration "
            "measured for the request the values were sized for: cached answers or much smaller requests. The fix is "
            "not verified until traffic resembling that request has been seen: send varied requests and verify again."
        )
    if p50 > measurements.TRAFFIC_RATIO * sized_ms:
        return (
            f"The replicas processed requests in a p50 of {p50:,.0f} ms against the {sized_ms:,.0f} ms the calibration "
            "measured for the request the values were sized for: the traffic is much heavier than that request, so "
            "the memory it was sized with does not hold for it. Calibrate with a representative request like this "
            "traffic and verify again."
        )
    return None


def evaluate(wizard_id: int, now: datetime | None = None) -> Verdict | None:
    """Called by the beat tick and on demand: fail early on a kill, conclude when the window is over."""
    now = now or timezone.now()
    with transaction.atomic():
        wizard = Wizard.objects.select_for_update().filter(pk=wizard_id, state=Wizard.State.VERIFYING).first()
        if wizard is None:
            return None
        started, ends = wizard.verify_started_at, wizard.verify_ends_at
        assert started is not None and ends is not None  # verify() sets both as it enters VERIFYING
        until = min(now, ends)
        wizard.after = measure(wizard, started, until)
        kind = wizard.incident.kind if wizard.incident is not None else ""
        result, why = verdict(
            kind,
            wizard.before,
            wizard.after,
            window_over=now >= ends,
            failure_objective=wizard.failure_objective,
            latency_objective_ms=wizard.latency_objective_ms,
            metrics_expected=wizard.cluster.has_metrics_source,
            sized_service_s=((wizard.diagnosis or {}).get("plan") or {}).get("service_s"),
        )
        step = WizardStep.objects.get(wizard=wizard, kind=WizardStep.Kind.VERIFICATION)
        step.check_result = {"result": result, "why": why, "at": now.isoformat()}
        if result == Verdict.RUNNING:
            step.save(update_fields=["check_result", "updated_at"])
            wizard.save(update_fields=["after", "updated_at"])
            return result
        step.status = {Verdict.PASSED: Status.PASSED, Verdict.FAILED: Status.CHECK_FAILED}.get(result, Status.PENDING)
        step.save(update_fields=["check_result", "status", "updated_at"])
        if result == Verdict.INCONCLUSIVE:
            wizard.state = Wizard.State.OPEN
            wizard.revision += 1
            wizard.save(update_fields=["after", "state", "revision", "updated_at"])
            return result
        _conclude(wizard, result == Verdict.PASSED, why, now)
    return result


def _conclude(wizard: Wizard, resolved: bool, why: str, now: datetime) -> None:
    changes = sorted(
        {
            s.change_id
            for s in WizardStep.objects.filter(wizard=wizard, status=Status.APPLIED, change__isnull=False)
            if s.change_id is not None  # what the query asked: mypy cannot see it
        }
    )
    linked = ", ".join(f"#{pk}" for pk in changes) or "none"
    wizard.state = Wizard.State.RESOLVED if resolved else Wizard.State.NOT_RESOLVED
    wizard.finished_at = now
    wizard.next_steps = [] if resolved else next_steps(wizard)
    wizard.outcome = why
    wizard.revision += 1
    wizard.save(update_fields=["after", "state", "finished_at", "next_steps", "outcome", "revision", "updated_at"])
    WizardStep.objects.filter(wizard=wizard, kind=WizardStep.Kind.OUTCOME).update(
        status=Status.DONE, check_result={"resolved": resolved, "changes": changes}
    )
    incident = wizard.incident
    if incident is None:
        return
    if resolved:
        message = f"Verified by wizard #{wizard.pk} over {wizard.verification_window_s} s with changes {linked}: {why}"
        if incident.is_open:
            incidents.set_status(Actor.system(), incident, Incident.Status.RESOLVED)
        IncidentEvent.objects.create(incident=incident, kind=IncidentEvent.Kind.NOTE, message=message)
    else:
        tried = "; ".join(f"{n['id']}: {n['title']}" for n in wizard.next_steps) or "reopen the diagnosis"
        IncidentEvent.objects.create(
            incident=incident,
            kind=IncidentEvent.Kind.NOTE,
            message=f"Wizard #{wizard.pk} did not fix it (changes {linked}): {why} Next: {tried}.",
        )


def next_steps(wizard: Wizard) -> list[dict]:
    """What is left to try: remedies skipped or not done, then the causes' remedies no step covered."""
    steps = list(WizardStep.objects.filter(wizard=wizard, kind__in=[WizardStep.Kind.CONFIG, WizardStep.Kind.CHECKLIST]))
    covered = {s.remedy for s in steps}
    out = [
        {
            "id": s.remedy,
            "title": REMEDIES[s.remedy],
            "why": f"Step {s.position + 1} is {s.get_status_display().lower()}.",
        }
        for s in steps
        if s.status not in DONE and s.status != Status.NOT_APPLICABLE
    ]
    for cause in wizard.diagnosis.get("causes", []):
        for remedy in REMEDIES_FOR.get(cause["id"], []):
            if remedy not in covered:
                covered.add(remedy)
                out.append(
                    {
                        "id": remedy,
                        "title": REMEDIES[remedy],
                        "why": f"Suspected cause {cause['id']} was not addressed.",
                    }
                )
    if wizard.diagnosis.get("conservative"):
        out.append(
            {
                "id": "calibrate",
                "title": "Calibrate the deployment's memory",
                "why": "The values were conservative defaults: a calibration measures what fits.",
            }
        )
    return out


def due() -> list[int]:
    return list(Wizard.objects.filter(state=Wizard.State.VERIFYING).values_list("pk", flat=True))


def evaluate_due() -> None:
    for wizard_id in due():
        evaluate(wizard_id)
