"""The memory budget's safety margin, from the spread a calibration's repeated rounds saw."""

from __future__ import annotations

from datetime import UTC, datetime

from apps.calibration.curve import Curve
from apps.remediation import margin, measurements

MIB = 2**20


def _curve(samples: dict[float, list[int]], rest_after: dict[float, int] | None = None) -> Curve:
    return Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=200 * MIB,
        points=[(x, max(peaks)) for x, peaks in samples.items()],
        measured_at=datetime(2026, 12, 1, tzinfo=UTC),
        calibration_id=7,
        peak_samples=samples,
        rest_after=rest_after or {},
    )


def test_a_steady_deployment_gets_the_floor():
    # Peaks within 1 %: 2 x 1 % + nothing kept is 2 %, below the 5 % floor.
    steady = _curve({1: [1000 * MIB, 995 * MIB, 990 * MIB], 4: [3000 * MIB, 2990 * MIB, 2980 * MIB]})
    m = margin.from_curve(steady)
    assert m.fraction == margin.FLOOR and "the floor" in m.reason and "calibration #7" in m.reason


def test_a_noisy_deployment_gets_twice_its_spread_plus_what_the_allocator_keeps():
    # At 4 the peaks run 3,000-3,600 MiB: 600 / 3,600 = 16.7 % spread; 180 MiB kept at rest after the levels
    # is 5 % of the top peak. 2 x 16.7 % + 5 % = 38.3 %.
    noisy = _curve(
        {1: [1000 * MIB, 990 * MIB, 1010 * MIB], 4: [3000 * MIB, 3600 * MIB, 3300 * MIB]},
        rest_after={1: 250 * MIB, 4: 380 * MIB},
    )
    m = margin.from_curve(noisy)
    assert abs(m.fraction - (2 * 600 / 3600 + 180 / 3600)) < 1e-9
    assert "16.7% spread of the peaks at 4" in m.reason and "5.0% the allocator kept" in m.reason


def test_without_repeated_rounds_the_margin_is_the_old_flat_one():
    old = _curve({1: [1000 * MIB], 4: [3000 * MIB]})
    assert margin.from_curve(old).fraction == margin.UNMEASURED
    assert "unknown" in margin.from_curve(old).reason


def test_the_budget_keeps_the_margin_free_and_says_so():
    steady = margin.from_curve(_curve({1: [1000 * MIB, 995 * MIB, 990 * MIB]}))
    budget = measurements.budget_from_nodes([{"mem_total": 10_000 * MIB, "mem_used": 1_000 * MIB}], steady)
    room = 0.95 * 10_000 * MIB - 1_000 * MIB  # Ray's default threshold less what is used
    assert budget.bytes_per_node == int(room * 0.95) and "5% kept free" in budget.reason
    flat = measurements.budget_from_nodes([{"mem_total": 10_000 * MIB, "mem_used": 1_000 * MIB}])
    assert flat.bytes_per_node == int(room * 0.8)


def test_the_operator_may_ask_for_more_never_silently_less():
    computed = margin.Margin(0.08, "computed")
    assert margin.with_request(computed, 0.15).fraction == 0.15
    assert "as the operator asked" in margin.with_request(computed, 0.15).reason
    assert margin.with_request(computed, 0.05) is computed
