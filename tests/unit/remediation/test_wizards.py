"""Remediation wizards on payloads replayed from a real cluster: steps from the causes, computed
values, applying through the change protocol, stale and concurrent use, verification, outcome."""

from __future__ import annotations

import http.server
import threading
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.calibration import services as calibration
from apps.calibration.curve import Curve
from apps.calibration.models import MemoryCalibration
from apps.changes.models import Change, ChangeState
from apps.changes.signals import change_finished
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents import services as incidents
from apps.incidents.models import Incident, OomKillRecord, SignalWindow
from apps.maintenance.models import RecycleSchedule
from apps.remediation import findings, remedy_checks, verification, wizards
from apps.remediation.models import Finding, Wizard, WizardStep
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory, IncidentFactory

pytestmark = pytest.mark.django_db
LIVE = "serve_applications_oom_t2_demo_via_ingress_after_recovery.json"
DEAD = "state_actors_dead_oom_t2_demo_via_ingress_detail.json"


class Live:
    """The dashboard's Serve payload, editable as if someone changed the cluster."""

    def __init__(self):
        self.payload = ray_fixture(LIVE)

    def __call__(self, request):
        import httpx

        return httpx.Response(200, json=self.payload)

    def model(self) -> dict:
        return self.payload["applications"]["demo"]["deployments"]["Model"]["deployment_config"]


@pytest.fixture
def live(use_replay):
    live = Live()
    use_replay.routes["/api/serve/applications/"] = live
    use_replay.routes["/api/v0/actors"] = DEAD
    use_replay.routes["/api/v0/nodes"] = "state_nodes.json"
    use_replay.routes["/nodes"] = "nodes_view_summary.json"
    return live


