"""A wizard's code-level steps, its verification window, and the automatic checks of a remedy."""

from __future__ import annotations

import http.server
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.incidents.models import OomKillRecord, SignalWindow
from apps.maintenance.models import RecycleSchedule
from apps.remediation import findings, remedy_checks, verification, wizards
from apps.remediation.models import Finding, Wizard
from tests.unit.remediation.wizard_helpers import (
    actor,
    by_remedy,
    finish,
)

pytestmark = pytest.mark.django_db


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
            # Requests processed in about the calibrated 1 s: the traffic the values were sized for.
            {"t": start + 10 * i, "p50": 950, "p99": 1400, "rps": 4.0, "errors": 0, "ongoing": 2, "queued": 0}
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
