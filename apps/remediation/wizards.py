"""Remediation wizards: from an incident or a finding to a verified fix, one step per remedy.

Every action locks the wizard row and checks the revision the operator saw, so two operators
on one wizard get a clear conflict instead of a double apply. Config remedies go through the
change protocol; before each, the live config is compared with what the values were computed
from, and a wizard whose deployment changed meanwhile is re-planned instead of applied."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.calibration import services as calibrations
from apps.calibration.inputs import OBSERVED_MIX
from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.core.catalogue import CONFIG_REMEDIES, GUIDANCE, REMEDIES
from apps.core.errors import Conflict
from apps.fleet.models import Deployment
from apps.incidents.models import Incident, IncidentEvent
from apps.incidents.request_sizes import observed as observed_sizes
from apps.remediation import diagnosis, margin, scaler_offer
from apps.remediation.models import Finding, Wizard, WizardStep
from apps.remediation.sizing import RemedyValues
from integrations.ray.errors import RayError

Status = WizardStep.Status


START = Permission(Role.OPERATOR, "start remediation wizards")
# What each operation on a started wizard needs: the wizard page and the API demand the same one.
OPERATIONS = {
    "apply": Permission(Role.OPERATOR, "apply remedies"),
    "confirm": Permission(Role.OPERATOR, "confirm remedies"),
    "skip": Permission(Role.OPERATOR, "skip remedies"),
    "check": Permission(Role.OPERATOR, "run checks"),
    "calibrate": Permission(Role.OPERATOR, "calibrate deployments"),
    "replan": Permission(Role.OPERATOR, "re-plan wizards"),
    "objectives": Permission(Role.OPERATOR, "set a wizard's objectives"),
    "verify": Permission(Role.OPERATOR, "verify fixes"),
    "evaluate": Permission(Role.OPERATOR, "verify fixes"),
    "abandon": Permission(Role.OPERATOR, "abandon wizards"),
    # R11 creates a scaler: whoever may create one elsewhere may here, no one else. The scaler's
    # own MANAGE (apps.scaler.services) is a layer up; a test holds the two equal.
    "scaler": Permission(Role.OPERATOR, "manage scalers"),
}


class WizardError(ValidationError):
    """The wizard cannot do this now; nothing was changed."""


class WizardConflict(WizardError, Conflict):
    """Someone else moved the wizard since the page was loaded."""


class WizardStale(WizardError, Conflict):
    """The deployment's config changed since the values were computed; they were recomputed."""


CALIBRATION_TITLE = "Measure memory per request (calibration)"
# Levels the wizard measures: candidates for the concurrency it chooses. The job stops before a
# level that would cross the node's budget, so the top ones are tried only where they fit.
CALIBRATION_LEVELS = (1, 2, 4, 8)


# --- starting ------------------------------------------------------------------------------


def start(
    actor: Actor,
    *,
    incident: Incident | None = None,
    finding: Finding | None = None,
    latency_objective_ms: int | None = None,
    failure_objective: float | None = None,
    verification_window_s: int | None = None,
) -> tuple[Wizard, bool]:
    """Open a wizard, or return the one already open for that deployment: a second operator
    joins it instead of starting a rival."""
    if (incident is None) == (finding is None):
        raise WizardError("Start a wizard from one incident or one finding.")
    source = incident or finding
    cluster, app, dep = source.cluster, source.application_name, source.deployment_name
    if not dep:
        raise WizardError(
            "This concerns a node or the whole cluster, not one deployment: a wizard fixes one deployment. "
            "Open the incident of a deployment on that node instead."
        )
    existing = Wizard.objects.filter(
        cluster=cluster,
        application_name=app,
        deployment_name=dep,
        state__in=[Wizard.State.OPEN, Wizard.State.VERIFYING],
    ).first()
    if existing is not None:
        return existing, False
    if incident is not None and incident.status == Incident.Status.RESOLVED:
        # The fix this incident had is the answer to it: open that wizard on its outcome, not a rival.
        fixed = Wizard.objects.filter(incident=incident, state=Wizard.State.RESOLVED).order_by("-pk").first()
        if fixed is not None:
            return fixed, False
    deployment = _deployment(cluster, app, dep)
    if deployment is None:
        raise WizardError(
            f"{app}/{dep} is no longer on {cluster.name}: there is nothing to fix. Resolve the incident by hand."
        )
    wizard = Wizard(
        cluster=cluster,
        deployment=deployment,
        application_name=app,
        deployment_name=dep,
        incident=incident,
        finding=finding,
        created_by=actor.user,
        updated_by=actor.user,
    )
    if verification_window_s:
        wizard.verification_window_s = verification_window_s
    found = _diagnose(wizard, deployment.effective_config, latency_objective_ms, failure_objective)
    with transaction.atomic():
        _take_objectives(wizard, found)
        wizard.diagnosis = found.summary
        wizard.basis = diagnosis.basis_of(deployment.effective_config, timezone.now().isoformat())
        wizard.save()
        _create_steps(wizard, found, deployment.effective_config)
        record(
            actor,
            "wizard.start",
            wizard,
            team=cluster.team,
            changes={
                "incident": incident.pk if incident else None,
                "finding": finding.pk if finding else None,
                "remedies": found.remedies,
            },
        )
        if incident is not None:
            IncidentEvent.objects.create(
                incident=incident,
                kind=IncidentEvent.Kind.NOTE,
                author=actor.user,
                message=f"Remediation wizard #{wizard.pk} started by {actor.name}.",
            )
    return wizard, True


