"""Scalers through the API and on the deployment page: shadow only, team-scoped, audited, their
decisions paged newest first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.scaler import retention
from apps.scaler.models import Scaler, ScalerDecision
from apps.scaler.services import create_shadow_scaler

pytestmark = pytest.mark.django_db


def test_an_operator_starts_a_shadow_scaler_and_the_audit_log_says_so(api_as, model):
    response = api_as("operator").post(
        "/api/v1/scalers/", {"deployment": model.pk, "min_replicas": 1, "max_replicas": 4}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["mode"] == "shadow" and body["deployment_name"] == "Model" and body["application_name"] == "demo"
    assert AuditEvent.objects.filter(action="scaler.create").count() == 1


def test_only_shadow_scalers_are_created(api_as, model):
    response = api_as("operator").post(
        "/api/v1/scalers/", {"deployment": model.pk, "max_replicas": 4, "mode": "active"}, format="json"
    )
    assert response.status_code == 400 and "mode" in response.json()
    assert not Scaler.objects.exists()


def test_a_second_scaler_and_inverted_bounds_are_refused(api_as, model, operator):
    create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    again = api_as("operator").post("/api/v1/scalers/", {"deployment": model.pk, "max_replicas": 4}, format="json")
    assert again.status_code == 400 and "already has a scaler" in again.json()["detail"][0]
    echo = model.application.deployments.get(name="Echo")
    inverted = api_as("operator").post(
        "/api/v1/scalers/", {"deployment": echo.pk, "min_replicas": 3, "max_replicas": 2}, format="json"
    )
    assert inverted.status_code == 400 and "at least min_replicas" in inverted.json()["detail"][0]


def test_a_viewer_reads_scalers_but_cannot_start_or_delete_one(api_as, model, operator):
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    viewer = api_as("viewer")
    assert viewer.get("/api/v1/scalers/").json()["results"][0]["id"] == scaler.pk
    assert (
        viewer.post("/api/v1/scalers/", {"deployment": model.pk, "max_replicas": 4}, format="json").status_code == 403
    )
    assert viewer.delete(f"/api/v1/scalers/{scaler.pk}/").status_code == 403


def test_an_operator_deletes_a_scaler_with_its_decisions(api_as, model, operator):
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    ScalerDecision.objects.create(scaler=scaler, at=timezone.now(), target=2, current=1, kind="up", reason="x")
    assert api_as("operator").delete(f"/api/v1/scalers/{scaler.pk}/").status_code == 204
    assert not Scaler.objects.exists() and not ScalerDecision.objects.exists()
    assert AuditEvent.objects.filter(action="scaler.delete").count() == 1


def test_decisions_are_listed_newest_first_and_filtered_by_scaler(api_as, model, operator):
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    now = timezone.now()
    for minutes, kind in ((3, "up"), (2, "hold"), (1, "down")):
        ScalerDecision.objects.create(
            scaler=scaler, at=now - timedelta(minutes=minutes), target=2, current=2, kind=kind, reason=kind
        )
    body = api_as("viewer").get(f"/api/v1/scaler-decisions/?scaler={scaler.pk}").json()
    assert [d["kind"] for d in body["results"]] == ["down", "hold", "up"]
    assert api_as("viewer").get("/api/v1/scaler-decisions/?kind=up").json()["results"][0]["reason"] == "up"


def test_the_api_schema_documents_the_scaler_endpoints(api_as):
    paths = api_as("viewer").get("/api/schema/?format=json").json()["paths"]
    assert {"/api/v1/scalers/", "/api/v1/scalers/{id}/", "/api/v1/scaler-decisions/"} <= set(paths)


def test_the_deployment_page_shows_the_latest_decisions(client, people, model, operator):
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    ScalerDecision.objects.create(
        scaler=scaler, at=timezone.now(), target=3, current=1, kind="up", reason="Burst: needs 3 replicas"
    )
    client.force_login(people["viewer"])
    page = client.get(reverse("fleet:deployment", args=[model.pk])).content.decode()
    assert 'id="scaler-card"' in page and "Burst: needs 3 replicas" in page and "1 → 3" in page


def test_a_deployment_without_a_scaler_shows_no_card(client, people, model):
    client.force_login(people["viewer"])
    assert 'id="scaler-card"' not in client.get(reverse("fleet:deployment", args=[model.pk])).content.decode()


def test_retention_prunes_old_decisions_a_batch_at_a_time(model, operator, settings):
    settings.FLEETDECK_SCALER_DECISION_DAYS = 7
    scaler = create_shadow_scaler(operator, model, min_replicas=1, max_replicas=4)
    old = timezone.now() - timedelta(days=8)
    ScalerDecision.objects.bulk_create(
        ScalerDecision(scaler=scaler, at=old, target=1, current=1, kind="hold", reason="old") for _ in range(5)
    )
    ScalerDecision.objects.create(scaler=scaler, at=timezone.now(), target=1, current=1, kind="hold", reason="new")
    assert retention.prune(batch=3) == 3
    retention.prune_decisions()
    assert list(ScalerDecision.objects.values_list("reason", flat=True)) == ["new"]
