"""What the wizard pages show: the step list, the current step, its diff and comparisons."""

from __future__ import annotations

import yaml

from apps.fleet import llm
from apps.fleet.configs import unified_diff
from apps.fleet.templatetags.fleet_tags import ms, num, percent
from apps.remediation import diagnosis
from apps.remediation.models import Wizard, WizardStep

Status = WizardStep.Status
STATUS_CLASS = {
    Status.APPLIED: "good",
    Status.DONE: "good",
    Status.PASSED: "good",
    Status.APPLYING: "busy",
    Status.FAILED: "bad",
    Status.CHECK_FAILED: "bad",
    Status.SKIPPED: "muted",
    Status.NOT_APPLICABLE: "muted",
}
# Clients and replicas apart: a replica that never errs can sit behind a proxy that sheds most
# requests with 503, and its processing time leaves out the queue the clients waited in.
CLIENTS = [
    ("client_requests", "Requests answered"),
    ("client_failed", "Failed requests"),
    ("client_failed_by_code", "Failed by code"),
    ("client_failed_share", "Failed share"),
    ("goodput_rps", "Goodput (successful)"),
    ("client_p50_ms", "p50 end to end"),
    ("client_p99_ms", "p99 end to end"),
]
REPLICAS = [
    ("replica_requests", "Requests"),
    ("errors", "Errors"),
    ("error_rate", "Errors per request"),
    ("p50_ms", "Processing p50"),
    ("p99_ms", "Processing p99"),
    ("queued_max", "Queue peak (requests)"),
    ("rps_mean", "Requests (mean rate)"),
]
WINDOW = [("oom_kills", "OOM kills"), ("healthy", "Window"), ("points", "Readings")]
SHARES = {"client_failed_share", "error_rate"}
DURATIONS_MS = {"client_p50_ms", "client_p99_ms", "p50_ms", "p99_ms"}
RATES = {"goodput_rps", "rps_mean"}


def badge(wizard: Wizard, step: WizardStep) -> tuple[str, str]:
    """A step's badge as its real state reads: the verification follows the wizard, a calibration is measured,
    not changed, and the outcome says whether the fix held."""
    kind, state = step.kind, wizard.state
    if kind == WizardStep.Kind.VERIFICATION:
        if state == Wizard.State.VERIFYING:
            return "Verifying", "busy"
        if state == Wizard.State.RESOLVED:
            return "Passed", "good"
        if state == Wizard.State.NOT_RESOLVED:
            return "Failed", "bad"
    if kind == WizardStep.Kind.OUTCOME:
        if state == Wizard.State.RESOLVED:
            return "Fixed and verified", "good"
        if state == Wizard.State.NOT_RESOLVED:
            return "Not fixed", "bad"
        if state == Wizard.State.ABANDONED:
            return "Abandoned", "muted"
    if kind == WizardStep.Kind.CALIBRATION:
        if step.status == Status.APPLYING:
            return "Measuring", "busy"
        if step.status == Status.FAILED:
            return "Calibration failed", "bad"
        if step.status == Status.DONE:
            return "Measured", "good"
    if kind == WizardStep.Kind.CONFIG and step.status == Status.PENDING and step.patch:
        return "Computed: to apply", ""
    return step.get_status_display(), STATUS_CLASS.get(step.status, "")


def wizard_context(wizard: Wizard, position, *, can_operate: bool) -> dict:
    steps = list(wizard.steps.select_related("change").order_by("position"))
    for step in steps:
        step.label, step.css = badge(wizard, step)
    current = _current(wizard, steps, position)
    context = {
        "wizard": wizard,
        "steps": steps,
        "step": current,
        "can_operate": can_operate and wizard.is_active,
        "polling": wizard.state == Wizard.State.VERIFYING or any(s.status == Status.APPLYING for s in steps),
        "deployment": wizard.deployment,
        # A serve.llm deployment's GPU memory and KV-cache plan, as on its own page.
        "llm": llm.describe(wizard.deployment) if wizard.deployment else None,
    }
    if current.kind == WizardStep.Kind.CONFIG:
        context.update(_config(wizard, current, steps))
    elif current.kind in (WizardStep.Kind.VERIFICATION, WizardStep.Kind.OUTCOME):
        context["comparison"] = comparison(wizard.before, wizard.after)
        context["failure_objective"] = f"{wizard.failure_objective * 100:g} %"
        context["applied_changes"] = sorted(
            {s.change for s in steps if s.change_id and s.status == Status.APPLIED}, key=lambda c: c.pk
        )
    return context