def _deployment(cluster, app: str, dep: str) -> Deployment | None:
    return (
        Deployment.objects.filter(
            application__cluster=cluster,
            application__name=app,
            name=dep,
            removed_at__isnull=True,
            application__removed_at__isnull=True,
        )
        .select_related("application")
        .first()
    )


_KEEP = object()


def _diagnose(wizard: Wizard, effective: dict, latency_ms=_KEEP, failure=_KEEP) -> diagnosis.Diagnosis:
    """The diagnosis under the wizard's objectives: those the operator gave stay given, the others are suggested
    afresh from the latest measurements."""
    stated = (wizard.diagnosis or {}).get("objectives", {})
    given = stated.get("given", {})
    asked = (stated.get("margin") or {}).get("asked")
    confirmed = bool((stated.get("margin") or {}).get("confirmed"))
    if latency_ms is _KEEP:
        latency_ms = wizard.latency_objective_ms if given.get("latency_objective_ms", True) else None
    if failure is _KEEP:
        failure = wizard.failure_objective if given.get("failure_objective", True) else None
    return diagnosis.diagnose(
        wizard.cluster,
        wizard.application_name,
        wizard.deployment_name,
        effective,
        incident=wizard.incident,
        finding=wizard.finding,
        latency_objective_ms=latency_ms,
        failure_objective=failure,
        curve=_curve(wizard),
        margin_asked=asked,
        margin_confirmed=confirmed,
    )


def _take_objectives(wizard: Wizard, found: diagnosis.Diagnosis) -> None:
    """The wizard keeps the objectives its values were sized for, suggested or given."""
    goals = found.summary["objectives"]
    wizard.latency_objective_ms = goals["latency_objective_ms"]
    wizard.failure_objective = goals["failure_objective"]


def objective_below_service(wizard: Wizard, latency_objective_ms: int) -> str | None:
    """Why a latency objective cannot be met at all: one request takes longer than it."""
    service = ((wizard.diagnosis or {}).get("plan") or {}).get("service_s")
    if service and latency_objective_ms <= service * 1000:
        return (
            f"{latency_objective_ms:,} ms is below one request's calibrated service time of {service * 1000:,.0f} ms: "
            "no queue, and no setting, meets it"
        )
    return None


def margin_refused(wizard: Wizard, asked: float | None, confirmation: str) -> str | None:
    computed = ((wizard.diagnosis or {}).get("objectives", {}).get("margin") or {}).get("computed")
    return margin.refusal(computed, asked, confirmation) if computed is not None else None


