"""The calibration job's output parser, and the memory curve the wizard reads."""

from __future__ import annotations

import pytest

from apps.calibration.curve import CalibrationOutputError, Curve, parse_output
from tests.unit.calibration.helpers import MIB, WHEN, curve, result_line


def test_the_concurrency_result_is_read_from_the_last_marker_line_among_other_logs():
    logs = "Running entrypoint for job x\nbaseline: 100 MiB\n" + result_line() + "\n"
    parsed = parse_output(logs)
    # An older script's line: no shape, cold baseline, USS, service time nor limit reason.
    assert parsed == {
        "axis": "concurrency",
        "device": "cpu",
        "shape": "",
        "baseline_bytes": 100 * MIB,
        "cold_baseline_bytes": None,
        "limit_reason": None,
        "points": [
            {"x": 1, "peak_bytes": 164 * MIB},
            {"x": 2, "peak_bytes": 228 * MIB},
            {"x": 4, "peak_bytes": 356 * MIB},
        ],
        "monotone": True,
        "warnings": [],
        "mix": [],
    }


def test_the_token_sum_axis_of_the_reference_app_is_accepted_and_sorted():
    line = result_line(
        axis="token_sum",
        device="cuda",
        points=[{"token_sum": 2048, "peak_bytes": 900}, {"token_sum": 512, "peak_bytes": 600}],
    )
    parsed = parse_output(line)
    assert parsed["axis"] == "token_sum" and parsed["device"] == "cuda"
    assert [p["x"] for p in parsed["points"]] == [512, 2048]


def test_a_later_result_line_wins_and_a_log_prefix_before_the_marker_is_ignored():
    logs = result_line(device="old") + "\n(pid=12) " + result_line(device="new")
    assert parse_output(logs)["device"] == "new"


def test_extra_keys_on_points_such_as_host_rss_are_ignored():
    line = result_line(points=[{"concurrency": 1, "peak_bytes": 5, "rss_peak_bytes": 9}], baseline_bytes=1)
    assert parse_output(line)["points"] == [{"x": 1, "peak_bytes": 5}]


def test_a_peak_that_falls_is_kept_as_measured_and_flagged_not_monotone():
    line = result_line(
        points=[{"concurrency": 1, "peak_bytes": 300 * MIB}, {"concurrency": 2, "peak_bytes": 250 * MIB}]
    )
    parsed = parse_output(line)
    assert parsed["monotone"] is False
    assert [p["peak_bytes"] for p in parsed["points"]] == [300 * MIB, 250 * MIB]
    assert parsed["warnings"] == [
        "Peak memory falls from 300.0 MiB at concurrency 1 to 250.0 MiB at concurrency 2: the measurement "
        "is noisy or memory was freed in between; the curve is kept as measured."
    ]


def test_a_peak_below_the_baseline_is_flagged_too():
    parsed = parse_output(result_line(baseline_bytes=500, points=[{"concurrency": 1, "peak_bytes": 400}]))
    assert parsed["monotone"] is False and "at the baseline" in parsed["warnings"][0]


