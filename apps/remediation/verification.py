"""A wizard's verification: the same signals as the incident, watched under live traffic for a
window after the fix, compared with before; then the outcome on the incident."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.incidents import services as incidents
from apps.incidents.models import Incident, IncidentEvent, OomKillRecord, SignalWindow
from apps.remediation.catalogue import REMEDIES, REMEDIES_FOR
from apps.remediation.models import Wizard, WizardStep
from apps.remediation.wizards import WizardError, _bump, _locked

Status = WizardStep.Status
LOOKBACK = timedelta(minutes=15)
DONE = (Status.APPLIED, Status.DONE, Status.PASSED)
LATENCY_KINDS = (Incident.Kind.LATENCY_SPIKE, Incident.Kind.QUEUE_BUILDUP)
MIN_WINDOW_S, MAX_WINDOW_S = 30, 24 * 3600


def start(actor: Actor, wizard: Wizard, *, window_s: int | None = None, revision: int | None) -> Wizard:
    window_s = window_s or wizard.verification_window_s
    if not MIN_WINDOW_S <= window_s <= MAX_WINDOW_S:
        raise WizardError(f"The verification window must be between {MIN_WINDOW_S} s and {MAX_WINDOW_S // 3600} h.")
    with transaction.atomic():
        wizard = _locked(wizard, revision)
        if wizard.state != Wizard.State.OPEN:
            raise WizardError("Verification is already running.")
        steps = WizardStep.objects.filter(wizard=wizard)
        if steps.filter(status=Status.APPLYING).exists():
            raise WizardError("A change of this wizard is still being applied: verify once it has finished.")
        if not steps.filter(status__in=DONE).exclude(kind=WizardStep.Kind.DIAGNOSIS).exists():
            raise WizardError("No remedy is applied or confirmed yet: there is nothing to verify.")
        now = timezone.now()
        wizard.before = measure(wizard, _before_start(wizard), _first_change_at(wizard) or now)
        wizard.after = {}
        wizard.state, wizard.verification_window_s = Wizard.State.VERIFYING, window_s
        wizard.verify_started_at, wizard.verify_ends_at = now, now + timedelta(seconds=window_s)
        wizard.save(update_fields=["before", "after", "state", "verification_window_s", "verify_started_at", "verify_ends_at"])
        steps.filter(kind=WizardStep.Kind.VERIFICATION).update(status=Status.PENDING, check_result={})
        _bump(wizard, actor)
        record(actor, "wizard.verify", wizard, team=wizard.cluster.team, changes={"window_s": window_s})
    return wizard


def _before_start(wizard: Wizard) -> datetime:
    anchor = wizard.incident.started_at if wizard.incident_id else wizard.created_at
    return anchor - LOOKBACK


def _first_change_at(wizard: Wizard) -> datetime | None:
    step = (WizardStep.objects.filter(wizard=wizard, change__isnull=False, change__started_at__isnull=False)
            .order_by("change__started_at").select_related("change").first())
    return step.change.started_at if step else None


def measure(wizard: Wizard, since: datetime, until: datetime) -> dict:
    """OOM kills Fleetdeck recorded, and the deployment's signal points, between two instants."""
    kills = OomKillRecord.objects.filter(incident__cluster=wizard.cluster, incident__application_name=wizard.application_name,
                                         incident__deployment_name=wizard.deployment_name, seen_at__gte=since, seen_at__lt=until).count()
    window = SignalWindow.objects.filter(cluster=wizard.cluster, application_name=wizard.application_name,
                                         deployment_name=wizard.deployment_name).first()
    points = [p for p in (window.points if window else []) if since.timestamp() <= p["t"] < until.timestamp()]
    return {"since": since.isoformat(), "until": until.isoformat(), "oom_kills": kills, **summarize(points)}


def summarize(points: list[dict]) -> dict:
    def values(key):
        return [p[key] for p in points if isinstance(p.get(key), (int, float))]

    rps, p50, errors = values("rps"), values("p50"), values("errors")
    requests = _requests(points)
    return {
        "points": len(points),
        "p50_ms": round(statistics.median(p50), 1) if p50 else None,
        "p99_ms": max(values("p99"), default=None),
        "errors": sum(errors),
        "error_rate": round(sum(errors) / requests, 4) if requests else None,
        "queued_max": max(values("queued"), default=None),
        "rps_mean": round(statistics.mean(rps), 3) if rps else None,
    }


def _requests(points: list[dict]) -> float:
    """Requests served across the points: each point's rate times the time since the one before."""
    total = 0.0
    for before, point in zip(points, points[1:]):
        if point.get("rps"):
            total += point["rps"] * max(point["t"] - before["t"], 0)
    return total


