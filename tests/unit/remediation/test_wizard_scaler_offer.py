"""R11: the wizard offers Fleetdeck's scaler where the incident's load varied more than one fixed
config serves, sized from the deployment's calibration, and taking it creates a shadow scaler."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.clusters.models import Cluster
from apps.incidents.models import Incident, SignalWindow
from apps.remediation import verification, wizards
from apps.remediation.models import WizardStep
from apps.scaler import services as scaler_services
from apps.scaler import wizard_step
from apps.scaler.models import Scaler
from tests.unit.remediation.wizard_helpers import actor, by_remedy, calibrate

pytestmark = pytest.mark.django_db

# Nine calm readings of 2 requests 10 s apart, one burst of 4 in flight and 36 queued, then calm again.
CALM = [{"t": t, "ongoing": 2, "queued": 0} for t in range(0, 90, 10)]
BURSTY = [*CALM, {"t": 90, "ongoing": 4, "queued": 36}, {"t": 100, "ongoing": 2, "queued": 0}]
STEADY = [{"t": t, "ongoing": 2 + t % 20 // 10, "queued": 0} for t in range(0, 110, 10)]


def readings(cluster, points):
    SignalWindow.objects.create(cluster=cluster, application_name="demo", deployment_name="Model", points=points)


def offer(wizard) -> WizardStep:
    return by_remedy(wizard)["R11"]


def test_a_bursty_load_is_offered_the_scaler_with_the_calibrations_figures(people, incident, cluster, calibrated):
    readings(cluster, BURSTY)
    wizard, _ = wizards.start(actor(people), incident=incident)
    step = offer(wizard)
    assert step.kind == WizardStep.Kind.SCALER and step.status == WizardStep.Status.PENDING
    assert step.title == "R11: Let Fleetdeck scale it"
    values = step.values
    # The calibration: 1 request per replica within memory, 1 s each; memory holds 4 replicas of 1000 MiB.
    assert (values["calm_in_flight"], values["peak_in_flight"]) == (2, 40)
    assert (values["calm_replicas"], values["peak_replicas"]) == (2, 40)
    assert (values["min_replicas"], values["max_replicas"]) == (2, 4)
    # Sized for the peak (4, what memory holds), 2 replicas idle through nine 10 s calm readings.
    assert values["idle_replica_s"] == 180
    calm, peak, ceiling, idle, serve, bounds = values["reasons"]
    assert "2 request(s) in flight or queued: 2 replica(s) at the calibrated 1 per replica, 1.00 s a request" in calm
    assert "The busiest moment had 40: 40 replica(s), 20.0× the calm's" in peak
    # The queue bound R10 sizes for the objective: 28.
    assert "holds 2 in flight and 28 queued" in peak
    assert ceiling.startswith("Memory holds 4 replica(s) of 1,000 MiB") and "The peak needs 40: past 4" in ceiling
    assert "A fixed count sized for the peak (4) keeps 2 replica(s) idle in the calm, 180 replica-seconds" in idle
    assert "upscale_delay_s (30 s)" in serve and "look_back_period_s (30 s)" in serve
    assert "min 2 and max 4" in bounds
    assert "R11" in [r["id"] for r in wizard.diagnosis["remedies"]]


@pytest.mark.parametrize(
    "points",
    [STEADY, [{"t": t, "ongoing": 20 + t % 20 // 10 * 10, "queued": 0} for t in range(0, 110, 10)]],
    ids=["light", "heavy-but-within-twice"],
)
def test_a_steady_load_is_not_offered_the_scaler(people, incident, cluster, calibrated, points):
    readings(cluster, points)
    wizard, _ = wizards.start(actor(people), incident=incident)
    assert "R11" not in by_remedy(wizard)
    assert not wizard.steps.filter(kind=WizardStep.Kind.SCALER).exists()


def test_below_ray_2_60_the_offer_is_refused_in_the_step(people, incident, cluster, calibrated):
    Cluster.objects.filter(pk=cluster.pk).update(ray_version="2.49.1")
    readings(cluster, BURSTY)
    wizard, _ = wizards.start(actor(people), incident=Incident.objects.get(pk=incident.pk))
    step = offer(wizard)
    assert step.status == WizardStep.Status.NOT_APPLICABLE
    assert step.note.startswith("Needs Ray 2.60's scale API: this cluster runs Ray 2.49.1.")
    with pytest.raises(wizards.WizardError, match=r"Needs Ray 2\.60's scale API"):
        wizard_step.take(actor(people), wizard, step.position, revision=None)
    assert not Scaler.objects.exists()


def test_without_a_calibration_it_is_refused_until_one_sizes_it(people, incident, cluster):
    readings(cluster, BURSTY)
    wizard, _ = wizards.start(actor(people), incident=incident)
    step = offer(wizard)
    assert step.status == WizardStep.Status.NOT_APPLICABLE
    assert step.note.startswith("No calibration to size from")
    assert "max_replicas" not in step.values
    with pytest.raises(wizards.WizardError, match="No calibration to size from"):
        wizard_step.take(actor(people), wizard, step.position, revision=None)
    calibrate(cluster)
    wizard = wizards.replan(actor(people), wizard)
    step = offer(wizard)
    assert step.status == WizardStep.Status.PENDING and step.note == ""
    assert (step.values["min_replicas"], step.values["max_replicas"]) == (2, 4)


def test_taking_it_creates_one_shadow_scaler_with_the_sized_bounds(people, incident, cluster, calibrated):
    readings(cluster, BURSTY)
    wizard, _ = wizards.start(actor(people), incident=incident)
    position = offer(wizard).position
    step = wizard_step.take(actor(people), wizard, position, revision=wizard.revision)
    scaler = Scaler.objects.get()
    assert scaler.deployment_id == wizard.deployment_id and scaler.mode == Scaler.Mode.SHADOW
    assert (scaler.min_replicas, scaler.max_replicas) == (2, 4)
    assert step.status == WizardStep.Status.DONE and step.check_result == {"scaler": scaler.pk, "created": True}
    assert f"Scaler #{scaler.pk} created in shadow mode (min 2, max 4)" in step.note
    again = wizard_step.take(actor(people), wizard, position, revision=None)
    assert Scaler.objects.count() == 1 and again.check_result["scaler"] == scaler.pk
    # A shadow scaler changes nothing live: verification still waits for a remedy that does.
    with pytest.raises(wizards.WizardError, match="nothing to verify"):
        verification.start(actor(people), wizard, revision=None)


def test_a_scaler_the_deployment_has_is_kept_not_resized(people, incident, cluster, calibrated):
    readings(cluster, BURSTY)
    wizard, _ = wizards.start(actor(people), incident=incident)
    mine = Scaler.objects.create(deployment=wizard.deployment, min_replicas=1, max_replicas=3)
    step = wizard_step.take(actor(people), wizard, offer(wizard).position, revision=None)
    mine.refresh_from_db()
    assert (mine.min_replicas, mine.max_replicas, mine.mode) == (1, 3, Scaler.Mode.SHADOW)
    assert step.check_result == {"scaler": mine.pk, "created": False} and "kept as it is" in step.note


def test_the_api_takes_it_for_the_team_and_outsiders_see_nothing(api_as, people, incident, cluster, calibrated):
    readings(cluster, BURSTY)
    body = api_as("operator").post("/api/v1/wizards/", {"incident": incident.pk}, format="json").json()
    step = next(s for s in body["steps"] if s["remedy"] == "R11")
    assert step["kind"] == "scaler" and step["values"]["max_replicas"] == 4
    url = f"/api/v1/wizards/{body['id']}/scaler/"
    assert api_as("outsider").post(url, {"step": step["position"]}, format="json").status_code == 404
    assert api_as("viewer").post(url, {"step": step["position"]}, format="json").status_code == 403
    assert not Scaler.objects.exists()
    taken = api_as("operator").post(url, {"step": step["position"], "revision": body["revision"]}, format="json")
    assert taken.status_code == 200
    assert next(s for s in taken.json()["steps"] if s["remedy"] == "R11")["status"] == "done"
    assert Scaler.objects.get().mode == Scaler.Mode.SHADOW


def test_the_wizard_page_shows_the_figures_and_links_the_scaler_card(client, people, incident, cluster, calibrated):
    readings(cluster, BURSTY)
    wizard, _ = wizards.start(actor(people), incident=incident)
    position = offer(wizard).position
    client.force_login(people["operator"])
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": position}).content.decode()
    assert "Create the scaler in shadow mode" in page and "20.0× the calm" in page
    client.post(
        reverse("remediation:wizard_action", args=[wizard.pk, "scaler"]),
        {"step": position, "revision": wizard.revision},
    )
    page = client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": position}).content.decode()
    scaler = Scaler.objects.get()
    assert f"Open scaler #{scaler.pk}" in page and "#scaler-card" in page
    assert "Create the scaler in shadow mode" not in page


def test_taking_r11_needs_exactly_what_creating_a_scaler_needs():
    assert wizards.OPERATIONS["scaler"] == scaler_services.MANAGE