@pytest.fixture
def cluster(team, live):
    cluster = ClusterFactory(name="gpu-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    return Cluster.objects.get(pk=cluster.pk)


@pytest.fixture
def incident(cluster):
    incidents.detect(cluster.pk)
    return Incident.objects.get(application_name="demo", deployment_name="Model", kind="oom_kill")


MIB = 2**20


def calibrate(
    cluster, *, baseline_mib=200, per_request_mib=800, levels=(1, 2, 4), service_s=(1.0, 1.0, 1.02)
) -> MemoryCalibration:
    """A finished calibration of demo/Model, as the job reports one."""
    deployment = incidents_deployment(cluster)
    return MemoryCalibration.objects.create(
        deployment=deployment,
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        submission_id=f"cal-{levels}",
        state="succeeded",
        axis="concurrency",
        device="cpu",
        shape="handle",
        baseline_bytes=baseline_mib * MIB,
        levels=list(levels),
        points=[
            {"x": k, "peak_bytes": (baseline_mib + k * per_request_mib) * MIB, "service_s": t}
            for k, t in zip(levels, service_s)
        ],
        monotone=True,
        finished_at=timezone.now(),
    )


def incidents_deployment(cluster):
    from apps.fleet.models import Deployment

    return Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")


@pytest.fixture
def calibrated(cluster):
    return calibrate(cluster)


def actor(people, who="operator") -> Actor:
    return Actor(user=people[who], via="api")


def by_remedy(wizard: Wizard) -> dict[str, WizardStep]:
    return {s.remedy: s for s in wizard.steps.all() if s.remedy}


def finish(change: Change, state=ChangeState.SUCCEEDED) -> None:
    Change.objects.filter(pk=change.pk).update(state=state, started_at=timezone.now(), finished_at=timezone.now())
    change.refresh_from_db()
    change_finished.send(sender=Change, change=change)


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
    with pytest.raises(wizards.WizardError, match="Nothing was measured and nothing was pushed: .*CPU free"):
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


def test_code_level_steps_are_confirmed_or_skipped_with_a_reason_not_applied(people, incident):
    wizard, _ = wizards.start(actor(people), incident=incident)
    steps = by_remedy(wizard)
    with pytest.raises(wizards.WizardError, match="code-level remedy"):
        wizards.apply(actor(people), wizard, [steps["R4"].position], revision=None)
    with pytest.raises(wizards.WizardError, match="Say why"):
        wizards.skip(actor(people), wizard, steps["R4"].position, reason=" ", revision=None)
    assert (
        wizards.confirm(
            actor(people), wizard, steps["R4"].position, note="batches by token sum since v2", revision=None
        ).status
        == "done"
    )


def test_verification_needs_something_done_then_an_oom_kill_fails_it_at_once(people, incident, cluster, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    with pytest.raises(wizards.WizardError, match="nothing to verify"):
        verification.start(actor(people), wizard, window_s=60, revision=None)
    change = wizards.apply(actor(people), wizard, [by_remedy(wizard)["R1"].position], revision=None)
    finish(change)
    wizard = verification.start(actor(people), wizard, window_s=60, revision=None)
    # demo/Model's own kill, and modelonly's small replica killed beside it while it held 5.48 GB.
    assert wizard.state == "verifying" and wizard.before["oom_kills"] == 2
    assert verification.evaluate(wizard.pk) == "running"

    OomKillRecord.objects.create(incident=incident, actor_id="new-kill", replica="abc", message="killed again")
    assert verification.evaluate(wizard.pk) == "failed"
    wizard.refresh_from_db()
    assert wizard.state == "not_resolved" and "1 OOM kill(s) during verification" in wizard.outcome
    assert [n["id"] for n in wizard.next_steps][:3] == ["R2", "R3", "R4"]
    incident.refresh_from_db()
    assert incident.status == "open" and incident.timeline.filter(message__contains="did not fix it").exists()


def test_a_quiet_window_under_traffic_resolves_the_incident_with_the_changes_linked(
    people, incident, cluster, calibrated
):
    wizard, _ = wizards.start(actor(people), incident=incident)
    steps = by_remedy(wizard)
    change = wizards.apply(actor(people), wizard, [steps["R1"].position, steps["R2"].position], revision=None)
    finish(change)
    wizard = verification.start(actor(people), wizard, window_s=60, revision=None)
    start = wizard.verify_started_at.timestamp()
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[
            {"t": start + 10 * i, "p50": 120, "p99": 400, "rps": 4.0, "errors": 0, "ongoing": 2, "queued": 0}
            for i in range(1, 6)
        ],
    )
    assert verification.evaluate(wizard.pk, now=wizard.verify_ends_at + timedelta(seconds=1)) == "passed"
    wizard.refresh_from_db()
    assert wizard.state == "resolved" and wizard.after["oom_kills"] == 0 and wizard.after["rps_mean"] == 4.0
    incident.refresh_from_db()
    assert incident.status == "resolved"
    note = incident.timeline.filter(message__startswith=f"Verified by wizard #{wizard.pk}").get()
    assert f"#{change.pk}" in note.message
    assert wizard.steps.get(kind="outcome").check_result == {"resolved": True, "changes": [change.pk]}


def test_a_window_without_traffic_is_inconclusive_and_can_be_run_again(people, incident, cluster):
    wizard, _ = wizards.start(actor(people), incident=incident)
    wizards.confirm(actor(people), wizard, by_remedy(wizard)["R4"].position, revision=None)
    wizard = verification.start(actor(people), wizard, window_s=60, revision=None)
    start = wizard.verify_started_at.timestamp()
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[{"t": start + 5, "rps": 0, "errors": 0}],
    )
    assert verification.evaluate(wizard.pk, now=wizard.verify_ends_at) == "inconclusive"
    wizard.refresh_from_db()
    assert wizard.state == "open"
    assert verification.start(actor(people), wizard, window_s=60, revision=wizard.revision).state == "verifying"


