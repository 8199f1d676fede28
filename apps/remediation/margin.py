"""The safety margin between a node's memory budget and the point where Ray kills, sized from the measurement.

A flat 20 % was several times what a steady deployment's calibration called for (its peaks repeated within a few
per cent) and ruled out configs that ran safely; a noisy one needs more. The calibration now runs each level
several times, so the margin is made of what it saw:

- the spread of a level's peaks, relative to the peak: the budget is filled with replicas at their measured peak
  (the largest round), and the next burst may land above it by about that spread again, so twice the worst
  relative spread is kept free (three rounds see about 1.7 standard deviations; twice that is about 3.4);
- what the allocator keeps after a level, relative to the top peak: a long-lived replica starts its next burst
  from there;
- never below FLOOR: the calibration reads one process's RSS, Ray's monitor reads the node's used memory, which
  also holds the kernel's memory for the replica (page tables, socket buffers) and other processes' drift.

For a weighted mix each request's own rounds count alike: the noisiest request of the mix sets the spread.

Ray's memory monitor checks every 250 ms (memory_monitor_refresh_ms) and kills only what is above the threshold
at a check; the calibration samples every 10 ms, so every peak the monitor can see was measured, and no term is
added for the monitor's period.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR = 0.05
# Without repeated rounds (a calibration from before they were run, or memory from a kill message) the spread is
# unknown: the margin Fleetdeck always used.
UNMEASURED = 0.20
CEILING = 0.5
SPREAD_FACTOR = 2


@dataclass(frozen=True)
class Margin:
    fraction: float
    reason: str

    def apply(self, room: float) -> int:
        return int(room * (1 - self.fraction))


def unmeasured(why: str = "no calibration repeated its levels, so the spread of the peaks is unknown") -> Margin:
    return Margin(UNMEASURED, f"{UNMEASURED:.0%} kept free: {why}")


def from_curve(curve) -> Margin:
    """The margin a calibration curve's repeated rounds call for (see the module's docstring)."""
    # Keyed by where the rounds ran: the level, and for a mix's other requests, which request.
    repeated = {
        f"{x:g}" if label is None else f"{x:g} of {label}": peaks
        for label, samples in _rounds(curve)
        for x, peaks in samples.items()
        if len(peaks) >= 2
    }
    if not repeated:
        return unmeasured()
    spreads = {x: (max(p) - min(p)) / max(p) for x, p in repeated.items() if max(p) > 0}
    worst_x = max(spreads, key=spreads.get)
    spread = spreads[worst_x]
    mix = getattr(curve, "mix", ())
    _, top_peak = max(curve.points)
    top_peak = max([top_peak, *(peak for e in mix for _, peak in e.points)])
    rests = [*curve.rest_after.values(), *(rest for e in mix for rest in e.rest_after.values())]
    kept = max(rests, default=curve.baseline_bytes) - curve.baseline_bytes
    retained = max(kept, 0) / top_peak if top_peak else 0.0
    computed = SPREAD_FACTOR * spread + retained
    fraction = min(max(computed, FLOOR), CEILING)
    low, high = min(repeated[worst_x]) / 2**20, max(repeated[worst_x]) / 2**20
    parts = (
        f"{SPREAD_FACTOR} x the {spread:.1%} spread of the peaks at {worst_x} ({len(repeated[worst_x])} rounds: "
        f"{low:,.0f}-{high:,.0f} MiB) + {retained:.1%} the allocator kept at rest after the levels"
    )
    if computed < FLOOR:
        how = f"{fraction:.0%} kept free, the floor: {parts} is {computed:.1%}, below the {FLOOR:.0%} floor"
    elif computed > CEILING:
        how = (
            f"{fraction:.0%} kept free, the ceiling: {parts} is {computed:.1%}; calibrate again, the peaks vary widely"
        )
    else:
        how = f"{fraction:.1%} kept free: {parts}"
    return Margin(fraction, f"{how} (calibration #{curve.calibration_id})")


def _rounds(curve):
    """(None, the curve's own rounds), then (label, rounds) for each request of a mix."""
    yield None, getattr(curve, "peak_samples", None) or {}
    for entry in getattr(curve, "mix", ()):
        yield entry.label, entry.peak_samples


# What an operator types to take less margin than the measurement calls for.
CONFIRM_LESS = "accept the OOM risk"
# A margin the page shows rounded to 0.1 % comes back as asked: within this it is the computed one.
SAME = 0.001


def with_request(computed: Margin, asked: float | None, confirmed: bool = False) -> Margin:
    """The operator may ask for more margin than computed; less only with a typed confirmation."""
    if asked is None or abs(asked - computed.fraction) < SAME:
        return computed
    if asked > computed.fraction:
        return Margin(asked, f"{asked:.0%} kept free, as the operator asked (computed: {computed.reason})")
    if not confirmed:
        return computed
    return Margin(
        asked,
        f"{asked:.0%} kept free, less than the {computed.fraction:.1%} computed, as the operator confirmed "
        f"(computed: {computed.reason})",
    )


def refusal(computed_fraction: float, asked: float | None, confirmation: str) -> str | None:
    """Why an asked margin is refused: less than computed without the typed confirmation."""
    if asked is None or asked > computed_fraction - SAME or confirmation.strip().lower() == CONFIRM_LESS.lower():
        return None
    return (
        f"{asked:.1%} is less than the {computed_fraction:.1%} the calibration's spread calls for: type "
        f'"{CONFIRM_LESS}" to take it anyway'
    )
