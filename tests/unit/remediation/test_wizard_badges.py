"""The wizard page at a glance: each step's badge is its real state, and the page opens where the operator is
needed (the outcome once the wizard has ended, the verification while it runs); no step stays APPLYING."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.changes.models import ChangeState
from apps.remediation import wizards
from apps.remediation.models import Wizard, WizardStep
from apps.remediation.presentation import badge, wizard_context
from tests.factories import ChangeFactory

pytestmark = pytest.mark.django_db

Status, Kind, State = WizardStep.Status, WizardStep.Kind, Wizard.State


def _wizard(incident, state=State.OPEN):
    wizard = Wizard.objects.create(
        cluster=incident.cluster,
        incident=incident,
        application_name=incident.application_name,
        deployment_name=incident.deployment_name,
        state=state,
    )
    kinds = [Kind.DIAGNOSIS, Kind.CALIBRATION, Kind.CONFIG, Kind.VERIFICATION, Kind.OUTCOME]
    for position, kind in enumerate(kinds):
        WizardStep.objects.create(
            wizard=wizard,
            position=position,
            kind=kind,
            remedy="R1" if kind == Kind.CONFIG else "",
            title=kind.label,
            status=Status.DONE if kind == Kind.DIAGNOSIS else Status.PENDING,
            patch={"max_ongoing_requests": 2} if kind == Kind.CONFIG else None,
        )
    return wizard


def _step(wizard, kind):
    return wizard.steps.get(kind=kind)


def test_badges_read_the_real_state(incident):
    wizard = _wizard(incident, State.VERIFYING)
    assert badge(wizard, _step(wizard, Kind.VERIFICATION)) == ("Verifying", "busy")
    assert badge(wizard, _step(wizard, Kind.CONFIG)) == ("Computed: to apply", "")
    calibration = _step(wizard, Kind.CALIBRATION)
    calibration.status = Status.FAILED
    assert badge(wizard, calibration) == ("Calibration failed", "bad")
    wizard.state = State.RESOLVED
    assert badge(wizard, _step(wizard, Kind.VERIFICATION)) == ("Passed", "good")
    assert badge(wizard, _step(wizard, Kind.OUTCOME)) == ("Fixed and verified", "good")
    wizard.state = State.NOT_RESOLVED
    assert badge(wizard, _step(wizard, Kind.OUTCOME)) == ("Not fixed", "bad")


@pytest.mark.parametrize(
    ("state", "opens_on"),
    [(State.OPEN, Kind.CALIBRATION), (State.VERIFYING, Kind.VERIFICATION), (State.RESOLVED, Kind.OUTCOME)],
)
def test_the_page_opens_on_the_step_that_needs_the_operator(incident, state, opens_on):
    wizard = _wizard(incident, state)
    assert wizard_context(wizard, None, can_operate=True)["step"].kind == opens_on
    # A step asked for by its position is shown whatever the state.
    assert wizard_context(wizard, 0, can_operate=True)["step"].kind == Kind.DIAGNOSIS


def test_a_step_left_applying_is_settled_by_the_tick_and_the_wizard_can_be_abandoned(incident, people):
    wizard = _wizard(incident)
    step = _step(wizard, Kind.CONFIG)
    # The web process died after marking the step, before the change was linked: nothing was queued.
    WizardStep.objects.filter(pk=step.pk).update(
        status=Status.APPLYING, updated_at=timezone.now() - wizards.ORPHAN_AFTER - timedelta(seconds=1)
    )
    assert wizards.settle_orphaned_steps() == 1
    step.refresh_from_db()
    assert step.status == Status.PENDING and "nothing was pushed" in step.note
    # A change that ended while its completion signal was missed: the step takes its outcome.
    change = ChangeFactory(cluster=incident.cluster, state=ChangeState.SUCCEEDED)
    WizardStep.objects.filter(pk=step.pk).update(status=Status.APPLYING, change=change)
    wizards.abandon(Actor(people["operator"]), wizard, reason="fixed by hand", revision=None)
    step.refresh_from_db()
    wizard.refresh_from_db()
    assert step.status == Status.APPLIED and wizard.state == State.ABANDONED


def test_a_remedy_title_never_claims_what_was_not_computed():
    one = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    assert "only one replica fits" in wizards.remedy_title("R2", one)
    two = {"autoscaling_config": {"min_replicas": 2, "max_replicas": 4}}
    assert (
        wizards.remedy_title("R2", two)
        == "R2: Queue-based autoscaling: target ≈ 1, min replicas ≥ 2, fast upscale, slow downscale"
    )
