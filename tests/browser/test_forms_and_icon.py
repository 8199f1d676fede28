"""What a person sees first on a form or a tab: each checkbox on the line of its label, before
the words, and Fleetdeck's icon instead of a request for a missing one."""

from __future__ import annotations

import pytest

from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.browser.pages import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def assert_beside_its_words(page, checkbox: str) -> None:
    box = page.locator(checkbox).bounding_box()
    words = page.locator(checkbox).locator("xpath=..").bounding_box()
    assert box["width"] < 30, f"{checkbox} is stretched to {box['width']} px"
    # Level with its words (not on a line above them), at the label's start, the words after it.
    assert abs((box["y"] + box["height"] / 2) - (words["y"] + words["height"] / 2)) < 6
    assert words["width"] > box["width"] + 20 and box["x"] - words["x"] < 2


@pytest.fixture
def deployment(team, use_replay):
    cluster = Cluster.objects.create(name="vision-prod", team=team, dashboard_url="http://ray.test:8265")
    sync.sync_cluster(cluster.pk)
    return Deployment.objects.select_related("application").filter(application__cluster=cluster).first()


def test_checkboxes_sit_before_their_labels_on_the_recycle_warmup_and_kubernetes_forms(
    page, live_server, people, deployment
):
    log_in(page, live_server, "root", f"/deployments/{deployment.pk}/recycle-schedule/")
    page.wait_for_selector("text=Recycle every (hours)")
    assert_beside_its_words(page, "input[name=enabled]")
    assert_beside_its_words(page, "input[name=window_days][value='0']")
    monday, tuesday = (page.locator(f"input[name=window_days][value='{d}']").bounding_box() for d in (0, 1))
    assert abs(monday["y"] - tuesday["y"]) < 2  # the weekdays wrap as one row
    page.screenshot(path="/tmp/fleetdeck-schedule-form.png", full_page=True)

    page.goto(f"{live_server.url}/applications/{deployment.application.pk}/warmups/")
    page.wait_for_selector("text=Timeout per request (seconds)")
    assert_beside_its_words(page, "input[name=enabled]")

    page.goto(f"{live_server.url}/kubernetes/new/")
    assert_beside_its_words(page, "input[name=read_only]")
    assert_beside_its_words(page, "input[name=in_cluster]")
    page.screenshot(path="/tmp/fleetdeck-kube-form.png", full_page=True)


def test_every_page_links_an_icon_that_is_served(page, live_server, people):
    missing: list[str] = []
    page.on("response", lambda response: missing.append(response.url) if response.status >= 400 else None)
    log_in(page, live_server, "viewer", "/")
    page.wait_for_selector("h1:text('Fleet')")
    for path in ("/", "/incidents/", "/changes/"):
        page.goto(f"{live_server.url}{path}")
        icon = page.evaluate("document.querySelector('link[rel=icon]').href")
        assert icon.endswith(".svg")
        assert page.evaluate("(href) => fetch(href).then((r) => [r.status, r.headers.get('content-type')])", icon) == [
            200,
            "image/svg+xml",
        ]
    assert missing == []
