"""Calibration results: the job's output line parsed and checked, and the curve the sizing math
reads. Pure; no database, no network."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

from apps.calibration.job_script import AXES, ERROR_MARKER, MARKER, SHAPES
from apps.calibration.mix import quantile_sum

MAX_POINTS = 64
MAX_SAMPLES = 16
# Requests in a mix: each is measured at every level, so the job's time grows with them.
MAX_MIX = 8
MIB = 2**20


class CalibrationOutputError(ValueError):
    """The job's output holds no usable result; the message says why in a sentence."""


def parse_output(logs: str) -> dict:
    """Read the last FLEETDECK_CALIBRATION line of a job's logs.

    Returns {axis, device, shape, baseline_bytes, cold_baseline_bytes, limit_reason, points: [{x,
    peak_bytes, uss_peak_bytes, service_s}] sorted by x, monotone, warnings, mix}; `mix` holds, for a
    calibration of a weighted mix, each request's {label, share, points, limit_reason} ([] otherwise). Results of older
    scripts lack shape, the cold baseline and limit_reason (they come back "" or None) and the
    points' USS and service times (left out of the point). A curve whose peak falls as the axis grows
    is kept as measured, flagged `monotone: False` with a warning: smoothing it would hide noise the
    operator should see."""
    payload = _last_result_line(logs)
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise CalibrationOutputError(f"The result line is not JSON ({exc.msg} at character {exc.pos}).") from exc
    if not isinstance(data, dict):
        raise CalibrationOutputError("The result line is JSON but not an object.")
    axis = data.get("axis")
    if axis not in AXES:
        raise CalibrationOutputError(f"The result's axis is {axis!r}; expected one of {', '.join(AXES)}.")
    device = data.get("device")
    if not isinstance(device, str) or not device.strip() or len(device) > 32:
        raise CalibrationOutputError("The result has no device name.")
    baseline = data.get("baseline_bytes")
    if not _is_count(baseline):
        raise CalibrationOutputError("The result's baseline_bytes is not a non-negative integer.")
    shape = data.get("shape", "")
    if shape != "" and shape not in SHAPES:
        raise CalibrationOutputError(f"The result's shape is {shape!r}; expected one of {', '.join(SHAPES)}.")
    cold = data.get("cold_baseline_bytes")
    if cold is not None and not _is_count(cold):
        raise CalibrationOutputError("The result's cold_baseline_bytes is not a non-negative integer.")
    limit_reason = data.get("limit_reason")
    if limit_reason is not None and (not isinstance(limit_reason, str) or len(limit_reason) > 2000):
        raise CalibrationOutputError("The result's limit_reason is not a sentence.")
    points = _points(data.get("points"), axis, "The result")
    mix = _mix(data.get("mix"), axis)
    warnings = []
    previous = ("baseline", baseline)
    for point in points:
        if point["peak_bytes"] < previous[1]:
            where = "the baseline" if previous[0] == "baseline" else f"{axis} {previous[0]:g}"
            warnings.append(
                f"Peak memory falls from {previous[1] / MIB:.1f} MiB at {where} to {point['peak_bytes'] / MIB:.1f} "
                f"MiB at {axis} {point['x']:g}: the measurement is noisy or memory was freed in between; the curve is "
                "kept as measured."
            )
        previous = (point["x"], point["peak_bytes"])
    return {
        "axis": axis,
        "device": device.strip(),
        "shape": shape,
        "baseline_bytes": baseline,
        "cold_baseline_bytes": cold,
        "limit_reason": limit_reason,
        "points": points,
        "monotone": not warnings,
        "warnings": warnings,
        "mix": mix,
    }