def verdict(kind: str, before: dict, after: dict, *, window_over: bool) -> tuple[str, str]:
    """("passed" | "failed" | "inconclusive" | "running", why). An OOM kill fails at once; the
    rest is judged when the window is over."""
    if after["oom_kills"]:
        return "failed", f"{after['oom_kills']} OOM kill(s) during verification (before: {before.get('oom_kills', 0)})."
    if not window_over:
        return "running", "No OOM kill so far."
    lines = [f"No OOM kill in the window (before: {before.get('oom_kills', 0)})."]
    if after["points"] and not after["rps_mean"]:
        return "inconclusive", "No traffic reached the deployment during the window: verification needs live traffic. Start it again."
    if not after["points"]:
        lines.append("Latency, errors and queues were not compared: the cluster reports no metrics (set its metrics URL).")
        return ("passed" if kind not in LATENCY_KINDS else "inconclusive"), " ".join(lines)
    before_p99, after_p99 = before.get("p99_ms"), after.get("p99_ms")
    if before_p99 and after_p99:
        lines.append(f"p99 {before_p99:.0f} ms → {after_p99:.0f} ms.")
    if before.get("queued_max") is not None and after.get("queued_max") is not None:
        lines.append(f"Queue peak {before['queued_max']:.0f} → {after['queued_max']:.0f}.")
    if before.get("error_rate") is not None and after.get("error_rate") is not None:
        lines.append(f"Errors per request {before['error_rate']:.2%} → {after['error_rate']:.2%}.")
    if kind in LATENCY_KINDS and before_p99 and after_p99 and after_p99 > 0.8 * before_p99:
        return "failed", " ".join(lines + ["p99 did not come down by at least 20 %."])
    return "passed", " ".join(lines)


def evaluate(wizard_id: int, now: datetime | None = None) -> str | None:
    """Called by the beat tick and on demand: fail early on a kill, conclude when the window is over."""
    now = now or timezone.now()
    with transaction.atomic():
        wizard = Wizard.objects.select_for_update().filter(pk=wizard_id, state=Wizard.State.VERIFYING).first()
        if wizard is None:
            return None
        until = min(now, wizard.verify_ends_at)
        wizard.after = measure(wizard, wizard.verify_started_at, until)
        kind = wizard.incident.kind if wizard.incident_id else ""
        result, why = verdict(kind, wizard.before, wizard.after, window_over=now >= wizard.verify_ends_at)
        step = WizardStep.objects.get(wizard=wizard, kind=WizardStep.Kind.VERIFICATION)
        step.check_result = {"result": result, "why": why, "at": now.isoformat()}
        if result == "running":
            step.save(update_fields=["check_result", "updated_at"])
            wizard.save(update_fields=["after", "updated_at"])
            return result
        step.status = {"passed": Status.PASSED, "failed": Status.CHECK_FAILED}.get(result, Status.PENDING)
        step.save(update_fields=["check_result", "status", "updated_at"])
        if result == "inconclusive":
            wizard.state = Wizard.State.OPEN
            wizard.revision += 1
            wizard.save(update_fields=["after", "state", "revision", "updated_at"])
            return result
        _conclude(wizard, result == "passed", why, now)
    return result


def _conclude(wizard: Wizard, resolved: bool, why: str, now: datetime) -> None:
    changes = sorted({s.change_id for s in WizardStep.objects.filter(wizard=wizard, status=Status.APPLIED, change__isnull=False)})
    linked = ", ".join(f"#{pk}" for pk in changes) or "none"
    wizard.state = Wizard.State.RESOLVED if resolved else Wizard.State.NOT_RESOLVED
    wizard.finished_at = now
    wizard.next_steps = [] if resolved else next_steps(wizard)
    wizard.outcome = why
    wizard.revision += 1
    wizard.save(update_fields=["after", "state", "finished_at", "next_steps", "outcome", "revision", "updated_at"])
    WizardStep.objects.filter(wizard=wizard, kind=WizardStep.Kind.OUTCOME).update(
        status=Status.DONE, check_result={"resolved": resolved, "changes": changes})
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
        IncidentEvent.objects.create(incident=incident, kind=IncidentEvent.Kind.NOTE,
                                     message=f"Wizard #{wizard.pk} did not fix it (changes {linked}): {why} Next: {tried}.")


def next_steps(wizard: Wizard) -> list[dict]:
    """What is left to try: remedies skipped or not done, then the causes' remedies no step covered."""
    steps = list(WizardStep.objects.filter(wizard=wizard, kind__in=[WizardStep.Kind.CONFIG, WizardStep.Kind.CHECKLIST]))
    covered = {s.remedy for s in steps}
    out = [{"id": s.remedy, "title": REMEDIES[s.remedy], "why": f"Step {s.position} is {s.get_status_display().lower()}."}
           for s in steps if s.status not in DONE and s.status != Status.NOT_APPLICABLE]
    for cause in wizard.diagnosis.get("causes", []):
        for remedy in REMEDIES_FOR.get(cause["id"], []):
            if remedy not in covered:
                covered.add(remedy)
                out.append({"id": remedy, "title": REMEDIES[remedy], "why": f"Suspected cause {cause['id']} was not addressed."})
    if wizard.diagnosis.get("conservative"):
        out.append({"id": "calibrate", "title": "Calibrate the deployment's memory",
                    "why": "The values were conservative defaults: a calibration measures what fits."})
    return out


def due() -> list[int]:
    return list(Wizard.objects.filter(state=Wizard.State.VERIFYING).values_list("pk", flat=True))