def test_a_latency_fix_must_bring_p99_down_by_a_fifth():
    before = {"oom_kills": 0, "p99_ms": 1000, "points": 5}
    after = {"oom_kills": 0, "p99_ms": 900, "points": 5, "rps_mean": 3, "queued_max": 0, "error_rate": 0}
    assert verification.verdict("latency_spike", before, after, window_over=True)[0] == "failed"
    # Replica processing time alone cannot pass a latency fix: clients' end-to-end p99 must be seen.
    assert verification.verdict("latency_spike", before, after | {"p99_ms": 700}, window_over=True)[0] == "inconclusive"
    clients = {
        "client_requests": 600,
        "client_failed": 0,
        "client_failed_share": 0.0,
        "client_p50_ms": 300,
        "client_p99_ms": 800,
    }
    assert (
        verification.verdict("latency_spike", before, after | {"p99_ms": 700} | clients, window_over=True)[0]
        == "passed"
    )
    assert verification.verdict("oom_kill", before, after | {"p99_ms": 1100}, window_over=True)[0] == "passed"


def test_a_finding_starts_a_wizard_with_its_remedy_and_its_companions(people, cluster, live):
    live.model()["ray_actor_options"]["num_gpus"] = 1
    sync.sync_cluster(cluster.pk)
    findings.recompute(cluster.pk)
    finding = Finding.objects.get(rule="gpu-concurrency", application_name="demo")
    wizard, _ = wizards.start(actor(people), finding=finding)
    assert [s.remedy for s in wizard.steps.all() if s.remedy][:2] == ["R1", "R2"]
    assert wizard.diagnosis["evidence"]["rule"] == "gpu-concurrency"


class ProbeTarget(http.server.BaseHTTPRequestHandler):
    limit = 1000

    def do_POST(self):
        size = int(self.headers.get("Content-Length", 0))
        self.rfile.read(size)
        self.send_response(413 if size > self.limit else 200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def serve_proxy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ProbeTarget)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_input_cap_check_sends_an_oversized_request_and_wants_a_4xx(people, incident, cluster, serve_proxy):
    Cluster.objects.filter(pk=cluster.pk).update(serve_url=serve_proxy)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    step = remedy_checks.run(actor(people), wizard, r3.position, params={"size": 5000, "path": "/demo"}, revision=None)
    assert step.status == "passed" and step.check_result["status"] == 413
    ProbeTarget.limit = 10**9
    try:
        step = remedy_checks.run(
            actor(people), Wizard.objects.get(pk=wizard.pk), r3.position, params={"size": 5000}, revision=None
        )
    finally:
        ProbeTarget.limit = 1000
    assert step.status == "check_failed" and "nothing caps input size" in step.check_result["why"]
    with pytest.raises(wizards.WizardError, match="between 1 and"):
        remedy_checks.run(actor(people), wizard, r3.position, params={"size": 0 - 5}, revision=None)


def test_the_recycle_check_passes_once_a_schedule_exists(people, incident):
    wizard, _ = wizards.start(actor(people), incident=incident)
    r8 = by_remedy(wizard)["R8"]
    assert remedy_checks.run(actor(people), wizard, r8.position, revision=None).status == "check_failed"
    RecycleSchedule.objects.create(
        deployment=wizard.deployment, every_hours=6, next_run_at=timezone.now() + timedelta(hours=6)
    )
    assert remedy_checks.run(actor(people), wizard, r8.position, revision=None).status == "passed"
    with pytest.raises(wizards.WizardError, match="no automatic check"):
        remedy_checks.run(actor(people), wizard, by_remedy(wizard)["R4"].position, revision=None)


# --- API ------------------------------------------------------------------------------------


