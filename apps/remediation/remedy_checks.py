"""Automatic verification of code-level remedies, where one is possible: each check returns
passed / failed / inconclusive with what it saw. An operator confirms the rest by hand."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from apps.accounts.audit import Actor, record
from apps.incidents.models import Incident, SignalWindow
from apps.maintenance.models import RecycleSchedule
from apps.remediation.findings import cold_start_ratio
from apps.remediation.models import Wizard, WizardStep
from apps.remediation.verification import Verdict
from apps.remediation.wizards import WizardError, changing, lock, step_at
from integrations import serve_http

Status = WizardStep.Status
COLD_START_FACTOR = 3.0
# Below 1 a cold start would have to beat steady state; the warmup-missing finding (rules.py) flags
# 5 and more, so a larger factor would pass the very cold starts it flags.
MIN_COLD_START_FACTOR, MAX_COLD_START_FACTOR = 1.0, 5.0
MAX_PROBE_CHARS = 10_000_000
# The probe runs inside the operator's web request, which gunicorn ends after 60 s (deploy/docker/Dockerfile).
# httpx waits up to the timeout for each connect, send and read: at 30 s a replica the input hung (a quick
# connect, then one long read) still answers inside that. Under a second, a slow network would read as a replica
# the input exhausted.
MIN_PROBE_TIMEOUT_S, MAX_PROBE_TIMEOUT_S = 1.0, 30.0
PROBE_TIMEOUT_S = MAX_PROBE_TIMEOUT_S
REFUSALS = {400, 413, 414, 422, 429, 431}


@dataclass(frozen=True)
class CheckResult:
    result: Verdict  # never RUNNING: a check answers at once
    why: str
    data: dict


def run(actor: Actor, wizard: Wizard, position: int, *, params: dict | None = None, revision: int | None) -> WizardStep:
    step = step_at(wizard, position)
    check = CHECKS.get(step.remedy)
    if step.kind != WizardStep.Kind.CHECKLIST or check is None:
        raise WizardError(
            f"{step.remedy or 'This step'} has no automatic check: confirm it by hand once it is in place."
        )
    if revision is not None and revision != wizard.revision:
        lock(wizard, revision)  # raises the conflict with who moved it
    # Outside the lock: a probe may take seconds and must not block other operators' reads.
    outcome = check(wizard, params or {})
    with changing(wizard, actor, revision) as wizard:
        step = step_at(wizard, position)
        step.check_result = {"result": outcome.result, "why": outcome.why, **outcome.data, "at": time.time()}
        step.status = {Verdict.PASSED: Status.PASSED, Verdict.FAILED: Status.CHECK_FAILED}.get(
            outcome.result, step.status
        )
        step.updated_by = actor.user
        step.save(update_fields=["check_result", "status", "updated_by", "updated_at"])
        record(
            actor,
            "wizard.check",
            wizard,
            team=wizard.cluster.team,
            changes={"step": position, "result": outcome.result},
        )
    return step


def oversized_input(wizard: Wizard, params: dict) -> CheckResult:
    """R3: a request far beyond any sane input must be refused with a 4xx, not served or crashed on."""
    app = wizard.deployment.application if wizard.deployment_id else None
    base = wizard.cluster.serve_endpoint
    if not base:
        return CheckResult(Verdict.INCONCLUSIVE, "The cluster has no Serve HTTP address to send the probe to.", {})
    method = str(params.get("method") or "POST").upper()
    if method not in ("GET", "POST"):
        raise WizardError("The probe method must be GET or POST.")
    try:
        size = int(params.get("size") or 100_000)
    except (TypeError, ValueError) as exc:
        raise WizardError("The probe size must be a whole number of characters.") from exc
    if not 1 <= size <= MAX_PROBE_CHARS:
        raise WizardError(f"The probe size must be between 1 and {MAX_PROBE_CHARS:,} characters.")
    timeout_s = _number(
        params, "timeout_s", PROBE_TIMEOUT_S, MIN_PROBE_TIMEOUT_S, MAX_PROBE_TIMEOUT_S, "a number of seconds"
    )
    field = str(params.get("field") or "prompt")
    path = str(params.get("path") or (app.route_prefix if app and app.route_prefix else "/"))
    if not path.startswith("/"):
        raise WizardError("The probe path starts with '/', e.g. the application's route prefix.")
    text = "x" * size
    body = {field: text} if method == "POST" else None
    if method == "GET":
        path = f"{path}?{urlencode({field: text})}"
    sample = serve_http.send(
        base,
        method=method,
        path=path,
        headers={},
        body=body,
        requests=1,
        concurrency=1,
        timeout_s=timeout_s,
    )[0]
    data = {"status": sample.status, "latency_ms": round(sample.latency_ms, 1), "size": size, "method": method}
    if sample.status is None:
        return CheckResult(
            Verdict.FAILED,
            f"No answer to a {size:,}-character input ({sample.error}): it may have exhausted the replica.",
            data,
        )
    if sample.status in REFUSALS:
        return CheckResult(
            Verdict.PASSED,
            f"A {size:,}-character input was refused with {sample.status} in {sample.latency_ms:.0f} ms.",
            data,
        )
    if sample.status in (401, 403, 404, 405):
        return CheckResult(
            Verdict.INCONCLUSIVE,
            f"Got {sample.status}: the probe did not reach the handler. Check the path, method and field.",
            data,
        )
    if sample.status >= 500:
        return CheckResult(
            Verdict.FAILED,
            f"A {size:,}-character input made the application fail with {sample.status} instead of a 4xx.",
            data,
        )
    return CheckResult(
        Verdict.FAILED, f"A {size:,}-character input was accepted with {sample.status}: nothing caps input size.", data
    )


def _number(params: dict, name: str, default: float, low: float, high: float, what: str) -> float:
    """`params[name]`, a number or its text (the pages post text), within [low, high]; `default` when
    it is absent. Anything else, NaN and infinity included, is refused before anything is sent."""
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not low <= number <= high:  # NaN fails every comparison
        raise WizardError(f"{name} must be {what} between {low:g} and {high:g}.")
    return number


def cold_start(wizard: Wizard, params: dict) -> CheckResult:
    """R6: right after replicas start, p99 must stay within k × the steady p50."""
    factor = _number(params, "factor", COLD_START_FACTOR, MIN_COLD_START_FACTOR, MAX_COLD_START_FACTOR, "a number")
    window = SignalWindow.objects.filter(
        cluster=wizard.cluster, application_name=wizard.application_name, deployment_name=wizard.deployment_name
    ).first()
    points = [p for p in (window.points if window else []) if p["t"] >= time.time() - 3600]
    started, ratio = cold_start_ratio(points)
    if not started:
        return CheckResult(
            Verdict.INCONCLUSIVE,
            "No replica started in the last hour: recycle one (Maintenance) under traffic, then check again.",
            {},
        )
    if ratio is None:
        return CheckResult(
            Verdict.INCONCLUSIVE,
            "Replicas started, but there was no steady traffic to compare their first requests with.",
            {},
        )
    data = {"ratio": round(ratio, 2), "factor": factor}
    if ratio <= factor:
        return CheckResult(
            Verdict.PASSED, f"After replica starts, p99 was {ratio:.1f} × the steady p50 (limit {factor:g} ×).", data
        )
    return CheckResult(
        Verdict.FAILED,
        f"After replica starts, p99 was {ratio:.1f} × the steady p50 (limit {factor:g} ×): still a cold start.",
        data,
    )


def recycle_scheduled(wizard: Wizard, params: dict) -> CheckResult:
    """R8: an enabled rolling recycle schedule for the deployment."""
    schedule = RecycleSchedule.objects.filter(deployment_id=wizard.deployment_id, enabled=True).first()
    if schedule is None:
        return CheckResult(
            Verdict.FAILED, "No enabled recycle schedule for this deployment yet (Maintenance → Schedule).", {}
        )
    return CheckResult(
        Verdict.PASSED, f"Recycled {_cadence(schedule)}; next at {schedule.next_run_at:%Y-%m-%d %H:%M %Z}.", {}
    )


def headroom(wizard: Wizard, params: dict) -> CheckResult:
    """R9: at least two replicas, so a rolling update never empties the deployment."""
    deployment = wizard.deployment
    if deployment is None:
        return CheckResult(Verdict.INCONCLUSIVE, "The deployment is no longer in the inventory.", {})
    minimum = (
        deployment.autoscaling_min_replicas
        if deployment.autoscaling
        else deployment.effective_config.get("num_replicas")
    )
    if isinstance(minimum, int) and minimum >= 2:
        return CheckResult(
            Verdict.PASSED,
            f"At least {minimum} replicas: a rolling update keeps one serving.",
            {"min_replicas": minimum},
        )
    return CheckResult(
        Verdict.FAILED,
        f"Minimum replicas is {minimum}: an update or recycle leaves none serving for a few seconds.",
        {"min_replicas": minimum},
    )


def bounded_caches(wizard: Wizard, params: dict) -> CheckResult:
    """R7, as far as it shows from outside: no memory ratchet on the cluster since the wizard began."""
    ratchet = Incident.objects.filter(
        cluster=wizard.cluster, kind=Incident.Kind.MEMORY_RATCHET, last_signal_at__gte=wizard.created_at
    ).first()
    if ratchet is not None:
        return CheckResult(
            Verdict.FAILED,
            f"Memory still ratchets up (incident #{ratchet.pk}): a cache or allocator keeps growing.",
            {},
        )
    return CheckResult(
        Verdict.PASSED,
        "No memory ratchet on the cluster since this wizard began. Confirm the code bounds every cache too.",
        {},
    )


def _cadence(schedule: RecycleSchedule) -> str:
    return f"every {schedule.every_hours} h" if schedule.every_hours else f"on cron '{schedule.cron}'"


CHECKS = {"R3": oversized_input, "R6": cold_start, "R7": bounded_caches, "R8": recycle_scheduled, "R9": headroom}
