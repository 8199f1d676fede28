"""Calibration results: the job's output line parsed and checked, and the curve the sizing math
reads. Pure; no database, no network."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

from apps.calibration.job_script import AXES, ERROR_MARKER, MARKER, SHAPES

MAX_POINTS = 64
MAX_SAMPLES = 16
MIB = 2**20


class CalibrationOutputError(ValueError):
    """The job's output holds no usable result; the message says why in a sentence."""


def parse_output(logs: str) -> dict:
    """Read the last FLEETDECK_CALIBRATION line of a job's logs.

    Returns {axis, device, shape, baseline_bytes, cold_baseline_bytes, limit_reason, points: [{x,
    peak_bytes, uss_peak_bytes, service_s}] sorted by x, monotone, warnings}. Results of older
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
    raw_points = data.get("points")
    if not isinstance(raw_points, list) or not raw_points:
        raise CalibrationOutputError("The result has no points.")
    if len(raw_points) > MAX_POINTS:
        raise CalibrationOutputError(f"The result has {len(raw_points)} points; at most {MAX_POINTS} are accepted.")
    points = []
    for index, raw in enumerate(raw_points):
        if not isinstance(raw, dict):
            raise CalibrationOutputError(f"Point {index} is not an object.")
        x, peak = raw.get(axis), raw.get("peak_bytes")
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise CalibrationOutputError(f"Point {index} has no positive {axis}.")
        if not _is_count(peak):
            raise CalibrationOutputError(f"Point {index} has no non-negative integer peak_bytes.")
        uss, service = raw.get("uss_peak_bytes"), raw.get("service_s")
        if uss is not None and not _is_count(uss):
            raise CalibrationOutputError(f"Point {index} has a uss_peak_bytes that is not a non-negative integer.")
        if service is not None and (
            isinstance(service, bool)
            or not isinstance(service, (int, float))
            or not math.isfinite(service)
            or service < 0
        ):
            raise CalibrationOutputError(f"Point {index} has a service_s that is not a non-negative number of seconds.")
        samples, rest_after = raw.get("peak_samples"), raw.get("rest_after_bytes")
        if samples is not None and (
            not isinstance(samples, list) or not 0 < len(samples) <= MAX_SAMPLES or not all(map(_is_count, samples))
        ):
            raise CalibrationOutputError(f"Point {index} has peak_samples that are not a list of byte counts.")
        if rest_after is not None and not _is_count(rest_after):
            raise CalibrationOutputError(f"Point {index} has a rest_after_bytes that is not a non-negative integer.")
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
            raise CalibrationOutputError(f"Two points are at the same {axis} ({a['x']}).")
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
    }


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
        slopes = [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in pairwise(self._knots())]
        return max(math.ceil(max(slopes, default=0.0)), 0)
