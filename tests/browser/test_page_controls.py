"""Every page whose controls act on their own when changed (no button pressed), each control
changed in the browser: the page must change, under the content security policy that blocks
inline handlers (the page fixture fails a test on any CSP violation)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.clusters.models import Cluster, Reachability
from apps.fleet import sync
from apps.fleet.models import ConfigRevision
from apps.incidents.models import Incident
from tests.browser.pages import log_in
from tests.conftest import ray_fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_revision_compare_selector_shows_the_diff_against_the_chosen_revision(
    page, live_server, people, team, use_replay
):
    cluster = Cluster.objects.create(name="vision-prod", team=team, dashboard_url="http://ray.test:8265")
    sync.sync_cluster(cluster.pk)
    for cap in (2, 3):
        payload = ray_fixture("serve_applications_two_apps.json")
        payload["applications"]["demo"]["deployments"]["Model"]["deployment_config"]["max_ongoing_requests"] = cap
        use_replay.routes["/api/serve/applications/"] = payload
        sync.sync_cluster(cluster.pk)
    revisions = list(ConfigRevision.objects.filter(application__name="demo").order_by("observed_at", "pk"))
    first, newest = revisions[0], revisions[-1]

    log_in(page, live_server, "viewer", f"/revisions/{newest.pk}/")
    page.wait_for_selector("pre.diff")
    assert page.locator(".diff-del", has_text='"max_ongoing_requests": 2').count() == 1

    with page.expect_navigation():
        page.select_option("#against", str(first.pk))
    assert f"against={first.pk}" in page.url
    assert page.locator(".diff-del", has_text='"max_ongoing_requests": 8').count() == 1
    assert page.locator(".diff-add", has_text='"max_ongoing_requests": 3').count() == 1


def test_the_incident_status_filter_submits_when_it_changes(page, live_server, people, team):
    cluster = Cluster.objects.create(name="gpu-prod", team=team, dashboard_url="http://127.0.0.1:9")
    now = timezone.now()
    for title, status in (("Still open", "open"), ("Already resolved", "resolved")):
        Incident.objects.create(
            kind="latency_spike",
            cluster=cluster,
            application_name="demo",
            deployment_name="Model",
            title=title,
            status=status,
            started_at=now,
            last_signal_at=now,
            evidence={},
            causes=[],
        )
    log_in(page, live_server, "viewer", "/incidents/")
    page.wait_for_selector("text=Still open")
    with page.expect_navigation():
        page.select_option("select[name=status]", "resolved")
    assert "status=resolved" in page.url
    page.wait_for_selector("text=Already resolved")
    assert page.locator("text=Still open").count() == 0


def test_the_fleet_filters_narrow_the_rows_when_a_select_changes(page, live_server, people, team, other_team):
    Cluster.objects.create(
        name="reachable-one", team=team, dashboard_url="http://127.0.0.1:9", reachability=Reachability.OK
    )
    Cluster.objects.create(
        name="lost-one", team=team, dashboard_url="http://127.0.0.2:9", reachability=Reachability.UNREACHABLE
    )
    log_in(page, live_server, "root", "/")
    rows = page.locator("#cluster-rows")
    rows.locator("text=lost-one").wait_for()

    page.select_option("select[name=reachability]", "unreachable")
    page.wait_for_url("**reachability=unreachable**")
    rows.locator("text=reachable-one").wait_for(state="detached")
    assert rows.locator("text=lost-one").count() == 1

    page.select_option("select[name=reachability]", "")
    page.select_option("select[name=team]", other_team.slug)
    page.wait_for_url(f"**team={other_team.slug}**")
    rows.locator("text=lost-one").wait_for(state="detached")
