"""The deployment page's calibration card: the form, polling, charts and failures."""

from __future__ import annotations

from django.urls import reverse

from apps.calibration import services
from apps.calibration.models import MemoryCalibration
from tests.unit.calibration.helpers import MIB, job_says, page_of, result_line


def test_the_card_explains_calibration_and_offers_the_form_to_operators_only(login, model):
    page = page_of(login("operator"), model)
    assert "Memory calibration" in page and "compute max_ongoing_requests" in page and "conservative defaults" in page
    assert reverse("calibration:calibrate", args=[model.pk]) in page
    assert reverse("calibration:calibrate", args=[model.pk]) not in page_of(login("viewer"), model)


def test_calibrating_from_the_card_swaps_in_a_card_that_polls(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]), {"levels": "1, 2,4", "call": '"hi"'}, HTTP_HX_REQUEST="true"
    )
    card = response.content.decode()
    assert response.status_code == 200 and 'hx-trigger="every 2s"' in card and "pending" in card
    assert reverse("calibration:calibrate", args=[model.pk]) not in card  # no second form while one runs
    calibration = MemoryCalibration.objects.get()
    assert calibration.levels == [1, 2, 4] and calibration.request["call"] == "hi"


def test_the_form_shows_what_is_wrong(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]), {"levels": "a,b", "call": "hi"}, HTTP_HX_REQUEST="true"
    )
    card = response.content.decode()
    assert "whole numbers separated by commas" in card and "A string needs quotes" in card
    assert not MemoryCalibration.objects.exists()


def test_a_viewer_cannot_calibrate_from_the_page(login, model):
    assert login("viewer").post(reverse("calibration:calibrate", args=[model.pk]), {"levels": "1"}).status_code == 403


def test_the_card_charts_the_latest_curve_and_stops_polling(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    card = login("viewer").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in card and 'id="calibration-chart"' in card
    assert '"baseline": 100.0' in card and '{"x": 4.0, "y": 356.0}' in card and "64\xa0MiB" in card


def test_calibrating_by_token_sum_from_the_card_uses_the_axis_defaults_and_says_so(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]),
        {"axis": "token_sum", "levels": "", "call": ""},
        HTTP_HX_REQUEST="true",
    )
    assert "measures peak memory at batch token sums 256, 1024, 4096" in response.content.decode()
    calibration = MemoryCalibration.objects.get()
    assert calibration.axis == "token_sum" and calibration.levels == [256, 1024, 4096]


def test_the_form_judges_levels_by_their_axis(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]),
        {"axis": "concurrency", "levels": "4096"},
        HTTP_HX_REQUEST="true",
    )
    assert "The concurrency levels must be between 1 and 64." in response.content.decode()
    assert not MemoryCalibration.objects.exists()


def test_the_card_charts_a_token_sum_curve_against_the_token_sum(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model, axis="token_sum")
    points = [{"token_sum": 256, "peak_bytes": 116 * MIB}, {"token_sum": 1024, "peak_bytes": 164 * MIB}]
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(axis="token_sum", points=points))
    assert services.poll(calibration.pk).state == "succeeded"
    card = login("viewer").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert '"axis": "token sum per batch"' in card and "per token" in card and '{"x": 1024.0, "y": 164.0}' in card


def test_the_card_shows_a_failure_with_the_log_tail(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(
        use_replay, calibration, "FAILED", logs="oops\nFLEETDECK_CALIBRATION_ERROR it broke\n", message="exit code 1"
    )
    services.poll(calibration.pk)
    page = page_of(login("viewer"), model)
    assert "it broke (Ray: exit code 1)" in page and "End of the job's log" in page and "oops" in page


def test_the_card_fragment_is_only_for_htmx_and_visible_teams(login, model):
    assert login("viewer").get(reverse("calibration:card", args=[model.pk])).status_code == 302
    assert (
        login("outsider").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").status_code == 404
    )
