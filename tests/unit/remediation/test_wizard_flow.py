"""Starting a remediation wizard and applying its steps: one change for several, a failed change,
conflicts, replans and what vanished meanwhile."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.calibration.models import MemoryCalibration
from apps.changes.models import Change, ChangeState
from apps.remediation import wizards
from apps.remediation.models import Wizard, WizardStep
from tests.conftest import ray_fixture
from tests.factories import ChangeFactory, IncidentFactory
from tests.unit.remediation.wizard_helpers import (
    MIB,
    actor,
    by_remedy,
    finish,
)

pytestmark = pytest.mark.django_db


def test_an_oom_incident_without_a_calibration_opens_a_wizard_that_measures_before_it_computes(people, incident):
    wizard, created = wizards.start(actor(people), incident=incident)
    assert created and wizard.state == "open"
    steps = list(wizard.steps.all())
    assert [s.kind for s in (steps[0], steps[1], steps[-2], steps[-1])] == [
        "diagnosis",
        "calibration",
        "verification",
        "outcome",
    ]
    # OOM-2 (R1, R2), OOM-4 (two kills on one node: R7), OOM-1 (R3, R4, R5), OOM-5 (R8); the queue is
    # already bounded (100), so no R10.
    assert [s.remedy for s in steps if s.remedy] == ["R1", "R2", "R3", "R4", "R5", "R7", "R8"]
    r1, r2 = by_remedy(wizard)["R1"], by_remedy(wizard)["R2"]
    # The kill message gives only a lower bound: it is shown, labelled, and sizes nothing.
    assert wizard.diagnosis["needs_calibration"] and wizard.diagnosis["memory"]["lower_bound"]
    assert wizard.diagnosis["memory"]["reason"].startswith("Lower bound only")
    assert r1.kind == "config" and r1.patch is None and r2.patch is None and r1.values["waiting"]
    assert "run the calibration step first" in r1.values["reasons"]["max_ongoing_requests"]
    with pytest.raises(wizards.WizardError, match="no values yet: run the calibration step first"):
        wizards.apply(actor(people), wizard, [r1.position], revision=None)
    assert not Change.objects.exists()
    assert wizard.diagnosis["causes"][0]["id"] == "OOM-2"
    # The budget comes from the kill message: the node's threshold minus what everything else used.
    assert "Ray kills above 7,232 MiB" in wizard.diagnosis["budget"]["reason"]
    assert by_remedy(wizard)["R3"].kind == "checklist" and "413" in by_remedy(wizard)["R3"].values["guidance"]
    assert incident.timeline.filter(message__contains=f"wizard #{wizard.pk}").exists()


def test_a_calibrated_deployment_gets_values_that_fill_the_budget_with_the_binding_constraint_named(
    people, incident, calibrated
):
    wizard, _ = wizards.start(actor(people), incident=incident)
    assert "calibration" not in [s.kind for s in wizard.steps.all()] and not wizard.diagnosis["needs_calibration"]
    plan, budget = wizard.diagnosis["plan"], wizard.diagnosis["budget"]["bytes_per_node"]
    r1, auto = by_remedy(wizard)["R1"].patch, by_remedy(wizard)["R2"].patch["autoscaling_config"]
    # Each replica at its measured peak, times the replicas allowed, fits the budget; one more would not.
    peak = 200 * MIB + r1["max_ongoing_requests"] * 800 * MIB
    assert auto["max_replicas"] * peak <= budget < (auto["max_replicas"] + 1) * peak
    # The state API's nodes have 2 CPU; Model asks for 0.2 and Echo holds 0.1 × 1: memory binds before CPU.
    assert plan["binding"] == "memory" and "memory binds" in by_remedy(wizard)["R2"].values["reasons"]["max_replicas"]
    assert auto["min_replicas"] == min(2, auto["max_replicas"]) and auto["target_ongoing_requests"] >= 1
    assert f"Calibration #{calibrated.pk}" in wizard.diagnosis["memory"]["reason"]


def test_a_second_operator_joins_the_open_wizard_instead_of_starting_another(people, incident):
    first, _ = wizards.start(actor(people), incident=incident)
    again, created = wizards.start(actor(people, "admin"), incident=incident)
    assert again.pk == first.pk and not created and Wizard.objects.count() == 1


def test_an_incident_a_wizard_resolved_opens_that_wizard_again_instead_of_a_second_one(people, incident):
    first, _ = wizards.start(actor(people), incident=incident)
    Wizard.objects.filter(pk=first.pk).update(state=Wizard.State.RESOLVED)
    incident.status = incident.Status.RESOLVED
    incident.save(update_fields=["status"])

    again, created = wizards.start(actor(people, "admin"), incident=incident)

    assert (again.pk, created, Wizard.objects.count()) == (first.pk, False, 1)


def test_an_incident_resolved_by_hand_may_still_start_a_wizard(people, incident):
    incident.status = incident.Status.RESOLVED
    incident.save(update_fields=["status"])
    wizard, created = wizards.start(actor(people), incident=incident)
    assert created and wizard.incident_id == incident.pk


def test_node_incidents_and_vanished_deployments_cannot_start_a_wizard(people, cluster, incident):
    node = IncidentFactory(
        kind="memory_pressure",
        cluster=cluster,
        application_name="",
        deployment_name="",
        node_ip="10.0.0.1",
        title="pressure",
        started_at=timezone.now(),
    )
    with pytest.raises(wizards.WizardError, match="not one deployment"):
        wizards.start(actor(people), incident=node)
    incident.deployment.removed_at = timezone.now()
    incident.deployment.save()
    with pytest.raises(wizards.WizardError, match="no longer on gpu-prod"):
        wizards.start(actor(people), incident=incident)


def test_applying_r1_and_r2_together_makes_one_change_and_its_success_marks_both_applied(people, incident, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    steps = by_remedy(wizard)
    change = wizards.apply(
        actor(people), wizard, [steps["R1"].position, steps["R2"].position], revision=wizard.revision
    )
    assert change.state == "queued" and change.targets == [{"application": "demo", "deployment": "Model"}]
    assert change.patch["max_ongoing_requests"] == steps["R1"].patch["max_ongoing_requests"]
    assert change.patch["autoscaling_config"] == steps["R2"].patch["autoscaling_config"]
    assert f"Wizard #{wizard.pk}" in change.reason and "R1+R2" in change.reason
    assert {s.status for s in WizardStep.objects.filter(change=change)} == {"applying"}
    wizard.refresh_from_db()
    with pytest.raises(wizards.WizardError, match="being applied"):
        wizards.apply(actor(people), wizard, [steps["R1"].position], revision=wizard.revision)

    finish(change)
    assert {s.status for s in WizardStep.objects.filter(change=change)} == {"applied"}
    assert incident.timeline.filter(message__contains=f"change #{change.pk} (R1, R2) applied").exists()


def test_a_failed_change_leaves_the_steps_failed_and_applicable_again(people, incident, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    r1 = by_remedy(wizard)["R1"]
    change = wizards.apply(actor(people), wizard, [r1.position], revision=wizard.revision)
    Change.objects.filter(pk=change.pk).update(error="verification timed out")
    finish(change, ChangeState.ROLLED_BACK)
    r1.refresh_from_db()
    assert r1.status == "failed" and "rolled back" in r1.note and "verification timed out" in r1.note
    wizard.refresh_from_db()
    assert wizards.apply(actor(people), wizard, [r1.position], revision=wizard.revision).pk != change.pk


def test_an_operator_acting_on_an_old_page_gets_a_conflict_naming_who_moved_it(people, incident):
    wizard, _ = wizards.start(actor(people), incident=incident)
    seen = wizard.revision
    wizards.skip(
        actor(people, "admin"), wizard, by_remedy(wizard)["R5"].position, reason="no blobs here", revision=seen
    )
    with pytest.raises(wizards.WizardConflict, match=r"revision .* last by admin"):
        wizards.apply(actor(people), wizard, [by_remedy(wizard)["R1"].position], revision=seen)
    assert not Change.objects.exists()


def test_a_config_changed_meanwhile_makes_the_wizard_replan_instead_of_apply(people, incident, live, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    old_revision = wizard.revision
    live.model()["max_queued_requests"] = -1  # someone removed the queue bound meanwhile
    r1 = by_remedy(wizard)["R1"]
    with pytest.raises(wizards.WizardStale, match="max_queued_requests"):
        wizards.apply(actor(people), wizard, [r1.position], revision=old_revision)
    assert not Change.objects.exists()
    wizard.refresh_from_db()
    assert wizard.revision > old_revision and wizard.basis["settings"]["max_queued_requests"] == -1
    # The re-plan noticed the now unbounded queue: R10 joins, before verification.
    steps = list(wizard.steps.all())
    assert "R10" in [s.remedy for s in steps] and steps[-2].kind == "verification"
    assert by_remedy(wizard)["R1"].status == "pending"
    assert wizards.apply(actor(people), wizard, [r1.position], revision=wizard.revision).state == "queued"


def test_a_deployment_deleted_mid_wizard_is_reported_and_nothing_is_applied(people, incident, live, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    del live.payload["applications"]["demo"]["deployments"]["Model"]
    r1 = by_remedy(wizard)["R1"]
    with pytest.raises(wizards.WizardError, match="no longer exists on gpu-prod"):
        wizards.apply(actor(people), wizard, [r1.position], revision=wizard.revision)
    r1.refresh_from_db()
    assert r1.status == "pending" and not Change.objects.exists()


def test_a_calibration_of_a_deployment_deleted_mid_wizard_is_refused_and_nothing_is_submitted(
    people, incident, live, use_replay
):
    wizard, _ = wizards.start(actor(people), incident=incident)
    del live.payload["applications"]["demo"]["deployments"]["Model"]
    with pytest.raises(wizards.WizardError, match="no longer exists on gpu-prod"):
        wizards.calibrate(actor(people), wizard, revision=None)
    assert not MemoryCalibration.objects.exists() and not [r for r in use_replay.requests if r.url.path == "/api/jobs/"]
    assert wizard.steps.get(kind="calibration").status == "pending"


def test_a_cluster_with_no_cpu_free_for_a_calibration_replica_says_so_and_nothing_is_submitted(
    people, incident, use_replay
):
    busy = ray_fixture("cluster_status.json")
    report = busy["data"]["clusterStatus"]["loadMetricsReport"]
    for usage in [report["usage"], *report["usageByNode"].values()]:
        usage["CPU"] = [2.0, 2.0]
    use_replay.routes["/api/cluster_status"] = busy
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    wizard, _ = wizards.start(actor(people), incident=incident)
    with pytest.raises(wizards.WizardError, match=r"Nothing was measured and nothing was pushed: .*CPU free"):
        wizards.calibrate(actor(people), wizard, revision=None)
    assert not MemoryCalibration.objects.exists() and not [r for r in use_replay.requests if r.url.path == "/api/jobs/"]


def test_a_failed_calibration_leaves_the_values_uncomputed_and_says_why(people, incident, use_replay):
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    wizard, _ = wizards.start(actor(people), incident=incident)
    step = wizards.calibrate(actor(people), wizard, revision=None)
    MemoryCalibration.objects.filter(pk=step.calibration_id).update(
        state="failed",
        finished_at=timezone.now(),
        error="The representative request GET /demo answered 404 at concurrency 1",
    )
    assert wizards.settle_calibration(wizard.pk)
    step.refresh_from_db()
    assert step.status == "failed" and "answered 404" in step.note
    assert by_remedy(wizard)["R1"].patch is None
    assert incident.timeline.filter(message__contains="answered 404").exists()


@pytest.mark.django_db(transaction=True)
def test_the_change_is_sent_to_the_worker_only_once_its_steps_are_linked(people, incident, calibrated, monkeypatch):
    """A worker that finishes the change at once still finds the steps: queue and link commit together."""
    from apps.core import jobs

    linked_when_sent = []

    def send(job, change_id, **options):
        linked_when_sent.append(WizardStep.objects.filter(change_id=change_id, status="applying").count())
        return True

    monkeypatch.setattr(jobs, "enqueue", send)
    wizard, _ = wizards.start(actor(people), incident=incident)
    steps = by_remedy(wizard)
    wizards.apply(actor(people), wizard, [steps["R1"].position, steps["R2"].position], revision=wizard.revision)
    assert linked_when_sent == [2]


def test_a_refused_queue_leaves_no_step_applying_and_nothing_linked(people, incident, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    r1 = by_remedy(wizard)["R1"]
    other = ChangeFactory(cluster=incident.cluster, state=ChangeState.VERIFYING)
    with pytest.raises(wizards.WizardError, match=f"#{other.pk} is already in progress"):
        wizards.apply(actor(people), wizard, [r1.position], revision=wizard.revision)
    r1.refresh_from_db()
    assert r1.status == "pending" and r1.change_id is None