def set_objectives(
    actor: Actor,
    wizard: Wizard,
    *,
    latency_objective_ms: int,
    failure_objective: float,
    revision: int | None,
    margin_fraction: float | None = None,
    confirmation: str = "",
) -> Wizard:
    """The operator states the objectives, and may ask for a wider margin below the kill level (a narrower one
    only with the typed confirmation): every value not yet applied is sized again for them."""
    if refused := objective_below_service(wizard, latency_objective_ms):
        raise WizardError(refused)
    if refused := margin_refused(wizard, margin_fraction, confirmation):
        raise WizardError(refused)
    with transaction.atomic():
        wizard = lock(wizard, revision)
        wizard.diagnosis = {
            **(wizard.diagnosis or {}),
            "objectives": {
                "given": {"latency_objective_ms": True, "failure_objective": True},
                "margin": {
                    "asked": margin_fraction,
                    "confirmed": confirmation.strip().lower() == margin.CONFIRM_LESS.lower(),
                },
            },
        }
        wizard.latency_objective_ms = latency_objective_ms
        wizard.failure_objective = failure_objective
        wizard.save(update_fields=["diagnosis", "latency_objective_ms", "failure_objective"])
        record(
            actor,
            "wizard.objectives",
            wizard,
            team=wizard.cluster.team,
            changes={
                "latency_objective_ms": latency_objective_ms,
                "failure_objective": failure_objective,
                "margin": margin_fraction,
            },
        )
    return replan(actor, wizard)


def _curve(wizard: Wizard):
    """The deployment's latest memory calibration, when one exists."""
    return calibrations.latest_curve(wizard.deployment) if wizard.deployment_id else None


def _create_steps(wizard: Wizard, found: diagnosis.Diagnosis, effective: dict) -> None:
    steps = [
        WizardStep(wizard=wizard, position=0, kind=WizardStep.Kind.DIAGNOSIS, title="Diagnosis", status=Status.DONE)
    ]
    if found.sizing.needs_calibration:
        steps.append(_calibration_step(wizard, len(steps), found))
    for remedy in found.remedies:
        steps.append(_remedy_step(wizard, len(steps), remedy, found, effective))
    steps.append(
        WizardStep(
            wizard=wizard, position=len(steps), kind=WizardStep.Kind.VERIFICATION, title="Verify under live traffic"
        )
    )
    steps.append(WizardStep(wizard=wizard, position=len(steps), kind=WizardStep.Kind.OUTCOME, title="Outcome"))
    WizardStep.objects.bulk_create(steps)


def _calibration_step(wizard: Wizard, position: int, found: diagnosis.Diagnosis) -> WizardStep:
    return WizardStep(
        wizard=wizard,
        position=position,
        kind=WizardStep.Kind.CALIBRATION,
        title=CALIBRATION_TITLE,
        values={"why": found.sizing.why_not_sized, "levels": list(CALIBRATION_LEVELS)},
    )


def remedy_title(remedy: str, patch: dict | None) -> str:
    """The playbook's title, unless what was computed contradicts it: R2's "min replicas ≥ 2" where only one
    replica fits says so instead."""
    auto = (patch or {}).get("autoscaling_config") or {}
    if remedy == "R2" and auto.get("max_replicas") == 1:
        return "R2: Queue-based autoscaling: only one replica fits this cluster, so none to scale to"
    return f"{remedy}: {REMEDIES[remedy]}"


def _remedy_step(wizard: Wizard, position: int, remedy: str, found: diagnosis.Diagnosis, effective: dict) -> WizardStep:
    step = WizardStep(wizard=wizard, position=position, remedy=remedy, title=remedy_title(remedy, None))
    if remedy == scaler_offer.REMEDY:
        scaler_offer.fill(step, found.scaler)
    else:
        _set_values(step, found, effective)
    return step


def _set_values(step: WizardStep, found: diagnosis.Diagnosis, effective: dict) -> None:
    """A config step for the config remedies, and for any other remedy the sizing gives a patch
    or will once measured (R4 where the deployment reads its batch limit from user_config, R3
    where it reads its input caps from there); a checklist otherwise, with the computed values,
    if any, as guidance."""
    computed: RemedyValues | dict = found.sizing.values.get(step.remedy, {})
    if step.remedy not in CONFIG_REMEDIES and not any(computed.get(k) for k in ("patch", "waiting", "not_applicable")):
        step.kind, step.patch, step.values = WizardStep.Kind.CHECKLIST, None, {"guidance": GUIDANCE[step.remedy]}
        if computed:
            step.values["warnings"] = computed.get("warnings", [])
            step.values["computed"] = [
                {"option": key, "value": value, "reason": computed.get("reasons", {}).get(key, "")}
                for key, value in computed.get("value", {}).items()
            ]
        if step.status in (Status.NOT_APPLICABLE, Status.FAILED):
            step.status, step.note = Status.PENDING, ""
        return
    step.kind = WizardStep.Kind.CONFIG
    step.values = {k: v for k, v in computed.items() if k != "patch"}
    step.patch = computed.get("patch")
    step.title = remedy_title(step.remedy, step.patch)
    if computed.get("waiting"):
        step.note = (
            computed.get("why_waiting") or "No values yet: they are computed from the calibration's measurements."
        )
        if step.status == Status.NOT_APPLICABLE:
            step.status = Status.PENDING
    elif computed.get("not_applicable"):
        step.status, step.note = Status.NOT_APPLICABLE, " ".join(computed.get("warnings", []))
    elif step.patch and _already_in_place(effective, step.patch):
        step.status, step.note = Status.NOT_APPLICABLE, "The deployment already runs with these values."
    elif step.status == Status.NOT_APPLICABLE:
        step.status, step.note = Status.PENDING, ""
    else:
        step.note = ""  # computed now: a "no values yet" left from before the calibration no longer holds


