"""A scaler beside Serve's autoscaler on the deployment's own traffic: replica-seconds, reversals,
and what clients got while the scaler asked for more replicas than Serve ran."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.scaler.comparison import Step, compare, reversals
from apps.scaler.models import ScalerDecision
from apps.scaler.services import create_shadow_scaler
from tests.unit.scaler.conftest import record_readings


def test_a_burst_serve_met_late_is_failures_while_the_scaler_asked_for_more():
    # Serve's autoscaler: 1 replica until 60 s into the burst, then 3, down to 1 at 300 s. The scaler
    # jumped to 3 at 10 s and came down to 2 at 200 s, 1 at 300 s.
    steps = [
        Step(0, current=1, target=1),
        Step(10, current=1, target=3, kind="up"),
        Step(60, current=3, target=3),
        Step(200, current=3, target=2, kind="down"),
        Step(300, current=1, target=1, kind="down"),
    ]
    points = [
        {"t": 30, "http": 60, "http_errors": {"503": 20}},  # during the ahead span: the proxy shed
        {"t": 60, "http": 60, "http_errors": {"503": 10}},
        {"t": 120, "http": 90, "http_errors": {}},
        {"t": 250, "http": 40, "http_errors": {}},
        {"t": 330, "http": 10},
        {"t": 500, "http": 10},  # past the span
    ]
    found = compare(steps, points, since=0, until=360)

    assert found.decisions == 5
    assert found.serve_replica_seconds == 1 * 60 + 3 * 240 + 1 * 60
    assert found.scaler_replica_seconds == 1 * 10 + 3 * 190 + 2 * 100 + 1 * 60
    assert found.ahead.seconds == 50 and found.level.seconds == 10 + 140 + 60 and found.behind.seconds == 100
    assert (found.ahead.requests, found.ahead.failed) == (120, 30) and found.ahead.failed_share == 0.25
    assert (found.level.requests, found.level.failed) == (100, 0) and found.behind.requests == 40
    assert found.serve_reversals == found.scaler_reversals == 1


def test_the_decision_before_the_span_holds_at_its_start_and_is_not_counted():
    steps = [Step(-100, current=2, target=4, kind="up", ceiling=3), Step(50, current=4, target=4, ceiling=3)]
    found = compare(steps, [], since=0, until=100)
    assert found.decisions == 1
    assert found.ahead.seconds == 50 and found.level.seconds == 50
    # Serve ran 4 against a ceiling of 3 for the last 50 s: room the scaler would not have taken.
    assert found.serve_over_ceiling_s == 50


def test_reversals_count_turns_not_holds():
    assert reversals([1, 3, 3, 3, 2, 1]) == 1
    assert reversals([1, 2, 1, 2, 1]) == 3
    assert reversals([2, 2, 2]) == 0 and reversals([]) == 0


@pytest.mark.django_db
def test_the_api_and_the_card_show_the_last_days_comparison(api_as, client, people, model, calibrated, operator):
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    now = timezone.now()
    for minutes_ago, current, target, kind in ((30, 1, 1, "hold"), (20, 1, 3, "up"), (10, 3, 3, "hold")):
        ScalerDecision.objects.create(
            scaler=scaler,
            at=now - timedelta(minutes=minutes_ago),
            current=current,
            target=target,
            kind=kind,
            reason="test",
            inputs={"memory_ceiling": 4},
        )
    ahead_t = (now - timedelta(minutes=15)).timestamp()
    record_readings(model, [2.0], end=ahead_t, http=100.0, http_errors={"503": 40.0})

    body = api_as("viewer").get(f"/api/v1/scalers/{scaler.pk}/comparison/", {"hours": 1}).json()
    assert body["decisions"] == 3 and body["ahead"]["requests"] == 100 and body["ahead"]["failed_share"] == 0.4
    assert body["serve_replica_seconds"] == pytest.approx(1 * 1200 + 3 * 600, abs=5)
    assert body["replica_seconds_ratio"] == pytest.approx((1 * 600 + 3 * 1200) / (1 * 1200 + 3 * 600), rel=0.01)
    refused = api_as("viewer").get(f"/api/v1/scalers/{scaler.pk}/comparison/", {"hours": 1000})
    assert refused.status_code == 400 and "hours" in refused.json()

    client.force_login(people["viewer"])
    page = client.get(reverse("fleet:deployment", args=[model.pk])).content.decode()
    assert "Beside Serve's autoscaler, the last 24 hours" in page
    assert "more replicas than Serve ran</th><td>10\xa0min</td><td>100</td><td>40 (40\xa0%)" in page


def test_readings_before_the_first_decision_belong_to_no_side():
    found = compare([Step(100, current=1, target=2)], [{"t": 50, "http": 10}], since=0, until=200)
    assert found.ahead.requests == 0 and found.ahead.seconds == 100
