"""What the wizard pages show: the step list, the current step, its diff and comparisons."""

from __future__ import annotations

import yaml

from apps.fleet.configs import unified_diff
from apps.remediation import diagnosis
from apps.remediation.models import Wizard, WizardStep

Status = WizardStep.Status
STATUS_CLASS = {
    Status.APPLIED: "good", Status.DONE: "good", Status.PASSED: "good", Status.APPLYING: "busy",
    Status.FAILED: "bad", Status.CHECK_FAILED: "bad", Status.SKIPPED: "muted", Status.NOT_APPLICABLE: "muted",
}
COMPARED = [("oom_kills", "OOM kills"), ("p50_ms", "p50 (ms)"), ("p99_ms", "p99 (ms)"), ("error_rate", "Errors per request"),
            ("queued_max", "Queue peak"), ("rps_mean", "Requests/s (mean)"), ("points", "Readings")]


def wizard_context(wizard: Wizard, position, *, can_operate: bool) -> dict:
    steps = list(wizard.steps.select_related("change").order_by("position"))
    for step in steps:
        step.css = STATUS_CLASS.get(step.status, "")
    current = _current(steps, position)
    context = {
        "wizard": wizard, "steps": steps, "step": current, "can_operate": can_operate and wizard.is_active,
        "polling": wizard.state == Wizard.State.VERIFYING or any(s.status == Status.APPLYING for s in steps),
        "deployment": wizard.deployment,
    }
    if current.kind == WizardStep.Kind.CONFIG:
        context.update(_config(wizard, current, steps))
    elif current.kind in (WizardStep.Kind.VERIFICATION, WizardStep.Kind.OUTCOME):
        context["comparison"] = [(label, wizard.before.get(key), wizard.after.get(key)) for key, label in COMPARED
                                 if key in wizard.before or key in wizard.after]
        context["applied_changes"] = sorted({s.change for s in steps if s.change_id and s.status == Status.APPLIED}, key=lambda c: c.pk)
    return context


def _current(steps: list[WizardStep], position) -> WizardStep:
    try:
        wanted = int(position)
    except (TypeError, ValueError):
        wanted = None
    for step in steps:
        if step.position == wanted:
            return step
    return next((s for s in steps if not s.is_settled and s.kind != WizardStep.Kind.OUTCOME), steps[-1])


def _config(wizard: Wizard, step: WizardStep, steps: list[WizardStep]) -> dict:
    effective = wizard.deployment.effective_config if wizard.deployment_id else {}
    before = diagnosis.settings_of(effective)
    rows = []
    for key, value in _flat(step.patch or {}):
        rows.append({"option": key, "value": value, "reason": step.values.get("reasons", {}).get(key.split(".")[-1], "")})
    pending = [s for s in steps if s.kind == WizardStep.Kind.CONFIG and s.status in (Status.PENDING, Status.FAILED) and s.patch]
    return {
        "rows": rows,
        "diff": unified_diff(before, diagnosis.with_patch(before, step.patch or {}), old_label="now", new_label="after this remedy"),
        "patch_yaml": yaml.safe_dump(step.patch, sort_keys=False) if step.patch else "",
        "together": pending if len(pending) > 1 and step in pending else [],
    }


def _flat(patch: dict, prefix: str = ""):
    for key, value in patch.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