def test_automation_drives_a_wizard_through_the_api(api_as, incident, use_replay):
    operator = api_as("operator")
    response = operator.post(
        "/api/v1/wizards/",
        {"incident": incident.pk, "verification_window_s": 60, "failure_objective": 0.02},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["failure_objective"] == 0.02 and body["steps"][1]["kind"] == "calibration"
    assert operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").status_code == 200
    # The first step measures memory: a calibration job on the cluster, with Fleetdeck's default request.
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    started = operator.post(f"/api/v1/wizards/{body['id']}/calibrate/", {"revision": body["revision"]}, format="json")
    assert started.status_code == 202, started.content
    step = started.json()["steps"][1]
    assert step["status"] == "applying" and step["calibration"]
    run = MemoryCalibration.objects.get(pk=step["calibration"])
    assert run.deployment_name == "Model" and run.state == "pending"
    # The job reports its curve (what polling stores); the wizard computes its values from it.
    MemoryCalibration.objects.filter(pk=run.pk).update(
        state="succeeded",
        axis="concurrency",
        device="cpu",
        baseline_bytes=200 * MIB,
        finished_at=timezone.now(),
        points=[{"x": k, "peak_bytes": (200 + 800 * k) * MIB, "service_s": 1.0} for k in (1, 2, 4)],
    )
    body = operator.post(f"/api/v1/wizards/{body['id']}/replan/", {}, format="json").json()
    assert body["steps"][1]["status"] == "done" and not body["diagnosis"]["needs_calibration"]
    steps = {s["remedy"]: s for s in body["steps"] if s["remedy"]}
    assert (
        steps["R1"]["patch"]["max_ongoing_requests"] >= 1
        and steps["R2"]["patch"]["autoscaling_config"]["max_replicas"] >= 1
    )
    # A measurement is not a fix: there is nothing to verify yet.
    early = operator.post(f"/api/v1/wizards/{body['id']}/verify/", {"window_s": 60}, format="json")
    assert early.status_code == 400 and "nothing to verify" in early.json()["detail"][0]
    applied = operator.post(
        f"/api/v1/wizards/{body['id']}/apply/",
        {"steps": [steps["R1"]["position"], steps["R2"]["position"]], "revision": body["revision"]},
        format="json",
    )
    assert applied.status_code == 202, applied.content
    assert {s["status"] for s in applied.json()["steps"] if s["remedy"] in ("R1", "R2")} == {"applying"}
    stale = operator.post(
        f"/api/v1/wizards/{body['id']}/skip/",
        {"step": steps["R5"]["position"], "note": "x", "revision": body["revision"]},
        format="json",
    )
    assert stale.status_code == 409 and "moved on" in stale.json()["detail"][0]
    refused = operator.post(f"/api/v1/wizards/{body['id']}/verify/", {"window_s": 60}, format="json")
    assert refused.status_code == 400 and "still being applied" in refused.json()["detail"][0]
    assert operator.get(f"/api/v1/wizards/?incident={incident.pk}").json()["count"] == 1


def test_wizard_roles_viewers_read_operators_act_outsiders_see_nothing(api_as, incident):
    wizard_id = api_as("operator").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()["id"]
    assert api_as("viewer").get(f"/api/v1/wizards/{wizard_id}/").status_code == 200
    assert (
        api_as("viewer").post(f"/api/v1/wizards/{wizard_id}/abandon/", {"reason": "x"}, format="json").status_code
        == 403
    )
    assert api_as("outsider").get(f"/api/v1/wizards/{wizard_id}/").status_code == 404
    assert api_as("outsider").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").status_code == 400
    assert api_as("viewer").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").status_code == 403
    abandoned = api_as("admin").post(
        f"/api/v1/wizards/{wizard_id}/abandon/", {"reason": "handled by hand"}, format="json"
    )
    assert abandoned.json()["state"] == "abandoned" and "handled by hand" in abandoned.json()["outcome"]


def test_the_schema_documents_the_wizard_actions(api_as):
    schema = api_as("viewer").get(reverse("schema"), {"format": "json"}).json()
    paths = schema["paths"]
    assert {
        "/api/v1/wizards/",
        "/api/v1/wizards/{id}/apply/",
        "/api/v1/wizards/{id}/verify/",
        "/api/v1/wizards/{id}/check/",
    } <= set(paths)


# --- UI -------------------------------------------------------------------------------------


def test_an_operator_walks_the_wizard_in_the_ui_step_by_step(client, people, incident):
    client.force_login(people["operator"])
    page = client.get(reverse("incidents:detail", args=[incident.pk])).content.decode()
    assert "Fix with a wizard" in page
    response = client.post(reverse("remediation:wizard_start"), {"incident": incident.pk})
    wizard = Wizard.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("remediation:wizard", args=[wizard.pk])
    page = client.get(response["Location"]).content.decode()
    # The first unsettled step opens: the calibration, with a form for the representative request.
    assert (
        "Measure memory per request (calibration)" in page
        and "Representative request" in page
        and ">Calibrate<" in page
    )
    assert "Apply R1" not in page
    # Measured meanwhile (from the deployment page): recomputing settles the step and gives R1 its values.
    calibrate(incident.cluster)
    replanned = client.post(
        reverse("remediation:wizard_action", args=[wizard.pk, "replan"]),
        {"revision": Wizard.objects.get().revision, "step": 0},
        HTTP_HX_REQUEST="true",
    )
    assert b'role="alert"' not in replanned.content, replanned.content.decode()[:2000]
    wizard.refresh_from_db()
    assert wizard.steps.get(kind="calibration").status == "done"
    page = client.get(reverse("remediation:wizard", args=[wizard.pk])).content.decode()
    # Then R1 opens, with its computed value, reason and diff.
    r1 = by_remedy(wizard)["R1"].patch["max_ongoing_requests"]
    assert "R1: Cap per-replica concurrency" in page and "Why this value" in page
    assert f"+  &quot;max_ongoing_requests&quot;: {r1}" in page and "Apply R1 + R2 as one change" in page
    steps = by_remedy(wizard)
    partial = client.get(
        reverse("remediation:wizard", args=[wizard.pk]), {"step": steps["R3"].position}, HTTP_HX_REQUEST="true"
    )
    assert b"<html" not in partial.content and b"Run the automatic check" in partial.content
    applied = client.post(
        reverse("remediation:wizard_action", args=[wizard.pk, "apply"]),
        {
            "steps": [steps["R1"].position, steps["R2"].position],
            "revision": wizard.revision,
            "step": steps["R1"].position,
        },
        HTTP_HX_REQUEST="true",
    )
    assert applied.status_code == 200 and b"Applying" in applied.content and b'hx-trigger="every 2s"' in applied.content
    # The same click from a page loaded before: the conflict is shown, nothing is applied twice.
    again = client.post(
        reverse("remediation:wizard_action", args=[wizard.pk, "skip"]),
        {"step": steps["R5"].position, "reason": "x", "revision": wizard.revision},
        HTTP_HX_REQUEST="true",
    )
    assert b"moved on since you loaded it" in again.content and Change.objects.count() == 1
    assert by_remedy(wizard)["R5"].status == "pending"


def test_viewers_see_the_wizard_without_its_buttons_and_outsiders_not_at_all(client, people, incident):
    wizard, _ = wizards.start(actor(people), incident=incident)
    client.force_login(people["viewer"])
    page = client.get(reverse("remediation:wizard", args=[wizard.pk])).content.decode()
    assert "Diagnosis" in page and "Apply R1" not in page and "Abandon" not in page
    assert client.post(reverse("remediation:wizard_action", args=[wizard.pk, "replan"])).status_code == 403
    assert client.post(reverse("remediation:wizard_start"), {"incident": incident.pk}).status_code == 403
    client.force_login(people["outsider"])
    assert client.get(reverse("remediation:wizard", args=[wizard.pk])).status_code == 404
    assert (
        reverse("remediation:wizard", args=[wizard.pk])
        not in client.get(reverse("remediation:wizards")).content.decode()
    )


def test_in_flight_readings_near_the_kill_give_only_a_lower_bound_that_sizes_nothing(people, incident, cluster):
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[{"t": 1, "ongoing": 2, "queued": 0}, {"t": 2, "ongoing": 4, "queued": 3}],
    )
    replicas = incident.evidence["settings_at_detection"]["running_replicas"]
    wizard, _ = wizards.start(actor(people), incident=incident)
    memory = wizard.diagnosis["memory"]
    # 5.48 GiB over the 4 requests the deployment held (per running replica): admitted, not resident.
    assert memory["source"] == "oom-kill" and memory["lower_bound"]
    assert memory["per_request_bytes"] == int(5.48 * 2**30 / (4 / replicas))
    assert wizard.diagnosis["needs_calibration"] and wizard.diagnosis["conservative"]
    assert all(by_remedy(wizard)[r].patch is None for r in ("R1", "R2"))
    assert wizard.diagnosis["load"]["peak_in_flight"] == 7