def _already_in_place(effective: dict, patch: dict) -> bool:
    settings = diagnosis.settings_of(effective)
    return diagnosis.with_patch(settings, patch) == settings


# --- acting on steps -----------------------------------------------------------------------


@contextmanager
def changing(wizard: Wizard, actor: Actor, revision: int | None) -> Iterator[Wizard]:
    """Every change to a wizard: in one transaction, the wizard locked and checked against the revision the actor
    acted on (a conflict names who moved it), and its revision bumped when the block ends without raising."""
    with transaction.atomic():
        current = lock(wizard, revision)
        yield current
        bump(current, actor)


def lock(wizard: Wizard, revision: int | None) -> Wizard:
    current = Wizard.objects.select_for_update().get(pk=wizard.pk)
    if revision is not None and revision != current.revision:
        who = current.updated_by.get_username() if current.updated_by else "the worker"
        raise WizardConflict(
            f"Wizard #{current.pk} moved on since you loaded it (revision {revision} → {current.revision}, last by "
            f"{who} at {timezone.localtime(current.updated_at):%H:%M:%S}). Reload to see what changed."
        )
    if current.state not in (Wizard.State.OPEN, Wizard.State.VERIFYING):
        raise WizardError(f"Wizard #{current.pk} is {current.get_state_display().lower()}.")
    return current


def bump(wizard: Wizard, actor: Actor) -> None:
    wizard.revision += 1
    wizard.updated_by = actor.user
    wizard.save(update_fields=["revision", "updated_by", "updated_at"])


def step_at(wizard: Wizard, position: int) -> WizardStep:
    step = WizardStep.objects.filter(wizard=wizard, position=position).first()
    if step is None:
        raise WizardError(f"Wizard #{wizard.pk} has no step {position}.")
    return step


def apply(actor: Actor, wizard: Wizard, positions: list[int], *, revision: int | None) -> Change:
    """Apply one or several config remedies as one change (one rolling update instead of several)."""
    with changing(wizard, actor, revision) as wizard:
        if wizard.state != Wizard.State.OPEN:
            raise WizardError("Verification is running: wait for its outcome, or abandon it, before changing more.")
        busy = WizardStep.objects.filter(wizard=wizard, status=Status.APPLYING).first()
        if busy is not None:
            raise WizardError(
                f"Step {busy.position} is being applied (change #{busy.change_id}); apply the next when it has "
                "finished."
            )
        steps = [step_at(wizard, p) for p in sorted(set(positions))]
        if not steps:
            raise WizardError("Name the step(s) to apply.")
        for step in steps:
            if step.kind != WizardStep.Kind.CONFIG:
                raise WizardError(
                    f"Step {step.position} ({step.remedy}) is a code-level remedy: confirm it or run its check instead."
                )
            if step.status in (Status.PENDING, Status.FAILED) and not step.patch and step.values.get("waiting"):
                raise WizardError(
                    f"Step {step.position} ({step.remedy}) has no values yet: "
                    + step.values.get(
                        "why_waiting", "run the calibration step first, so they come from measured memory."
                    )
                )
            if step.status not in (Status.PENDING, Status.FAILED) or not step.patch:
                raise WizardError(
                    f"Step {step.position} ({step.remedy}) is {step.get_status_display().lower()}: nothing to apply."
                )
        WizardStep.objects.filter(pk__in=[s.pk for s in steps]).update(status=Status.APPLYING, updated_by=actor.user)
    pending = [s.pk for s in steps]
    try:
        effective = _live_effective(wizard)
        stale = _stale_settings(wizard, effective)
        if not stale:
            change = _plan(actor, wizard, steps)
            # Queued, linked and recorded together: the worker is sent the change only when this
            # commits, so the change's end always finds its steps, and a web process that dies
            # here leaves a planned change and steps the tick puts back to To do, nothing queued.
            with transaction.atomic():
                protocol.request_apply(actor, change)
                WizardStep.objects.filter(pk__in=pending).update(change=change)
                record(
                    actor,
                    "wizard.apply",
                    wizard,
                    team=wizard.cluster.team,
                    changes={"steps": [s.position for s in steps], "change": change.pk},
                )
    except (ValidationError, RayError) as exc:
        WizardStep.objects.filter(pk__in=pending, status=Status.APPLYING).update(status=Status.PENDING)
        raise exc if isinstance(exc, WizardError) else WizardError(_message(exc)) from exc
    if stale:
        WizardStep.objects.filter(pk__in=pending, status=Status.APPLYING).update(status=Status.PENDING)
        replan(actor, wizard, effective=effective)
        raise WizardStale(
            f"{wizard.application_name}/{wizard.deployment_name} changed since these values were computed "
            f"({', '.join(stale)}). The values were recomputed from the live config: review them and apply again."
        )
    return change