def _points(raw_points, axis: str, where: str) -> list[dict]:
    """A result's points, checked and sorted by x; `where` names them in an error."""
    if not isinstance(raw_points, list) or not raw_points:
        raise CalibrationOutputError(f"{where} has no points.")
    if len(raw_points) > MAX_POINTS:
        raise CalibrationOutputError(f"{where} has {len(raw_points)} points; at most {MAX_POINTS} are accepted.")
    points = []
    for index, raw in enumerate(raw_points):
        at = f"Point {index}" if where == "The result" else f"{where}: point {index}"
        if not isinstance(raw, dict):
            raise CalibrationOutputError(f"{at} is not an object.")
        x, peak = raw.get(axis), raw.get("peak_bytes")
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise CalibrationOutputError(f"{at} has no positive {axis}.")
        if not _is_count(peak):
            raise CalibrationOutputError(f"{at} has no non-negative integer peak_bytes.")
        uss, service = raw.get("uss_peak_bytes"), raw.get("service_s")
        if uss is not None and not _is_count(uss):
            raise CalibrationOutputError(f"{at} has a uss_peak_bytes that is not a non-negative integer.")
        if service is not None and (
            isinstance(service, bool)
            or not isinstance(service, (int, float))
            or not math.isfinite(service)
            or service < 0
        ):
            raise CalibrationOutputError(f"{at} has a service_s that is not a non-negative number of seconds.")
        samples, rest_after = raw.get("peak_samples"), raw.get("rest_after_bytes")
        if samples is not None and (
            not isinstance(samples, list) or not 0 < len(samples) <= MAX_SAMPLES or not all(map(_is_count, samples))
        ):
            raise CalibrationOutputError(f"{at} has peak_samples that are not a list of byte counts.")
        if rest_after is not None and not _is_count(rest_after):
            raise CalibrationOutputError(f"{at} has a rest_after_bytes that is not a non-negative integer.")
        point = {"x": x, "peak_bytes": peak}
        point.update(
            {
                key: value
                for key, value in (
                    ("uss_peak_bytes", uss),
                    ("service_s", service),
                    ("peak_samples", samples),
                    ("rest_after_bytes", rest_after),
                )
                if value is not None
            }
        )
        points.append(point)
    points.sort(key=lambda point: point["x"])
    for a, b in pairwise(points):
        if a["x"] == b["x"]:
            of = "" if where == "The result" else f" of {where}"
            raise CalibrationOutputError(f"Two points{of} are at the same {axis} ({a['x']}).")
    return points


