"""Remediation wizards on the page: an operator's walk through the steps, and what viewers and
outsiders see."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.changes.models import Change
from apps.remediation import wizards
from apps.remediation.models import Wizard
from tests.unit.remediation.wizard_helpers import (
    actor,
    by_remedy,
    calibrate,
)

pytestmark = pytest.mark.django_db


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