def _plan(actor: Actor, wizard: Wizard, steps: list[WizardStep]) -> Change:
    options = _merged([s.patch for s in steps])
    remedies = "+".join(s.remedy for s in steps)
    source = f"incident #{wizard.incident_id}" if wizard.incident_id else f"finding #{wizard.finding_id}"
    return protocol.plan_change(
        actor,
        wizard.cluster,
        options=options,
        targets=[{"application": wizard.application_name, "deployment": wizard.deployment_name}],
        reason=f"Wizard #{wizard.pk} ({source}): {remedies} with computed values",
    )


def _merged(patches: list[dict]) -> dict:
    out: dict = {}
    for patch in patches:
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = copy.deepcopy(value)
    return out


def _stale_settings(wizard: Wizard, effective: dict) -> list[str]:
    """Settings whose live value is neither what the values were computed from nor what this
    wizard's own changes set since."""
    expected = wizard.basis.get("settings", {})
    since = dt.datetime.fromisoformat(wizard.basis["at"]) if wizard.basis.get("at") else None
    applied = (
        WizardStep.objects.filter(wizard=wizard, status=Status.APPLIED, change__finished_at__gte=since) if since else []
    )
    for step in applied:
        expected = diagnosis.with_patch(expected, step.patch or {})
    live = diagnosis.settings_of(effective)
    return sorted(k for k in set(live) | set(expected) if live.get(k) != expected.get(k))


def _live_effective(wizard: Wizard) -> dict:
    try:
        live = protocol.read_live(wizard.cluster)
    except RayError as exc:
        raise WizardError(
            f"Could not read {wizard.cluster.name}'s live config, so nothing was applied: {exc.message}"
        ) from exc
    app = live.applications.get(wizard.application_name)
    deployment = app.deployments.get(wizard.deployment_name) if app else None
    if deployment is None:
        raise WizardError(
            f"{wizard.application_name}/{wizard.deployment_name} no longer exists on {wizard.cluster.name}; nothing "
            "was applied. Abandon this wizard, or start one for the deployment that replaced it."
        )
    return deployment.deployment_config