@pytest.mark.parametrize(
    "logs, message",
    [
        ("nothing to see\n", "printed no FLEETDECK_CALIBRATION line"),
        ("FLEETDECK_CALIBRATION {not json", "not JSON"),
        ("FLEETDECK_CALIBRATION [1, 2]", "not an object"),
        (result_line(axis="batch"), "axis is 'batch'"),
        (result_line(device=""), "no device"),
        (result_line(baseline_bytes=-1), "baseline_bytes"),
        (result_line(baseline_bytes=True), "baseline_bytes"),
        (result_line(points=[]), "no points"),
        (result_line(points=[{"concurrency": 0, "peak_bytes": 1}]), "Point 0 has no positive concurrency"),
        (result_line(points=[{"token_sum": 1, "peak_bytes": 1}]), "Point 0 has no positive concurrency"),
        (result_line(points=[{"concurrency": 1, "peak_bytes": 1.5}]), "Point 0 has no non-negative integer peak_bytes"),
        (
            result_line(points=[{"concurrency": 2, "peak_bytes": 1}, {"concurrency": 2, "peak_bytes": 2}]),
            "same concurrency",
        ),
        (result_line(points=[{"concurrency": k + 1, "peak_bytes": 1} for k in range(65)]), "at most 64"),
        (
            "FLEETDECK_CALIBRATION_ERROR ModuleNotFoundError: No module named 'x'",
            "The calibration failed: ModuleNotFoundError",
        ),
    ],
)
def test_malformed_output_is_refused_with_a_sentence(logs, message):
    with pytest.raises(CalibrationOutputError, match=message) as caught:
        parse_output(logs)
    assert str(caught.value).endswith(".") or "ModuleNotFoundError" in str(caught.value)


def test_an_error_line_after_an_older_result_means_the_run_failed():
    with pytest.raises(CalibrationOutputError, match="boom"):
        parse_output(result_line() + "\nFLEETDECK_CALIBRATION_ERROR boom")


# --- Curve -------------------------------------------------------------------------------------


def test_peak_at_interpolates_between_points_and_from_the_baseline_to_the_first():
    c = curve([(1, 200), (3, 400)])
    assert c.peak_at(1) == 200 and c.peak_at(2) == 300 and c.peak_at(3) == 400
    assert c.peak_at(0.5) == 150  # between the baseline at 0 and the first point
    assert c.peak_at(0) == 100 and c.peak_at(-5) == 100


def test_peak_at_extrapolates_along_the_last_step():
    c = curve([(1, 200), (2, 250), (4, 450)])
    assert c.peak_at(8) == 450 + 4 * 100


def test_one_point_extrapolates_from_the_baseline():
    c = curve([(2, 300)])
    assert c.peak_at(1) == 200 and c.peak_at(4) == 500
    assert c.per_unit_bytes == 100


def test_a_flat_curve_costs_nothing_per_unit_and_stays_at_the_baseline():
    c = curve([(1, 100), (2, 100), (4, 100)])
    assert c.per_unit_bytes == 0 and c.peak_at(64) == 100


def test_per_unit_bytes_is_the_steepest_step_including_the_first_request():
    assert curve([(1, 400), (2, 450), (4, 550)]).per_unit_bytes == 300  # 100 -> 400 for the first request
    assert curve([(1, 150), (2, 200), (4, 600)]).per_unit_bytes == 200  # (600 - 200) / 2


def test_per_unit_bytes_rounds_fractional_slopes_up():
    c = Curve(axis="token_sum", device="cuda", baseline_bytes=0, points=[(3.0, 10)], measured_at=WHEN, calibration_id=1)
    assert c.per_unit_bytes == 4


def test_a_dip_at_the_end_never_extrapolates_downwards_nor_below_the_baseline():
    c = curve([(1, 300), (2, 200)], monotone=False)
    assert c.peak_at(10) == 200
    assert curve([(1, 50)]).peak_at(1) == 100  # a peak under the baseline reads as the baseline
    assert curve([(1, 300), (2, 200)]).per_unit_bytes == 200


def test_the_log_tail_a_person_reads_leaves_out_the_result_line_and_encoded_blobs():
    from apps.calibration.services import readable_tail

    logs = "\n".join(
        [
            "python -c 'import base64' " + "QUJD" * 400,
            "shape starlette; at rest 120.0 MiB cold, 121.0 MiB warm on cpu",
            "concurrency 1: peak 400.0 MiB, 0.230 s per request",
            'FLEETDECK_CALIBRATION {"axis": "concurrency", "points": []}',
        ]
    )
    tail = readable_tail(logs)
    assert "QUJD" not in tail and "characters of encoded data left out" in tail
    assert "concurrency 1: peak 400.0 MiB" in tail and "[the result line" in tail
