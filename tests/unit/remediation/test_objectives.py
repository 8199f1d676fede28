"""The wizard's objectives: suggested with their reasons when none is given, priced, and stated by the operator."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.calibration.models import MemoryCalibration
from apps.remediation import objectives
from tests.unit.remediation.wizard_helpers import MIB


def test_the_suggestion_starts_from_what_clients_saw_before_the_incident():
    points = [
        {"t": 100, "http_p99": 8000, "http": 1000, "http_errors": {"503": 5}},
        {"t": 200, "http_p99": 9600, "http": 1000, "http_errors": {}},
        # The lead-up, the load climbing in the five minutes before the kill: part of the incident.
        {"t": 450, "http_p99": 59600, "http": 1000, "http_errors": {"500": 40}},
        {"t": 700, "http_p99": 60000, "http": 1000, "http_errors": {"503": 500}},  # the incident itself
    ]
    goals = objectives.suggest(points, started_at=600, service_s=3.0, service_source="calibrated")
    # 1.25 x 9.6 s = 12 s beats 2.5 x 3 s = 7.5 s; rounded up to the half second.
    assert goals.latency_ms == 12_000 and "9.6 s before the incident" in goals.latency_reason
    # 5 of 2,000 failed before: twice that, at least 1 %.
    assert goals.failure == 0.01 and "0.2%" in goals.failure_reason
    assert goals.suggested


def test_without_client_readings_never_below_the_default():
    # Nobody measured what clients saw: a tighter objective would shed load nobody asked to shed.
    assert objectives.suggest([], None, 3.0, "calibrated").latency_ms == 10_000
    # A request slower than the default allows gets 2.5 of its own service time.
    slow = objectives.suggest([], None, 6.0, "calibrated")
    assert slow.latency_ms == 15_000 and "6.0 s" in slow.latency_reason
    fallback = objectives.suggest([], None, None, "")
    assert fallback.latency_ms == 10_000 and "default" in fallback.latency_reason
    assert fallback.failure == 0.05


def test_given_objectives_win_and_the_note_says_which_are_suggested():
    suggestion = objectives.suggest([], None, 3.0, "calibrated")
    mixed = objectives.chosen(suggestion, 12_000, None)
    assert mixed.latency_ms == 12_000 and mixed.failure == 0.05
    assert "p99 12 s (given)" in mixed.note() and "suggested where none was given" in mixed.note()
    both = objectives.chosen(suggestion, 12_000, 0.02)
    assert not both.suggested and both.note().startswith("Objectives given")


def test_the_price_of_each_objective_by_hand():
    # 2 replicas x 2 at 3 s a request: 4 slots serve 1.333 requests/s; the incident's busiest moment had 20.
    plan = {"replicas": 2, "concurrency": 2}
    rows = objectives.price(plan, {"peak_in_flight": 20}, 10_000, 3.0)
    by = {r["latency_objective_ms"]: r for r in rows}
    # 10 s: wait 0.8 x 10 - 3 = 5 s, bound int(1.333 x 5) = 6; 20 - 4 - 6 = 10 shed of 20; the 6 queued wait 4.5 s.
    assert by[10_000] == {
        "latency_objective_ms": 10_000,
        "queue_bound": 6,
        "shed_share": 0.5,
        "expected_p99_ms": 7_500,
        "chosen": True,
    }
    # 20 s: wait 13 s, bound 17 > the 16 beyond the slots: nothing shed, the 16 queued wait 12 s.
    assert by[20_000]["queue_bound"] == 17 and by[20_000]["shed_share"] == 0.0
    assert by[20_000]["expected_p99_ms"] == 15_000
    # 5 s: wait 1 s, bound 1; 15 of 20 shed.
    assert by[5_000]["queue_bound"] == 1 and by[5_000]["shed_share"] == 0.75
    assert objectives.price(plan, {"peak_in_flight": 20}, 10_000, None) == []


def _calibrated(incident, service_s=3.0):
    MemoryCalibration.objects.create(
        cluster=incident.cluster,
        application_name=incident.application_name,
        deployment_name=incident.deployment_name,
        state="succeeded",
        axis="concurrency",
        device="cpu",
        baseline_bytes=200 * MIB,
        finished_at=timezone.now(),
        points=[{"x": k, "peak_bytes": (200 + 800 * k) * MIB, "service_s": service_s} for k in (1, 2, 4)],
    )


@pytest.mark.django_db
def test_a_wizard_started_without_objectives_says_every_value_is_sized_for_a_suggestion(api_as, incident):
    _calibrated(incident)
    operator = api_as("operator")
    body = operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
    goals = body["diagnosis"]["objectives"]
    assert goals["given"] == {"latency_objective_ms": False, "failure_objective": False}
    assert body["latency_objective_ms"] == goals["latency_objective_ms"]
    sized = [s for s in body["steps"] if s["remedy"] in ("R1", "R2", "R10") and s["values"].get("reasons")]
    assert sized, body["steps"]
    for step in sized:
        for reason in step["values"]["reasons"].values():
            assert "Objectives suggested where none was given" in reason


@pytest.mark.django_db
def test_the_operator_states_the_objectives_and_the_values_follow(api_as, incident):
    _calibrated(incident)
    operator = api_as("operator")
    body = operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
    url = f"/api/v1/wizards/{body['id']}/objectives/"
    stated = operator.post(url, {"latency_objective_ms": 20_000, "failure_objective": 0.02}, format="json")
    assert stated.status_code == 200, stated.content
    wizard = stated.json()
    assert wizard["latency_objective_ms"] == 20_000 and wizard["failure_objective"] == 0.02
    goals = wizard["diagnosis"]["objectives"]
    assert goals["given"] == {"latency_objective_ms": True, "failure_objective": True}
    assert any(row["chosen"] and row["latency_objective_ms"] == 20_000 for row in goals["price"])
    # Replanning keeps what the operator stated.
    again = operator.post(f"/api/v1/wizards/{body['id']}/replan/", {}, format="json").json()
    assert again["latency_objective_ms"] == 20_000 and again["diagnosis"]["objectives"]["given"]["failure_objective"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"latency_objective_ms": 2_000, "failure_objective": 0.05}, "latency_objective_ms"),  # below 3 s a request
        ({"latency_objective_ms": 12_000, "failure_objective": 1.5}, "failure_objective"),
        ({"latency_objective_ms": 12_000, "failure_objective": -0.1}, "failure_objective"),
        ({"latency_objective_ms": "soon", "failure_objective": 0.05}, "latency_objective_ms"),
    ],
)
def test_bad_objectives_are_a_400_naming_the_field_and_change_nothing(api_as, incident, body, field):
    _calibrated(incident)
    operator = api_as("operator")
    wizard = operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
    refused = operator.post(f"/api/v1/wizards/{wizard['id']}/objectives/", body, format="json")
    assert refused.status_code == 400 and field in refused.json(), refused.content
    after = operator.get(f"/api/v1/wizards/{wizard['id']}/").json()
    assert after["latency_objective_ms"] == wizard["latency_objective_ms"]
    assert after["revision"] == wizard["revision"]


@pytest.mark.django_db
def test_the_wizard_page_asks_for_the_objectives_with_their_price(client, people, incident):
    from django.urls import reverse

    from apps.remediation.models import Wizard

    _calibrated(incident)
    client.force_login(people["operator"])
    client.post(reverse("remediation:wizard_start"), {"incident": incident.pk})
    wizard = Wizard.objects.get(incident=incident)
    page = client.get(reverse("remediation:wizard", args=[wizard.pk])).content.decode()
    assert "Objectives: what clients may see" in page and "Suggested, not given" in page
    assert 'name="latency_objective_ms"' in page and "Size for these objectives" in page
    url = reverse("remediation:wizard_action", args=[wizard.pk, "objectives"])
    form = {"latency_objective_ms": "15000", "failure_percent": "2", "revision": wizard.revision}
    client.post(url, form)
    wizard.refresh_from_db()
    assert (wizard.latency_objective_ms, wizard.failure_objective) == (15_000, 0.02)
    page = client.get(reverse("remediation:wizard", args=[wizard.pk])).content.decode()
    assert "Suggested, not given" not in page and "15000 ms (chosen)" in page
    # A share outside 0-100 % changes nothing and says why.
    bad = client.post(url, {**form, "failure_percent": "150", "revision": wizard.revision}, follow=True)
    wizard.refresh_from_db()
    assert wizard.failure_objective == 0.02 and "between 0 % and 100 %" in bad.content.decode()


@pytest.mark.django_db
def test_the_operator_may_widen_the_margin_and_narrow_it_only_when_typed(api_as, incident):
    _calibrated(incident)
    operator = api_as("operator")
    wizard = operator.post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
    computed = wizard["diagnosis"]["objectives"]["margin"]
    # The recorded calibration has no repeated rounds: the flat 20 % the spread could not replace.
    assert computed["fraction"] == 0.2 and "unknown" in computed["reason"]
    url = f"/api/v1/wizards/{wizard['id']}/objectives/"
    goals = {"latency_objective_ms": 20_000, "failure_objective": 0.05}
    wider = operator.post(url, goals | {"margin": 0.3}, format="json").json()
    assert wider["diagnosis"]["objectives"]["margin"]["fraction"] == 0.3
    assert "as the operator asked" in wider["diagnosis"]["budget"]["reason"]
    narrower = operator.post(url, goals | {"margin": 0.1}, format="json")
    assert narrower.status_code == 400 and "accept the OOM risk" in narrower.json()["margin"][0]
    typed = operator.post(url, goals | {"margin": 0.1, "confirm_less_margin": "accept the OOM risk"}, format="json")
    assert typed.status_code == 200, typed.content
    assert typed.json()["diagnosis"]["objectives"]["margin"]["fraction"] == 0.1
    assert "as the operator confirmed" in typed.json()["diagnosis"]["budget"]["reason"]


def test_an_incident_with_only_its_lead_up_recorded_gets_the_default_not_its_own_latency():
    # The readings start as the load does, minutes before the kill: none of them says what clients
    # saw in normal operation, and 1.25 x the lead-up's 59.6 s would have suggested 74.5 s.
    points = [{"t": 500 + 30 * i, "http_p99": 59600, "http": 100, "http_errors": {}} for i in range(8)]
    goals = objectives.suggest(points, started_at=750, service_s=2.2, service_source="calibrated")
    assert goals.latency_ms == 10_000 and "lead-up" in goals.latency_reason