def replan(actor: Actor, wizard: Wizard, *, revision: int | None = None, effective: dict | None = None) -> Wizard:
    """Recompute the diagnosis and every config step not yet applied, from the live config and
    the latest measurements (a calibration that just finished, new signals)."""
    if settle_calibration(wizard.pk):
        # Settling a successful calibration re-planned from it already.
        return Wizard.objects.get(pk=wizard.pk)
    if effective is None:
        effective = _live_effective(wizard)
    with changing(wizard, actor, revision) as wizard:
        found = _diagnose(wizard, effective)
        _take_objectives(wizard, found)
        wizard.diagnosis = found.summary
        wizard.basis = diagnosis.basis_of(effective, timezone.now().isoformat())
        wizard.save(update_fields=["diagnosis", "basis", "latency_objective_ms", "failure_objective"])
        steps = {s.remedy: s for s in WizardStep.objects.filter(wizard=wizard).exclude(remedy="")}
        for step in steps.values():
            if step.remedy == scaler_offer.REMEDY:
                if step.status in (Status.PENDING, Status.NOT_APPLICABLE):
                    scaler_offer.fill(step, found.scaler)
                    step.save(update_fields=["values", "status", "note"])
                continue
            # Checklists with computed values (R4) follow a new calibration too, and may become config steps.
            recomputed = step.kind == WizardStep.Kind.CONFIG or step.remedy in found.sizing.values
            if recomputed and step.status in (Status.PENDING, Status.FAILED, Status.NOT_APPLICABLE):
                _set_values(step, found, effective)
                step.save(update_fields=["kind", "values", "patch", "status", "note", "title"])
        missing = [
            r
            for r in found.remedies
            if r not in steps and (r in CONFIG_REMEDIES or r == scaler_offer.REMEDY or found.sizing.patch(r))
        ]
        if missing:
            _insert_steps(wizard, missing, found, effective)
        calibration_step = WizardStep.objects.filter(wizard=wizard, kind=WizardStep.Kind.CALIBRATION).first()
        if found.sizing.needs_calibration and calibration_step is None:
            _insert_calibration_step(wizard, found)
        elif calibration_step is not None and calibration_step.status in (Status.PENDING, Status.FAILED):
            if found.sizing.needs_calibration:
                calibration_step.values = {**calibration_step.values, "why": found.sizing.why_not_sized}
            else:
                # A calibration made elsewhere (the deployment page, the API) measured it meanwhile.
                calibration_step.status = Status.DONE
                measured = found.summary["memory"]
                calibration_step.note = f"Measured: {measured['reason']}" if measured else "Measured elsewhere."
            calibration_step.save(update_fields=["values", "status", "note", "updated_at"])
        record(actor, "wizard.replan", wizard, team=wizard.cluster.team)
    return wizard


def _insert_calibration_step(wizard: Wizard, found: diagnosis.Diagnosis) -> None:
    """Right after the diagnosis: every other step moves down one."""
    later = list(WizardStep.objects.filter(wizard=wizard, position__gt=0).order_by("-position"))
    for step in later:
        step.position += 1000  # out of the way of the unique constraint first
        step.save(update_fields=["position"])
    for step in later:
        step.position -= 999
        step.save(update_fields=["position"])
    _calibration_step(wizard, 1, found).save()


def _insert_steps(wizard: Wizard, remedies: list[str], found: diagnosis.Diagnosis, effective: dict) -> None:
    """New config remedies go before verification; the last two steps move down."""
    tail = list(
        WizardStep.objects.filter(
            wizard=wizard, kind__in=[WizardStep.Kind.VERIFICATION, WizardStep.Kind.OUTCOME]
        ).order_by("-position")
    )
    for step in tail:
        step.position += len(remedies) + 100  # out of the way of the unique constraint first
        step.save(update_fields=["position"])
    first = tail[-1].position - len(remedies) - 100
    for offset, remedy in enumerate(remedies):
        _remedy_step(wizard, first + offset, remedy, found, effective).save()
    for step in reversed(tail):
        step.position -= 100
        step.save(update_fields=["position"])


# --- calibration ---------------------------------------------------------------------------