def test_traffic_heavier_than_the_calibration_lowers_the_values_and_the_page_says_why(
    client, people, incident, cluster, calibrated
):
    baseline = wizards.start(actor(people), incident=incident)[0]
    before = (
        by_remedy(baseline)["R1"].patch["max_ongoing_requests"],
        by_remedy(baseline)["R2"].patch["autoscaling_config"]["max_replicas"],
    )
    wizards.abandon(actor(people), baseline, reason="measure again with traffic", revision=None)
    # Ray's per-process memory: 300 MB per replica at rest, then 2 replicas holding 3 GB over 2 requests.
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[
            {"t": 1, "ongoing": 0.0, "queued": 0, "replicas": 2, "rss_mb": 600.0},
            {"t": 6, "ongoing": 2.0, "queued": 0, "replicas": 2, "rss_mb": 3600.0},
        ],
    )
    wizard, _ = wizards.start(actor(people), incident=incident)
    seen = wizard.diagnosis["observed"]
    assert seen["lower_bound"] and seen["per_request_bytes"] == 1500 * 10**6 and seen["baseline_bytes"] == 300 * 10**6
    assert "Traffic since showed at least" in wizard.diagnosis["memory"]["reason"]
    after = (
        by_remedy(wizard)["R1"].patch["max_ongoing_requests"],
        by_remedy(wizard)["R2"].patch["autoscaling_config"]["max_replicas"],
    )
    assert after[0] * after[1] < before[0] * before[1]
    client.force_login(people["viewer"])
    diagnosis = wizard.steps.get(kind="diagnosis").position
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": diagnosis}).content.decode()
    assert "Memory in traffic" in page and "at least 1.4\xa0GiB per request" in page


