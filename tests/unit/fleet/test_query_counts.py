"""Lists cost the same number of queries whatever their length: every page and every list
endpoint under /api/v1/ and /api/v2/ is measured with 2 rows and again with 20."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.calibration.models import MemoryCalibration
from apps.changes.models import Change, ChangeStep, Preset, Rollout
from apps.clusters.models import ClusterEvent
from apps.fleet.models import Application, ConfigRevision, Deployment
from apps.incidents.models import Incident, IncidentEvent, OomKillRecord, Webhook, WebhookDelivery
from apps.kubernetes.models import KubeConnection, KubeLink
from apps.maintenance.models import MaintenanceRun, RecycleSchedule, WarmupProfile
from apps.remediation.models import Finding, Wizard, WizardStep
from apps.scaler.models import Scaler, ScalerDecision
from controlplane.urls import router
from tests.factories import ChangeFactory, ClusterFactory, IncidentFactory, KubeLinkFactory

pytestmark = pytest.mark.django_db
_serial = itertools.count()


def add_rows(team, user, count: int) -> None:
    """`count` more rows of everything a list shows, each with the relations its row displays."""
    now = timezone.now()
    for _ in range(count):
        n = next(_serial)
        cluster = ClusterFactory(team=team, name=f"row-{n:03d}", labels={"env": "prod"})
        ClusterEvent.objects.create(cluster=cluster, kind=ClusterEvent.Kind.REGISTERED)
        app = Application.objects.create(cluster=cluster, name="demo", status="RUNNING")
        dep = Deployment.objects.create(application=app, name="Model", status="HEALTHY", max_ongoing_requests=8)
        ConfigRevision.objects.create(application=app, cluster=cluster, config_hash=f"h{n}", config={})
        preset = Preset.objects.create(
            slug=f"preset-{n}", name=f"Preset {n}", options={"max_ongoing_requests": 2}, team=team, created_by=user
        )
        rollout = Rollout.objects.create(reason="bench", preset=preset, created_by=user)
        change = ChangeFactory(
            cluster=cluster,
            reason="tune",
            preset=preset,
            rollout=rollout,
            wave=0,
            state="succeeded",
            created_by=user,
            applied_by=user,
            started_at=now,
        )
        ChangeStep.objects.create(change=change, state="succeeded", message="verified")
        profile = WarmupProfile.objects.create(application=app, name="warm", path="/demo")
        schedule = RecycleSchedule.objects.create(deployment=dep, every_hours=6, warmup=profile, created_by=user)
        MaintenanceRun.objects.create(
            kind="recycle",
            trigger="schedule",
            state="succeeded",
            cluster=cluster,
            deployment=dep,
            schedule=schedule,
            change=change,
            requested_by=user,
        )
        incident = IncidentFactory(
            cluster=cluster,
            deployment=dep,
            title=f"OOM kill {n}",
            started_at=now,
            causes=[{"id": "OOM-2", "title": "Too many requests at once"}],
        )
        OomKillRecord.objects.create(incident=incident, actor_id=f"actor-{n}", replica="r1")
        IncidentEvent.objects.create(incident=incident, kind="note", message="looking", author=user)
        webhook = Webhook.objects.create(team=team, url=f"https://hooks.example.com/{n}")
        WebhookDelivery.objects.create(webhook=webhook, incident=incident)
        finding = Finding.objects.create(
            cluster=cluster,
            deployment=dep,
            application_name="demo",
            deployment_name="Model",
            rule="gpu-concurrency",
            severity="major",
            evidence={"max_ongoing_requests": 8},
            patch={"max_ongoing_requests": 2},
        )
        MemoryCalibration.objects.create(
            cluster=cluster,
            deployment=dep,
            application_name="demo",
            deployment_name="Model",
            submission_id=f"cal-{n}",
            state="succeeded",
        )
        wizard = Wizard.objects.create(
            cluster=cluster,
            deployment=dep,
            application_name="demo",
            deployment_name="Model",
            incident=incident,
            finding=finding,
            created_by=user,
            state=Wizard.State.OPEN if n % 2 else Wizard.State.RESOLVED,
        )
        WizardStep.objects.create(wizard=wizard, position=1, kind="config", title="Cap concurrency", change=change)
        scaler = Scaler.objects.create(deployment=dep, max_replicas=4, created_by=user)
        ScalerDecision.objects.create(scaler=scaler, at=now, target=2, current=1, kind="up", reason="burst")
        AuditEvent.objects.create(actor=user, actor_name=user.username, action="cluster.create", team=team)
        kube = KubeConnection.objects.create(team=team, name=f"kube-{n}", namespaces=["ray"], created_by=user)
        KubeLinkFactory(
            cluster=cluster,
            connection=kube,
            kind=KubeLink.Kind.RAYCLUSTER,
            namespace="ray",
            name=f"ray-{n}",
            created_by=user,
        )


def add_to_cluster(cluster, user, count: int) -> None:
    """`count` more applications (each with a deployment), events and open incidents on one cluster."""
    now = timezone.now()
    for _ in range(count):
        n = next(_serial)
        app = Application.objects.create(cluster=cluster, name=f"app-{n}", status="RUNNING")
        dep = Deployment.objects.create(application=app, name="Model", status="HEALTHY")
        ClusterEvent.objects.create(cluster=cluster, kind=ClusterEvent.Kind.RECOVERED)
        IncidentFactory(
            cluster=cluster, application_name=app.name, deployment=dep, title=f"OOM kill {n}", started_at=now
        )


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(captured)


def assert_constant(client, url: str, grow) -> None:
    grow(2)
    client.get(url)  # per-process caches (content types, permissions) fill on the first request
    with_two = queries(client, url)
    grow(18)
    with_twenty = queries(client, url)
    assert with_two == with_twenty, f"{url}: {with_two} queries with 2 rows, {with_twenty} with 20"


PAGES = ["fleet:overview", "incidents:list", "remediation:findings", "remediation:wizards"]


@pytest.mark.parametrize("page", PAGES)
def test_a_list_page_issues_the_same_queries_for_2_and_20_rows(client, people, team, page):
    client.force_login(people["admin"])
    assert_constant(client, reverse(page), lambda count: add_rows(team, people["admin"], count))


def test_the_cluster_page_issues_the_same_queries_for_2_and_20_applications(client, people, team):
    client.force_login(people["admin"])
    cluster = ClusterFactory(team=team)
    assert_constant(
        client,
        reverse("fleet:cluster", args=[cluster.pk]),
        lambda count: add_to_cluster(cluster, people["admin"], count),
    )


LIST_ENDPOINTS = sorted(basename for _, _, basename in router.registry)


def test_every_list_endpoint_is_measured():
    assert len(LIST_ENDPOINTS) >= 16


@pytest.mark.parametrize("version", ["", "v2:"])
@pytest.mark.parametrize("basename", LIST_ENDPOINTS)
def test_a_list_endpoint_issues_the_same_queries_for_2_and_20_rows(api_as, people, team, basename, version):
    url = reverse(f"{version}{basename}-list")
    assert_constant(api_as("admin"), url, lambda count: add_rows(team, people["admin"], count))


# The other forms of a list: keyset pages, and rollouts with their changes counted.
LIST_FORMS = [
    ("incident", "?cursor="),
    ("incident", "?view=summary"),
    ("incident", "?view=summary&cursor="),
    ("auditevent", "?cursor="),
    ("configrevision", "?cursor="),
    ("rollout", "?changes=counts"),
]
# Version 2 pages lists in time order by keyset (`page` numbers them) and counts only with `count=true`.
V2_FORMS = [
    ("incident", "?page=1"),
    ("change", "?page=1"),
    ("change", "?page=1&count=true"),
    ("rollout", "?page=1"),
    ("auditevent", "?page=1"),
    ("cluster", "?count=true"),
    ("deployment", "?count=true"),
]


@pytest.mark.parametrize(("basename", "query"), LIST_FORMS)
def test_each_form_of_a_list_issues_the_same_queries_for_2_and_20_rows(api_as, people, team, basename, query):
    url = reverse(f"{basename}-list") + query
    assert_constant(api_as("admin"), url, lambda count: add_rows(team, people["admin"], count))


@pytest.mark.parametrize(("basename", "query"), V2_FORMS)
def test_each_v2_form_of_a_list_issues_the_same_queries_for_2_and_20_rows(api_as, people, team, basename, query):
    url = reverse(f"v2:{basename}-list") + query
    assert_constant(api_as("admin"), url, lambda count: add_rows(team, people["admin"], count))


def test_the_incident_list_reports_the_same_related_work_as_each_incident_alone(api_as, people, team):
    add_rows(team, people["admin"], 3)
    client = api_as("admin")
    listed = {item["id"]: item["related_work"] for item in client.get(reverse("incident-list")).json()["results"]}
    assert len(listed) == 3 and all(listed.values())
    for incident_id, related in listed.items():
        assert related == client.get(reverse("incident-detail", args=[incident_id])).json()["related_work"]


def test_the_webhook_list_shows_the_ten_newest_deliveries_of_each_webhook(api_as, people, team):
    add_rows(team, people["admin"], 2)
    busy = Webhook.objects.filter(team=team).order_by("id").first()
    incident = Incident.objects.first()
    for attempts in range(12):
        WebhookDelivery.objects.create(webhook=busy, incident=incident, attempts=attempts)
    rows = {
        row["id"]: row["recent_deliveries"] for row in api_as("admin").get(reverse("webhook-list")).json()["results"]
    }
    assert [d["attempts"] for d in rows[busy.pk]] == list(range(11, 1, -1))
    assert all(len(deliveries) == 1 for pk, deliveries in rows.items() if pk != busy.pk)


def test_cluster_lists_count_only_live_applications_and_deployments(people, team):
    """The counts the sync writes on each row (tests/unit/fleet/test_sync.py), for the rows a
    database had before they were written: removed applications and deployments do not count."""
    from importlib import import_module

    from django.apps import apps

    busy = ClusterFactory(team=team, name="busy")
    idle = ClusterFactory(team=team, name="idle")
    add_to_cluster(busy, people["admin"], 3)
    gone = Application.objects.filter(cluster=busy).first()
    Application.objects.filter(pk=gone.pk).update(removed_at=timezone.now())
    Deployment.objects.create(
        application=Application.objects.filter(cluster=busy).last(),
        name="Old",
        status="REMOVED",
        removed_at=timezone.now(),
    )
    import_module("apps.fleet.migrations.0004_cluster_live_counts").count_live_rows(apps, None)
    busy.refresh_from_db()
    idle.refresh_from_db()
    assert (busy.application_count, busy.deployment_count) == (2, 2)
    assert (idle.application_count, idle.deployment_count) == (0, 0)


def test_the_rollout_list_answers_for_a_rollout_across_more_than_a_thousand_clusters(api_as, people, team):
    # Prefetching the changes' clusters by id put 1,001 terms in one IN list: SQLite refused it.
    from apps.clusters.models import Cluster

    rollout = Rollout.objects.create(reason="fleet-wide cap", created_by=people["admin"])
    clusters = Cluster.objects.bulk_create(
        [Cluster(name=f"wide-{i:04d}", team=team, dashboard_url=f"http://wide-{i}.test:8265") for i in range(1001)]
    )
    Change.objects.bulk_create(
        [
            Change(
                cluster=cluster,
                rollout=rollout,
                wave=1,
                targets=[{"application": "demo", "deployment": "Model"}],
                reason="cap",
                base_hash="a",
                base_config={},
                new_config={},
                new_hash="b",
            )
            for cluster in clusters
        ]
    )
    [listed] = api_as("admin").get(reverse("rollout-list")).json()["results"]
    assert len(listed["changes"]) == 1001 and {c["cluster_name"] for c in listed["changes"]} == {
        c.name for c in clusters
    }


def test_the_incident_summary_lists_every_field_of_the_default_list_but_the_heavy_ones(api_as, people, team):
    from apps.incidents.api import HEAVY_FIELDS

    add_rows(team, people["admin"], 3)
    client = api_as("admin")
    full = client.get(reverse("incident-list")).json()["results"]
    summary = client.get(reverse("incident-list") + "?view=summary").json()["results"]
    assert [row["id"] for row in summary] == [row["id"] for row in full]
    for long, short in zip(full, summary, strict=True):
        assert short == {key: value for key, value in long.items() if key not in HEAVY_FIELDS}
    detail = client.get(reverse("incident-detail", args=[summary[0]["id"]]) + "?view=summary").json()
    assert set(HEAVY_FIELDS) <= set(detail)


def test_the_openapi_schema_documents_the_incident_summary(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    listing = schema["paths"]["/api/v1/incidents/"]["get"]
    assert any(p["name"] == "view" and p["schema"].get("enum") == ["summary"] for p in listing["parameters"])
    assert "IncidentSummary" in schema["components"]["schemas"]
    assert "evidence" not in schema["components"]["schemas"]["IncidentSummary"]["properties"]


def test_the_rollout_list_shows_each_rollout_as_its_detail_does(api_as, people, team):
    add_rows(team, people["admin"], 3)
    rollout = Rollout.objects.first()
    Change.objects.filter(pk__in=Change.objects.order_by("id").values("id")[:2]).update(rollout=rollout, wave=1)
    Rollout.objects.filter(pk=rollout.pk).update(error="row-000: change #1 rolled back; elsewhere: change #9 failed")
    client = api_as("admin")
    listed = client.get(reverse("rollout-list")).json()["results"]
    assert any(len(row["changes"]) >= 2 for row in listed)
    for row in listed:
        assert row == client.get(reverse("rollout-detail", args=[row["id"]])).json()