def calibrate(
    actor: Actor,
    wizard: Wizard,
    *,
    request: dict | None = None,
    levels: list[int] | None = None,
    revision: int | None,
    mix: list[dict] | str | None = None,
) -> WizardStep:
    """Measure the deployment's memory with a calibration job, through its own interface: with
    `request` as the representative request, or a weighted `mix` of requests (see
    apps.calibration.inputs.validate_mix), else Fleetdeck's default for the deployment (its
    warmup profile's request, or a GET of its route). The values are recomputed when it ends."""
    with transaction.atomic():
        wizard = lock(wizard, revision)
        if wizard.state != Wizard.State.OPEN:
            raise WizardError("Verification is running: calibrate once it has an outcome.")
        step = WizardStep.objects.filter(wizard=wizard, kind=WizardStep.Kind.CALIBRATION).first()
        if step is not None and step.status == Status.APPLYING:
            raise WizardError(f"Calibration #{step.calibration_id} is still running: wait for its result.")
        if WizardStep.objects.filter(wizard=wizard, status=Status.APPLYING).exists():
            raise WizardError("A change of this wizard is being applied: calibrate once it has finished.")
    # The cluster is asked first: a deployment deleted since the wizard started is named, not measured.
    _live_effective(wizard)
    deployment = _deployment(wizard.cluster, wizard.application_name, wizard.deployment_name)
    if deployment is None:
        raise WizardError(
            f"{wizard.application_name}/{wizard.deployment_name} is no longer in the inventory: sync the cluster, or "
            "abandon this wizard."
        )
    try:
        run = calibrations.request_calibration(
            actor,
            deployment,
            levels=list(levels or CALIBRATION_LEVELS),
            request=request,
            mix=mix,
            observed=observed_sizes(deployment) if mix == OBSERVED_MIX else None,
        )
    except ValidationError as exc:
        raise WizardError(f"Nothing was measured and nothing was pushed: {_message(exc)}") from exc
    with transaction.atomic():
        wizard = Wizard.objects.select_for_update().get(pk=wizard.pk)
        if step is None:
            found = _diagnose(wizard, deployment.effective_config)
            _insert_calibration_step(wizard, found)
        step = WizardStep.objects.get(wizard=wizard, kind=WizardStep.Kind.CALIBRATION)
        step.calibration, step.status, step.updated_by = run, Status.APPLYING, actor.user
        step.note = f"Calibration #{run.pk} is running on {wizard.cluster.name}."
        step.check_result = {}
        step.save(update_fields=["calibration", "status", "updated_by", "note", "check_result", "updated_at"])
        bump(wizard, actor)
        record(
            actor,
            "wizard.calibrate",
            wizard,
            team=wizard.cluster.team,
            changes={"calibration": run.pk, "request": run.request},
        )
    return step


def awaiting_calibration() -> list[int]:
    return list(
        WizardStep.objects.filter(
            kind=WizardStep.Kind.CALIBRATION, status=Status.APPLYING, wizard__state=Wizard.State.OPEN
        ).values_list("wizard_id", flat=True)
    )


def settle_awaiting() -> None:
    for wizard_id in awaiting_calibration():
        settle_calibration(wizard_id)


def settle_calibration(wizard_id: int) -> bool:
    """A finished calibration settles its step: on success the values are recomputed from it; on
    failure the step says why and the config steps stay without values. True when it settled."""
    with transaction.atomic():
        step = (
            WizardStep.objects.select_for_update(of=("self",))
            .select_related("calibration")
            .filter(wizard_id=wizard_id, kind=WizardStep.Kind.CALIBRATION, status=Status.APPLYING)
            .first()
        )
        if step is None or step.calibration is None or not step.calibration.is_final:
            return False
        run = step.calibration
        ok = run.state == run.State.SUCCEEDED
        step.status = Status.DONE if ok else Status.FAILED
        step.check_result = {"calibration": run.pk, "state": run.state, "error": run.error}
        step.note = (
            f"Calibration #{run.pk} measured {len(run.points)} level(s); the values below come from it."
            if ok
            else f"Calibration #{run.pk} {run.get_state_display().lower()}: {run.error or 'no reason given'}"
        )
        step.save(update_fields=["status", "check_result", "note", "updated_at"])
        wizard = Wizard.objects.select_for_update().get(pk=wizard_id)
        wizard.revision += 1
        wizard.save(update_fields=["revision", "updated_at"])
        if wizard.incident_id:
            IncidentEvent.objects.create(
                incident_id=wizard.incident_id,
                kind=IncidentEvent.Kind.NOTE,
                message=f"Wizard #{wizard.pk}: {step.note}",
            )
    if ok:
        try:
            replan(Actor.system(), wizard)
        except WizardError as exc:
            WizardStep.objects.filter(pk=step.pk).update(
                note=f"{step.note} The values could not be recomputed: {_message(exc)}"
            )
    return True


def confirm(actor: Actor, wizard: Wizard, position: int, *, note: str = "", revision: int | None) -> WizardStep:
    """An operator says a code-level remedy is in place."""
    with changing(wizard, actor, revision) as wizard:
        step = step_at(wizard, position)
        if step.kind != WizardStep.Kind.CHECKLIST:
            raise WizardError(
                f"Step {position} is not a code-level remedy: config remedies are applied, not confirmed."
            )
        step.status, step.note, step.updated_by = Status.DONE, note.strip()[:2000], actor.user
        step.save(update_fields=["status", "note", "updated_by", "updated_at"])
        record(
            actor, "wizard.confirm", wizard, team=wizard.cluster.team, changes={"step": position, "remedy": step.remedy}
        )
    return step


