"""The deployment page's calibration chart comes from a script file the page loads, not from a
script in the card: it is drawn with the page, and again in each card htmx swaps in while a
calibration runs, and the `page` fixture fails on anything the content security policy blocks."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.calibration.models import MemoryCalibration
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.browser.pages import log_in, wait_until
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MIB = 2**20
CHART = "Chart.getChart(document.getElementById('calibration-chart'))"


@pytest.fixture
def model(team, use_replay) -> Deployment:
    cluster = ClusterFactory(name="vision-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    return Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")


def calibration(model: Deployment, submission_id: str, **fields) -> MemoryCalibration:
    return MemoryCalibration.objects.create(
        deployment=model,
        cluster=model.application.cluster,
        application_name=model.application.name,
        deployment_name=model.name,
        submission_id=submission_id,
        **fields,
    )


def measured(model: Deployment, at, levels: tuple[int, ...]) -> MemoryCalibration:
    """A succeeded calibration finished `at`: 100 MiB at rest, +64 MiB a request."""
    return calibration(
        model,
        "measured",
        state="succeeded",
        axis="concurrency",
        device="cpu",
        baseline_bytes=100 * MIB,
        finished_at=at,
        points=[{"x": k, "peak_bytes": (100 + 64 * k) * MIB, "service_s": 0.1} for k in levels],
    )


def test_the_calibration_chart_is_drawn_on_the_page_and_in_every_card_htmx_swaps_in(page, live_server, people, model):
    measured(model, timezone.now(), levels=(1, 2, 4))
    calibration(model, "running")  # still pending: the card polls, and htmx swaps it in every 2 s

    log_in(page, live_server, "viewer", reverse("fleet:deployment", args=[model.pk]))
    page.wait_for_selector("#calibration-chart")
    wait_until(page, f"!!{CHART}")
    assert page.evaluate(f"{CHART}.data.datasets[0].data.map((point) => point.y)") == [164, 228, 356]

    page.evaluate("window.firstCard = document.getElementById('calibration-card')")
    wait_until(page, f"document.getElementById('calibration-card') !== window.firstCard && !!{CHART}")
    # The chart of the card htmx replaced was let go.
    assert page.evaluate("Object.values(Chart.instances).every((chart) => chart.canvas.isConnected)")


def test_the_charts_print_a_moment_as_the_page_beside_them_does(page, live_server, people, model, settings):
    """The page prints times in the server's zone; a chart formatting in the browser's own zone and
    locale would put another hour and another date order beside them."""
    settings.TIME_ZONE = "America/New_York"  # not the browser's (UTC here), so a mix-up shows
    at = timezone.now().replace(microsecond=0)
    measured(model, at, levels=(1,))
    log_in(page, live_server, "viewer", reverse("fleet:deployment", args=[model.pk]))
    page.wait_for_selector("#calibration-card")
    # The card prints when the curve was measured; the charts' clock formats the same instant.
    shown = page.evaluate(f"FleetdeckClock.when({at.timestamp() * 1000})")
    with timezone.override("America/New_York"):
        from apps.fleet.templatetags.fleet_tags import when

        assert shown == when(at)
    assert shown in page.inner_text("#calibration-card")
    assert page.evaluate(f"FleetdeckClock.clock({at.timestamp() * 1000})") == shown[-8:]