# --- R4 from a token-sum calibration ------------------------------------------------------------


TOKEN_CAPS = {"max_prompt_tokens": 512, "max_tokens_cap": 128}


def run_with_user_config(live, cluster, user_config: dict) -> None:
    """The Model deployment now runs `user_config` (submitted and effective), and Fleetdeck has synced it."""
    live.model()["user_config"] = user_config
    entry = next(
        d for d in live.payload["applications"]["demo"]["deployed_app_config"]["deployments"] if d["name"] == "Model"
    )
    entry["user_config"] = dict(user_config)
    assert sync.sync_cluster(cluster.pk).ok


def token_calibration(deployment, mib_per_token: int = 1, baseline_mib: int = 300) -> Curve:
    """A finished token-sum calibration: `mib_per_token` per token of a batch, on top of the replica at rest."""
    points = [{"x": n, "peak_bytes": (baseline_mib + n * mib_per_token) * MIB} for n in (256, 1024, 4096)]
    row = MemoryCalibration.objects.create(
        deployment=deployment,
        cluster=deployment.application.cluster,
        application_name="demo",
        deployment_name="Model",
        submission_id=f"token-{MemoryCalibration.objects.count()}",
        state="succeeded",
        axis="token_sum",
        device="cpu",
        baseline_bytes=baseline_mib * MIB,
        points=points,
        monotone=True,
        levels=[256, 1024, 4096],
        finished_at=timezone.now(),
    )
    return calibration.curve_of(row)


def share_of(wizard: Wizard) -> int:
    """One replica's share of the node budget, as the diagnosis found it."""
    return wizard.diagnosis["budget"]["bytes_per_node"] // by_remedy(wizard)["R1"].values["replicas_per_node"]


