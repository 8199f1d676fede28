"""Taking the wizard's R11 (apps.remediation.scaler_offer sizes it): the deployment's scaler,
created in shadow mode with the bounds the wizard sized, or the one it already has. Here, not in
apps.remediation, because the scaler sits above the remediation layer (it sizes from it). Never
activated here: a scaler in control changes the cluster's config, which stays an operator's act
on the scaler's card (apps.scaler.control)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from apps.accounts.audit import Actor, record
from apps.remediation.models import Wizard, WizardStep
from apps.remediation.wizards import WizardError, changing, step_at
from apps.scaler import services as scalers
from apps.scaler.models import Scaler

Status = WizardStep.Status


def take(actor: Actor, wizard: Wizard, position: int, *, revision: int | None) -> WizardStep:
    with changing(wizard, actor, revision) as wizard:
        step = step_at(wizard, position)
        if step.kind != WizardStep.Kind.SCALER:
            raise WizardError(f"Step {position} is not R11: only it creates a scaler.")
        if step.status == Status.DONE:
            # Taken already: a second click (or a retried request) leaves the one scaler it made.
            return step
        if step.values.get("refused"):
            raise WizardError(step.values["refused"])
        if step.status != Status.PENDING or "max_replicas" not in step.values:
            raise WizardError(f"Step {position} is {step.get_status_display().lower()}: nothing to take.")
        deployment = wizard.deployment
        if deployment is None:
            raise WizardError(f"{wizard.application_name}/{wizard.deployment_name} is no longer in the inventory.")
        low, high = step.values["min_replicas"], step.values["max_replicas"]
        scaler = Scaler.objects.filter(deployment=deployment).first()
        created = scaler is None
        if scaler is None:
            try:
                scaler = scalers.create_shadow_scaler(actor, deployment, min_replicas=low, max_replicas=high)
            except ValidationError as exc:
                raise WizardError(" ".join(exc.messages)) from exc
            step.note = (
                f"Scaler #{scaler.pk} created in shadow mode (min {low}, max {high}): it records what it would do. "
                "Take control on its card once its record convinces you."
            )
        else:
            # Its bounds may be someone's choice: the wizard does not overwrite them.
            step.note = (
                f"The deployment already has scaler #{scaler.pk} ({scaler.get_mode_display().lower()}, min "
                f"{scaler.min_replicas}, max {scaler.max_replicas}): kept as it is. The wizard sized min {low}, "
                f"max {high}."
            )
        step.status, step.updated_by = Status.DONE, actor.user
        step.check_result = {"scaler": scaler.pk, "created": created}
        step.save(update_fields=["status", "note", "check_result", "updated_by", "updated_at"])
        record(
            actor,
            "wizard.scaler",
            wizard,
            team=wizard.cluster.team,
            changes={"step": position, "scaler": scaler.pk, "created": created},
        )
    return step
