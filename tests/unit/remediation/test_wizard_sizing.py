"""How observed traffic and in-flight readings move the values a wizard computes."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.incidents.models import SignalWindow
from apps.remediation import wizards
from tests.unit.remediation.wizard_helpers import (
    actor,
    by_remedy,
)

pytestmark = pytest.mark.django_db


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
    rest = {"ongoing": 0.0, "rps": 0.0, "queued": 0, "replicas": 2, "rss_mb": 600.0}
    busy = {"ongoing": 2.0, "rps": 1.0, "queued": 0, "replicas": 2, "rss_mb": 3600.0}
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[{**rest, "t": 1}, {**rest, "t": 16}, *({**busy, "t": t} for t in (31, 36, 41))],
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


@pytest.mark.parametrize(
    "p50_ms, heavier, says",
    [
        (9000.0, True, "much heavier than the one the values are sized from"),
        (100.0, False, "the traffic was lighter (cached answers or smaller requests)"),
        (1500.0, False, "Like the sized request"),
    ],
)
def test_the_incidents_own_traffic_is_held_against_the_request_the_values_are_sized_from(
    client, people, incident, cluster, calibrated, p50_ms, heavier, says
):
    # The calibration measured about 1 s a request at 1, 2 and 4 at once; the incident's replicas
    # processed theirs in `p50_ms`, two at a time at the busiest.
    busy = {"ongoing": 2.0, "rps": 1.0, "queued": 0, "p50": p50_ms}
    SignalWindow.objects.create(
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        points=[{**busy, "t": t} for t in (31, 36, 41)],
    )
    wizard, _ = wizards.start(actor(people), incident=incident)
    traffic = wizard.diagnosis["traffic"]
    assert traffic["heavier"] is heavier and says in traffic["text"], traffic
    client.force_login(people["viewer"])
    diagnosis = wizard.steps.get(kind="diagnosis").position
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": diagnosis}).content.decode()
    assert "Traffic against the sized request" in page and says in page.replace("&#x27;", "'")
