"""A web process that dies at each point of a wizard's apply: no step stays applying past one tick,
nothing reaches the worker unless its steps are linked to it, nothing is pushed twice, and the
operator's next apply works."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.changes import protocol
from apps.changes.models import Change, ChangeState
from apps.core import jobs
from apps.remediation import wizards
from apps.remediation.models import WizardStep
from tests.unit.remediation.wizard_helpers import actor, by_remedy, finish

pytestmark = pytest.mark.django_db

Status = WizardStep.Status


class Died(BaseException):
    """The process ends here: no except clause of ours runs, and the open transaction never commits."""


def _die(*args, **kwargs):
    raise Died


# Each point of the hand-off, in order: after the steps were marked applying, while the live config
# is read and compared, while the change is planned, once it is planned (as the transaction that
# queues and links it opens), and on the audit row, the last thing that transaction writes after
# the change is queued and its steps linked.
POINTS = [
    (wizards, "_live_effective"),
    (wizards, "_stale_settings"),
    (wizards, "_plan"),
    (protocol, "request_apply"),
    (wizards, "record"),
]


@pytest.mark.parametrize(("owner", "name"), POINTS, ids=[name for _, name in POINTS])
def test_a_web_process_dying_inside_apply_leaves_nothing_queued_and_the_tick_settles_its_steps(
    people, incident, calibrated, monkeypatch, django_capture_on_commit_callbacks, owner, name
):
    sent: list[int] = []
    monkeypatch.setattr(jobs, "enqueue", lambda job, change_id, **options: sent.append(change_id) or True)
    wizard, _ = wizards.start(actor(people), incident=incident)
    steps = by_remedy(wizard)
    positions = [steps["R1"].position, steps["R2"].position]
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, _die)

    # What would run once the request's transaction commits; a dying process never gets there, and
    # what was registered inside its rolled-back block is dropped.
    with pytest.raises(Died), django_capture_on_commit_callbacks(execute=True) as pending:
        wizards.apply(actor(people), wizard, positions, revision=wizard.revision)
    assert pending == []
    monkeypatch.setattr(owner, name, real)

    # Nothing reached the worker, and no change waits queued for one: a planned change at most.
    assert sent == [] and not Change.objects.filter(state=ChangeState.QUEUED).exists()
    assert set(Change.objects.values_list("state", flat=True)) <= {ChangeState.PLANNED}
    applying = WizardStep.objects.filter(wizard=wizard, status=Status.APPLYING)
    assert applying.count() == 2 and not applying.exclude(change=None).exists()

    # One tick after the hand-off window: the steps are To do again, saying nothing was pushed.
    applying.update(updated_at=timezone.now() - wizards.ORPHAN_AFTER - timedelta(seconds=1))
    assert wizards.settle_orphaned_steps() == 2
    for step in WizardStep.objects.filter(wizard=wizard, position__in=positions):
        assert step.status == Status.PENDING and "nothing was pushed" in step.note

    # The operator applies again: one change, queued once, its steps linked.
    wizard.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        change = wizards.apply(actor(people), wizard, positions, revision=wizard.revision)
    assert sent == [change.pk] and change.state == ChangeState.QUEUED
    assert WizardStep.objects.filter(change=change, status=Status.APPLYING).count() == 2
    finish(change)
    assert WizardStep.objects.filter(change=change, status=Status.APPLIED).count() == 2


def test_a_change_whose_end_the_wizard_missed_is_settled_by_one_tick(people, incident, calibrated, monkeypatch):
    """The worker was killed after the change ended, before its completion signal reached the wizard."""
    monkeypatch.setattr(jobs, "enqueue", lambda job, change_id, **options: True)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r1 = by_remedy(wizard)["R1"]
    change = wizards.apply(actor(people), wizard, [r1.position], revision=wizard.revision)
    Change.objects.filter(pk=change.pk).update(state=ChangeState.SUCCEEDED, finished_at=timezone.now())

    assert wizards.settle_orphaned_steps() == 1
    r1.refresh_from_db()
    assert r1.status == Status.APPLIED
    assert incident.timeline.filter(message__contains=f"change #{change.pk} (R1) applied").exists()
    # A second tick finds nothing left to settle.
    assert wizards.settle_orphaned_steps() == 0