def _mix(raw, axis: str) -> list[dict]:
    """Each request of a mix as the job measured it: its label, share, points and why it stopped
    early; [] for a single request."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_MIX:
        raise CalibrationOutputError(f"The result's mix is not a list of 1 to {MAX_MIX} requests.")
    entries = []
    for index, entry in enumerate(raw):
        where = f"mix[{index}]"
        if not isinstance(entry, dict):
            raise CalibrationOutputError(f"{where} is not an object.")
        label, share, reason = entry.get("label"), entry.get("share"), entry.get("limit_reason")
        if not isinstance(label, str) or len(label) > 300:
            raise CalibrationOutputError(f"{where} has no label.")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 100:
            raise CalibrationOutputError(f"{where} has no share between 0 and 100.")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 2000):
            raise CalibrationOutputError(f"{where}'s limit_reason is not a sentence.")
        entries.append(
            {
                "label": label,
                "share": share,
                "points": _points(entry.get("points"), axis, where),
                "limit_reason": reason,
            }
        )
    return entries


def _last_result_line(logs: str) -> str:
    for line in reversed((logs or "").splitlines()):
        at = line.find(MARKER)
        if at < 0:
            continue
        rest = line[at:]
        if rest.startswith(ERROR_MARKER):
            reason = rest[len(ERROR_MARKER) :].strip()
            raise CalibrationOutputError(
                f"The calibration failed: {reason}" if reason else "The calibration failed without a reason."
            )
        if rest.startswith(MARKER + " "):
            return rest[len(MARKER) + 1 :].strip()
    raise CalibrationOutputError(f"The job printed no {MARKER} line.")


def reported_error(logs: str) -> str | None:
    """The reason the script gave on its error line, if it got that far."""
    for line in reversed((logs or "").splitlines()):
        at = line.find(ERROR_MARKER)
        if at >= 0:
            return line[at + len(ERROR_MARKER) :].strip() or None
    return None


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def steepest_step(baseline: int, points) -> int:
    """The steepest step between consecutive points, from the baseline at x = 0 on: what one more
    request (or token) can cost at worst, rounded up."""
    knots = [(0.0, baseline), *sorted((float(x), int(peak)) for x, peak in points if x > 0)]
    slopes = [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in pairwise(knots)]
    return max(math.ceil(max(slopes, default=0.0)), 0)


@dataclass(frozen=True)
class MixEntry:
    """One request of a calibrated mix: its share of traffic (percent) and what one more of it adds
    to a replica at rest (the steepest step of its own levels, from the common warm baseline)."""

    label: str
    share: float
    increment_bytes: int
    points: tuple[tuple[float, int], ...] = ()
    service_s: dict[float, float] = field(default_factory=dict)
    peak_samples: dict[float, list[int]] = field(default_factory=dict)
    rest_after: dict[float, int] = field(default_factory=dict)
    # What the request brings to a batch (prompt + generated), when the operator said: R3 prices tokens from it.
    tokens: int | None = None
    limit_reason: str | None = None


def mixed_service_s(entries) -> dict[float, float]:
    """Seconds a request drawn from the mix takes at each level: the share-weighted mean over the
    requests that measured that level (one that stopped early leaves the larger levels to the rest)."""
    levels = sorted({x for entry in entries for x in entry.service_s})
    times = {}
    for x in levels:
        measured = [entry for entry in entries if x in entry.service_s]
        times[x] = sum(e.share * e.service_s[x] for e in measured) / sum(e.share for e in measured)
    return times


@dataclass(frozen=True)
class Curve:
    """Peak memory of one replica against concurrency (requests in flight) or token sum (tokens
    in one batch). The baseline is the replica at rest once warm (after one request); it also
    anchors the curve at x = 0. `cold_baseline_bytes` is the replica before its first request.
    `service_s` maps x to the median seconds one request took at that level. `limit_reason` says
    why the run stopped before the last level asked for (the memory budget), None when it did not.
    `shape` is how the class was driven: starlette, asgi, handle or hook ("" for old rows)."""

    axis: str
    device: str
    baseline_bytes: int
    points: list[tuple[float, int]]
    measured_at: datetime
    calibration_id: int
    monotone: bool = True
    service_s: dict[float, float] = field(default_factory=dict)
    cold_baseline_bytes: int | None = None
    limit_reason: str | None = None
    shape: str = ""
    # x -> the peaks of that level's rounds, and what the replica held at rest after it (older rows: empty).
    peak_samples: dict[float, list[int]] = field(default_factory=dict)
    rest_after: dict[float, int] = field(default_factory=dict)
    # The requests of a weighted mix, each measured on its own ((): one representative request, whose levels are
    # `points`). With a mix, `points` are those of its largest share.
    mix: tuple[MixEntry, ...] = ()

    @property
    def is_mixed(self) -> bool:
        return len(self.mix) >= 2

    def mix_peak(self, concurrency: int) -> int:
        """A replica's peak with `concurrency` requests drawn from the mix: at rest plus the
        QUANTILE of the sum of their increments (apps.calibration.mix says why that quantile)."""
        return self.baseline_bytes + quantile_sum(
            [e.increment_bytes for e in self.mix], [e.share for e in self.mix], concurrency
        )

    def _knots(self) -> list[tuple[float, int]]:
        return [(0.0, self.baseline_bytes), *sorted((float(x), int(peak)) for x, peak in self.points if x > 0)]

    def peak_at(self, x: float) -> int:
        """Linear between measured points, linear past the last one along its last step (never
        falling: a dip at the end is noise, not a promise), and never below the baseline."""
        knots = self._knots()
        if x <= 0 or len(knots) == 1:
            return self.baseline_bytes
        for (x0, y0), (x1, y1) in pairwise(knots):
            if x <= x1:
                value = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                break
        else:
            (x0, y0), (x1, y1) = knots[-2], knots[-1]
            value = y1 + max((y1 - y0) / (x1 - x0), 0.0) * (x - x1)
        return max(math.ceil(value), self.baseline_bytes)

    @property
    def per_unit_bytes(self) -> int:
        """The steepest step between consecutive points, from the baseline on: what one more
        request (or token) can cost at worst, rounded up."""
        return steepest_step(self.baseline_bytes, self.points)