def skip(actor: Actor, wizard: Wizard, position: int, *, reason: str, revision: int | None) -> WizardStep:
    if not reason.strip():
        raise WizardError("Say why this remedy is skipped: the outcome lists skipped remedies as what to try next.")
    with changing(wizard, actor, revision) as wizard:
        step = step_at(wizard, position)
        skippable = (WizardStep.Kind.CONFIG, WizardStep.Kind.CHECKLIST, WizardStep.Kind.SCALER)
        if step.kind not in skippable or step.status == Status.APPLYING:
            raise WizardError(f"Step {position} cannot be skipped now.")
        step.status, step.note, step.updated_by = Status.SKIPPED, reason.strip()[:2000], actor.user
        step.save(update_fields=["status", "note", "updated_by", "updated_at"])
        record(actor, "wizard.skip", wizard, team=wizard.cluster.team, changes={"step": position, "reason": step.note})
    return step


# A step marked APPLYING whose change was never linked (the process died between the two transactions of
# apply) is put back after this long: apply links within a second.
ORPHAN_AFTER = dt.timedelta(minutes=2)


def settle_orphaned_steps(wizard_id: int | None = None) -> int:
    """Steps left APPLYING: those whose change has ended take its outcome (the completion signal was missed),
    those never linked to a change go back to To do. Returns how many were settled. A tick handler."""
    applying = WizardStep.objects.filter(status=Status.APPLYING, kind=WizardStep.Kind.CONFIG)
    if wizard_id is not None:
        applying = applying.filter(wizard_id=wizard_id)
    settled = 0
    for change in Change.objects.filter(pk__in=applying.exclude(change=None).values("change_id")):
        if change.is_final:
            settled += WizardStep.objects.filter(change=change, status=Status.APPLYING).count()
            on_change_finished(None, change)
    orphans = applying.filter(change=None, updated_at__lt=timezone.now() - ORPHAN_AFTER)
    settled += orphans.update(
        status=Status.PENDING,
        note="The hand-off to the change protocol was interrupted before a change was queued: nothing was pushed.",
    )
    return settled


def abandon(actor: Actor, wizard: Wizard, *, reason: str, revision: int | None) -> Wizard:
    settle_orphaned_steps(wizard.pk)
    with changing(wizard, actor, revision) as wizard:
        if WizardStep.objects.filter(wizard=wizard, status=Status.APPLYING).exists():
            raise WizardError("A change of this wizard is in progress; abandon it when the change has finished.")
        wizard.state, wizard.finished_at = Wizard.State.ABANDONED, timezone.now()
        wizard.outcome = f"Abandoned by {actor.name}: {reason.strip() or 'no reason given'}"
        wizard.save(update_fields=["state", "finished_at", "outcome"])
        record(actor, "wizard.abandon", wizard, team=wizard.cluster.team, changes={"reason": reason.strip()[:500]})
    return wizard


def on_change_finished(sender, change: Change, **kwargs) -> None:
    """A wizard's change ended: its steps are applied, or failed with the change's reason."""
    steps = list(WizardStep.objects.filter(change=change, status=Status.APPLYING).select_related("wizard"))
    if not steps:
        return
    ok = change.state == ChangeState.SUCCEEDED
    with transaction.atomic():
        for step in steps:
            step.status = Status.APPLIED if ok else Status.FAILED
            step.note = (
                ""
                if ok
                else f"Change #{change.pk} {change.get_state_display().lower()}: {change.error or 'see the change log'}"
            )
            step.save(update_fields=["status", "note", "updated_at"])
        wizard = Wizard.objects.select_for_update().get(pk=steps[0].wizard_id)
        wizard.revision += 1
        wizard.save(update_fields=["revision", "updated_at"])
        if wizard.incident_id:
            verb = "applied" if ok else f"did not apply ({change.get_state_display().lower()})"
            IncidentEvent.objects.create(
                incident_id=wizard.incident_id,
                kind=IncidentEvent.Kind.NOTE,
                message=f"Wizard #{wizard.pk}: change #{change.pk} ({', '.join(s.remedy for s in steps)}) {verb}.",
            )


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return " ".join(exc.messages)
    return getattr(exc, "message", str(exc))