def comparison(before: dict, after: dict) -> list[dict]:
    """Before/after rows in sections, each value with its unit; the client section says so when
    the cluster exports no proxy counters instead of showing blanks that read as zero."""
    sections = []
    for title, rows in (("Clients, at the Serve proxy", CLIENTS), ("Replicas", REPLICAS), ("Window", WINDOW)):
        shown = [
            (label, _shown(key, before), _shown(key, after)) for key, label in rows if key in before or key in after
        ]
        if not shown:
            continue
        note = ""
        if rows is CLIENTS and all(side.get("client_requests") is None for side in (before, after)):
            shown, note = [], "The cluster exports no proxy counters for this application: what clients saw is unknown."
        sections.append({"title": title, "rows": shown, "note": note})
    return sections


def _shown(key: str, side: dict):
    value = side.get(key)
    if value is None:
        return None
    if key == "healthy":
        return f"healthy: {side.get('why', '')}" if value else f"failing: {side.get('why', '')}"
    # The pages' own formats (fleet_tags), so a figure here reads as it does on every other page.
    if key in SHARES:
        return percent(value)
    if key == "client_failed_by_code":
        return ", ".join(f"{code} ×{n:.0f}" for code, n in value.items()) or "none"
    if key == "client_p99_ms" and side.get("client_p99_between_ms"):
        low, high = side["client_p99_between_ms"]
        if high is None:
            return f"above {ms(low)} (the proxy's last bucket)"
        if high > 2 * max(low, 1):
            return f"{ms(value)}, somewhere in {ms(low)}–{ms(high)} (the proxy's histogram bucket)"
    if key in DURATIONS_MS:
        return ms(value)
    if key in RATES:
        return f"{value:.2f}\xa0req/s"
    if isinstance(value, float):
        return num(round(value, 1))
    return value


def _current(wizard: Wizard, steps: list[WizardStep], position) -> WizardStep:
    """The step asked for, else the one that needs the operator: the outcome once the wizard has ended, the
    verification while it runs, else the first step not settled."""
    try:
        wanted = int(position)
    except (TypeError, ValueError):
        wanted = None
    for step in steps:
        if step.position == wanted:
            return step
    by_kind = {s.kind: s for s in steps}
    if not wizard.is_active and WizardStep.Kind.OUTCOME in by_kind:
        return by_kind[WizardStep.Kind.OUTCOME]
    if wizard.state == Wizard.State.VERIFYING and WizardStep.Kind.VERIFICATION in by_kind:
        return by_kind[WizardStep.Kind.VERIFICATION]
    return next((s for s in steps if not s.is_settled and s.kind != WizardStep.Kind.OUTCOME), steps[-1])


def _config(wizard: Wizard, step: WizardStep, steps: list[WizardStep]) -> dict:
    effective = wizard.deployment.effective_config if wizard.deployment_id else {}
    before = diagnosis.settings_of(effective)
    rows = []
    for key, value in _flat(step.patch or {}):
        rows.append(
            {"option": key, "value": value, "reason": step.values.get("reasons", {}).get(key.split(".")[-1], "")}
        )
    pending = [
        s for s in steps if s.kind == WizardStep.Kind.CONFIG and s.status in (Status.PENDING, Status.FAILED) and s.patch
    ]
    return {
        "rows": rows,
        "diff": unified_diff(
            before, diagnosis.with_patch(before, step.patch or {}), old_label="now", new_label="after this remedy"
        ),
        "patch_yaml": yaml.safe_dump(step.patch, sort_keys=False) if step.patch else "",
        "together": pending if len(pending) > 1 and step in pending else [],
    }


def _flat(patch: dict, prefix: str = ""):
    for key, value in patch.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
