"""The deployment page's scaler card: operators start a shadow scaler, let it scale, give the count
back and delete it from there; viewers see the card without its buttons; refusals come back as
the page's message, nothing changed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.changes.models import Change
from apps.clusters.models import Cluster
from apps.scaler.models import Scaler
from tests.unit.scaler.test_control import ray  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db


def page(client, model) -> str:
    return client.get(reverse("fleet:deployment", args=[model.pk])).content.decode()


def test_an_operator_starts_a_shadow_scaler_then_lets_it_scale(client, people, model, calibrated, ray):
    client.force_login(people["operator"])
    assert "Start a shadow scaler" in page(client, model)

    made = client.post(reverse("scaler:create", args=[model.pk]), {"min_replicas": "1", "max_replicas": "3"})
    assert made.status_code == 302
    scaler = Scaler.objects.get(deployment=model)
    assert (scaler.mode, scaler.min_replicas, scaler.max_replicas) == ("shadow", 1, 3)
    shown = page(client, model)
    assert "Let it scale" in shown and "In shadow mode it decides" in shown

    client.post(reverse("scaler:action", args=[scaler.pk, "activate"]))
    change = Change.objects.get()
    assert change.kind == "scaler" and f"Queued change #{change.pk}" in page(client, model)


def test_a_refusal_is_the_pages_message_and_nothing_is_planned(client, people, model, calibrated, ray):
    client.force_login(people["operator"])
    client.post(reverse("scaler:create", args=[model.pk]), {"min_replicas": "3", "max_replicas": "1"})
    assert not Scaler.objects.exists() and "max_replicas must be at least min_replicas" in page(client, model)

    client.post(reverse("scaler:create", args=[model.pk]), {"min_replicas": "1", "max_replicas": "2"})
    Cluster.objects.update(ray_version="2.50.1")
    client.post(reverse("scaler:action", args=[Scaler.objects.get().pk, "activate"]))
    assert not Change.objects.exists() and "needs Ray 2.60" in page(client, model)

    client.post(reverse("scaler:action", args=[Scaler.objects.get().pk, "delete"]))
    assert not Scaler.objects.exists()


def test_a_viewer_sees_the_card_without_its_buttons(client, people, model, calibrated):
    client.force_login(people["viewer"])
    assert "Start a shadow scaler" not in page(client, model)
