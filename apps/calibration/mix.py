"""A replica's peak with c requests drawn from a weighted mix, at a high quantile. Pure.

A calibration of a mix measures each request's increment (what one more of it adds to a replica at
rest). A replica holding c requests drawn independently from the mix peaks at its resting memory
plus the sum of c increments; that sum's distribution is exact here, by convolving the mix with
itself c times (the multinomial over the entries, merged by sum), and sizing reads its QUANTILE.

Why QUANTILE is 0.9999: the issue's workload (a fifth of the requests several times heavier, two
in flight) had both large requests on one replica 4 % of the times the replica was full, and that
was the kill. A replica fills up on the order of a hundred times an hour in bursty traffic (a burst
every half minute or so); at 0.9999 such a replica holds a combination above the sized peak about
once in a hundred hours of those bursts, and even then the kill needs the node itself past Ray's
threshold, which the margin kept free (5 % or more) and the other replicas on the node, not at their
own tail at that moment, leave room for. The 99th percentile would let that happen about once an
hour per replica; higher quantiles reach the all-largest combination at every concurrency a replica
actually runs, the wasteful sizing a mix is meant to avoid.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache

QUANTILE = 0.9999
QUANTILE_TEXT = "99.99th percentile"
QUANTILE_REASON = (
    f"the {QUANTILE_TEXT} of c requests drawn from the mix: a replica filling up about 100 times an hour holds a "
    "heavier combination about once in 100 hours, and the margin kept free absorbs most of those; the 99th "
    "percentile would be once an hour, and sizing for the all-heaviest combination wastes the memory a mix saves"
)
# Distinct sums kept exactly. Past it (many entries at a high concurrency) increments are rounded up to a common
# grain so the support stays this small: the sum is then overstated by at most c grains, never understated.
MAX_SUPPORT = 8192


def _grain(increments: tuple[int, ...], c: int) -> int:
    if math.comb(c + len(increments) - 1, len(increments) - 1) <= MAX_SUPPORT:
        return 1
    return max(math.ceil(c * max(increments) / MAX_SUPPORT), 1)


@lru_cache(maxsize=256)
def sum_quantiles(increments: tuple[int, ...], shares: tuple[float, ...], c_max: int, q: float = QUANTILE) -> tuple:
    """At index c (0..c_max): the q-quantile of the sum of c increments drawn independently, each
    with probability its share (shares are normalised). The quantile is the least v with
    P(sum > v) <= 1 - q."""
    if not increments or len(increments) != len(shares) or c_max < 0:
        raise ValueError("A mix needs as many shares as increments, and a concurrency of 0 or more.")
    total = float(sum(shares))
    grain = _grain(increments, c_max)
    kernel: dict[int, float] = defaultdict(float)
    for increment, share in zip(increments, shares, strict=True):
        if share > 0:
            kernel[math.ceil(max(increment, 0) / grain)] += share / total
    dist = {0: 1.0}
    quantiles = [0]
    for _ in range(c_max):
        step: dict[int, float] = defaultdict(float)
        for value, p in dist.items():
            for units, pk in kernel.items():
                step[value + units] += p * pk
        dist = step
        quantiles.append(_quantile(dist, q) * grain)
    return tuple(quantiles)


def _quantile(dist: dict[int, float], q: float) -> int:
    # Summed from the top, so a tail of 1e-4 is not lost in 1 - (a sum near 1).
    allowed = (1 - q) * (1 + 1e-9)
    tail = 0.0
    for value in sorted(dist, reverse=True):
        if tail + dist[value] > allowed:
            return value
        tail += dist[value]
    return min(dist)


def quantile_sum(increments, shares, c: int, q: float = QUANTILE) -> int:
    """The q-quantile of the sum of c increments drawn from the mix."""
    if c <= 0:
        return 0
    return sum_quantiles(tuple(int(i) for i in increments), tuple(float(s) for s in shares), int(c), q)[int(c)]


def largest_tail_increment(increments, shares, c: int, room: int, q: float = QUANTILE) -> int:
    """How large the mix's heaviest request may grow, at its share, before the q-quantile of c
    requests passes `room`: where the mix's tail would break the budget. 0 when not even the mix
    as it is with that request at nothing fits. Searched to a MiB, rounded down."""
    increments = [int(i) for i in increments]
    heaviest = max(range(len(increments)), key=lambda i: increments[i])

    def fits(x: int) -> bool:
        trial = [*increments[:heaviest], x, *increments[heaviest + 1 :]]
        return quantile_sum(trial, shares, c, q) <= room

    mib = 2**20
    if room < 0 or not fits(0):
        return 0
    low, high = 0, max(room // mib, 0)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle * mib):
            low = middle
        else:
            high = middle - 1
    return low * mib