def test_a_token_sum_calibration_gives_r4_the_largest_fitting_batch_limit_applied_as_a_user_config_change(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "hold_s": 0.05, **TOKEN_CAPS, "max_batch_tokens": 65536})
    curve = token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    # A request is priced at its caps: 640 tokens at 1 MiB each.
    memory = wizard.diagnosis["memory"]
    assert memory["per_request_bytes"] == 640 * MIB and "max_prompt_tokens 512 + max_tokens_cap 128" in memory["reason"]
    r4 = by_remedy(wizard)["R4"]
    limit = r4.patch["user_config"]["max_batch_tokens"]
    assert r4.kind == "config" and r4.status == "pending" and r4.patch == {"user_config": {"max_batch_tokens": limit}}
    assert curve.peak_at(limit) <= share_of(wizard) < curve.peak_at(limit + 1)
    assert f"{limit}: a batch of {limit} tokens" in r4.values["reasons"]["max_batch_tokens"]

    change = wizards.apply(actor(people), wizard, [r4.position], revision=wizard.revision)
    assert change.patch == {"user_config": {"max_batch_tokens": limit}}
    model = next(d for d in change.new_config["applications"][0]["deployments"] if d["name"] == "Model")
    # Serve replaces user_config wholesale: the pushed one keeps every other key.
    assert model["user_config"] == {"alloc_mb": 0, "hold_s": 0.05, **TOKEN_CAPS, "max_batch_tokens": limit}


def test_a_batch_limit_already_lower_than_computed_leaves_r4_not_applicable(people, incident, live, cluster):
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 700})
    token_calibration(incident.deployment)
    r4 = by_remedy(wizards.start(actor(people), incident=incident)[0])["R4"]
    assert (
        r4.kind == "config" and r4.status == "not_applicable" and r4.patch == {"user_config": {"max_batch_tokens": 700}}
    )
    assert "It is already 700, lower than computed: kept." in r4.values["reasons"]["max_batch_tokens"]


def test_without_a_max_batch_tokens_key_r4_stays_a_checklist_that_shows_the_computed_limit(
    client, people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "hold_s": 0.05})
    curve = token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r4 = by_remedy(wizard)["R4"]
    assert r4.kind == "checklist" and r4.patch is None and "calibration_batch(token_sum)" in r4.values["guidance"]
    [row] = r4.values["computed"]
    # No caps: a request is taken to be as large as the largest calibrated batch (conservative).
    assert "as large as the largest calibrated batch, 4096 tokens" in wizard.diagnosis["memory"]["reason"]
    assert row["option"] == "max_batch_tokens" and curve.peak_at(row["value"]) <= share_of(wizard) < curve.peak_at(
        row["value"] + 1
    )
    client.force_login(people["viewer"])
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": r4.position}).content.decode()
    assert (
        "Computed value" in page and f"<strong>{row['value']}</strong>" in page and row["reason"].split(";")[0] in page
    )


def test_a_token_calibration_made_after_the_start_turns_r4_into_a_config_step_on_replan(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 65536})
    wizard, _ = wizards.start(actor(people), incident=incident)
    assert by_remedy(wizard)["R4"].kind == "checklist" and "computed" not in by_remedy(wizard)["R4"].values
    token_calibration(incident.deployment)
    wizards.replan(actor(people), wizard, revision=wizard.revision)
    r4 = by_remedy(wizard)["R4"]
    assert r4.kind == "config" and r4.status == "pending" and r4.patch["user_config"]["max_batch_tokens"] < 65536
    assert [s.remedy for s in wizard.steps.all() if s.remedy].count("R4") == 1


def test_changed_token_caps_make_the_wizard_replan_instead_of_apply(people, incident, live, cluster):
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 65536})
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    live.model()["user_config"] = {**TOKEN_CAPS, "max_tokens_cap": 1024, "max_batch_tokens": 65536}
    with pytest.raises(wizards.WizardStale, match="user_config"):
        wizards.apply(actor(people), wizard, [by_remedy(wizard)["R4"].position], revision=wizard.revision)
    wizard.refresh_from_db()
    # Re-planned from the live caps: a request now brings 1,536 tokens.
    assert wizard.diagnosis["memory"]["per_request_bytes"] == 1536 * MIB and not Change.objects.exists()


# --- R3 where the deployment reads its input caps from user_config ------------------------------


