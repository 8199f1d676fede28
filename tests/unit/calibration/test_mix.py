"""The peak of c requests drawn from a weighted mix: the exact distribution of their sum, and its quantile."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from apps.calibration import mix

MIB = 2**20
SMALL, LARGE = 100 * MIB, 500 * MIB


def test_two_requests_from_an_80_20_mix_match_the_hand_computation():
    # c = 2: both small 0.8² = 64 % (200 MiB), one of each 2 × 0.8 × 0.2 = 32 % (600 MiB), both large 0.2² = 4 %
    # (1,000 MiB). The quantile is the least v with P(sum > v) <= 1 - q.
    assert mix.quantile_sum([SMALL, LARGE], [80, 20], 2, q=0.5) == 200 * MIB
    assert mix.quantile_sum([SMALL, LARGE], [80, 20], 2, q=0.95) == 600 * MIB  # P(> 600) = 4 % <= 5 %
    assert mix.quantile_sum([SMALL, LARGE], [80, 20], 2, q=0.99) == 1000 * MIB  # 4 % > 1 %
    assert mix.quantile_sum([SMALL, LARGE], [80, 20], 2) == 1000 * MIB


def test_four_requests_leave_the_all_large_combination_out_only_where_it_is_rare_enough():
    # c = 4: P(4 large) = 0.2^4 = 0.16 % (above 1 - 0.9999), P(>= 3 large) = 2.72 %.
    assert mix.quantile_sum([SMALL, LARGE], [80, 20], 4) == 4 * LARGE
    assert mix.quantile_sum([SMALL, LARGE], [80, 20], 4, q=0.99) == 3 * LARGE + SMALL
    # 95/5 at c = 8: P(>= 5 large) = 1.6e-5, P(>= 4 large) = 3.7e-4, so four large and four small.
    assert mix.quantile_sum([SMALL, LARGE], [95, 5], 8) == 4 * LARGE + 4 * SMALL


def brute_force(increments, shares, c, q):
    total = sum(shares)
    mass: dict[int, float] = {}
    for draw in itertools.product(range(len(increments)), repeat=c):
        value = sum(increments[i] for i in draw)
        mass[value] = mass.get(value, 0.0) + math.prod(shares[i] / total for i in draw)
    tail = 0.0
    for value in sorted(mass, reverse=True):
        if tail + mass[value] > 1 - q:
            return value
        tail += mass[value]
    return min(mass)


@pytest.mark.parametrize("c", [1, 3, 5])
def test_three_requests_match_every_ordered_draw_enumerated(c):
    increments, shares = [10 * MIB, 37 * MIB, 240 * MIB], [60, 30, 10]
    # Levels away from the probabilities of these shares (0.1, 0.4...), where rounding would decide.
    for q in (0.55, 0.87, 0.97, 0.9999):
        assert mix.quantile_sum(increments, shares, c, q) == brute_force(increments, shares, c, q)


def test_every_concurrency_up_to_the_largest_comes_from_one_pass():
    quantiles = mix.sum_quantiles((SMALL, LARGE), (80.0, 20.0), 3)
    assert quantiles == (0, LARGE, 2 * LARGE, 3 * LARGE)


def test_eight_requests_at_64_stay_fast_and_never_understate():
    increments = [(i + 1) * 37 * MIB + 12_345 for i in range(8)]
    shares = [12.5] * 8
    started = time.perf_counter()
    value = mix.quantile_sum(increments, shares, 64)
    assert time.perf_counter() - started < 5
    # Rounded up to a common grain: within c grains above the exact sum, and never below the mean sum.
    assert 64 * sum(increments) / 8 <= value <= 64 * max(increments)


def test_the_heaviest_request_may_grow_until_the_quantile_passes_the_room():
    # 95/5 at c = 8 keeps four large ones (see above): 4 x + 400 MiB <= 3,000 MiB, so x <= 650 MiB.
    assert mix.largest_tail_increment([SMALL, LARGE], [95, 5], 8, 3000 * MIB) == 650 * MIB
    # Not even the light requests fit: nothing may grow.
    assert mix.largest_tail_increment([SMALL, LARGE], [95, 5], 8, 500 * MIB) == 0


def test_the_quantile_and_its_reason_are_stated():
    assert mix.QUANTILE == 0.9999 and "99.99th percentile" in mix.QUANTILE_REASON
    assert "once in 100 hours" in mix.QUANTILE_REASON