def test_input_caps_read_from_user_config_make_r3_a_config_step_sized_from_a_token_calibration(
    people, incident, live, cluster
):
    # 10,240 tokens at 1 MiB each: not even one such request fits the node's budget.
    run_with_user_config(
        live, cluster, {"alloc_mb": 0, "max_prompt_tokens": 8192, "max_tokens_cap": 2048, "max_batch_tokens": 65536}
    )
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.status == "pending"
    caps = r3.patch["user_config"]
    assert set(caps) == {"max_prompt_tokens", "max_tokens_cap"}
    # The most tokens a replica's share holds at R1's concurrency, less the replica at rest, at 1 MiB a token; split 4:1
    # as before.
    plan, budget = wizard.diagnosis["plan"], wizard.diagnosis["budget"]["bytes_per_node"]
    fit = (budget // plan["per_node"] - wizard.diagnosis["memory"]["baseline_bytes"]) // (plan["concurrency"] * MIB)
    assert caps["max_prompt_tokens"] + caps["max_tokens_cap"] == fit < 8192 + 2048
    assert caps["max_prompt_tokens"] == fit * 8192 // 10240
    assert r3.values["reasons"]["max_tokens_cap"].startswith(f"{caps['max_tokens_cap']}, down from 2048:")

    change = wizards.apply(actor(people), wizard, [r3.position], revision=wizard.revision)
    model = next(d for d in change.new_config["applications"][0]["deployments"] if d["name"] == "Model")
    assert model["user_config"] == {"alloc_mb": 0, "max_batch_tokens": 65536, **caps}


def test_caps_below_the_batch_limit_are_lowered_to_it_and_caps_that_fit_are_kept(people, incident, live, cluster):
    # A batch never holds more than 500 tokens: a request of 640 could never join one.
    run_with_user_config(live, cluster, {**TOKEN_CAPS, "max_batch_tokens": 500})
    token_calibration(incident.deployment)
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.patch == {"user_config": {"max_prompt_tokens": 400, "max_tokens_cap": 100}}
    assert "batch limit of 500 tokens (R4)" in r3.values["reasons"]["max_prompt_tokens"]

    small = {"max_prompt_tokens": 64, "max_tokens_cap": 16}
    run_with_user_config(live, cluster, {**small, "max_batch_tokens": 500})
    wizards.replan(actor(people), wizard, revision=wizard.revision)
    r3 = by_remedy(wizard)["R3"]
    # Never raised: caps that fit stay as they are.
    assert r3.kind == "config" and r3.status == "not_applicable" and r3.patch == {"user_config": small}
    assert r3.values["reasons"]["max_prompt_tokens"].startswith("64, kept: a request brings at most 80 tokens")


def test_without_a_per_token_measurement_r3_is_a_config_step_that_says_why_it_has_no_values(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, **TOKEN_CAPS})
    wizard, _ = wizards.start(actor(people), incident=incident)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.patch is None and r3.values["waiting"]
    assert r3.note.startswith("No caps are computed: memory per token is not measured")
    with pytest.raises(wizards.WizardError, match="no values yet: No caps are computed"):
        wizards.apply(actor(people), wizard, [r3.position], revision=None)

    # A concurrency calibration measures memory per request, not per token: still no caps.
    calibrated = calibrate(cluster)
    wizards.replan(actor(people), wizard, revision=wizard.revision)
    r3 = by_remedy(wizard)["R3"]
    assert r3.kind == "config" and r3.patch is None
    assert f"calibration #{calibrated.pk} measured memory per request, not per token" in r3.note
    assert not Change.objects.exists()


def test_a_deployment_reading_only_one_cap_from_user_config_keeps_r3_a_checklist_that_says_so(
    people, incident, live, cluster
):
    run_with_user_config(live, cluster, {"alloc_mb": 0, "max_tokens_cap": 128})
    token_calibration(incident.deployment)
    r3 = by_remedy(wizards.start(actor(people), incident=incident)[0])["R3"]
    assert r3.kind == "checklist" and r3.patch is None and "413" in r3.values["guidance"]
    assert "no usable max_prompt_tokens" in r3.values["warnings"][0]
