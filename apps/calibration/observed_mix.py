"""A mix taken from the traffic itself: the sizes the deployment's requests had (its request-size
histogram, see apps.fleet.request_sizes), each size class a request of the operator's template at
that size, weighted by the requests the class had.

The template says where a request's size goes: "{size}" becomes the class's size (a number; a JSON
value that is exactly "{size}" becomes the number itself), "{pad}" a filler of that size: that many
bytes ("x"), or for a histogram of tokens that many words ("word", a token each in common
tokenizers). The job expands the filler (job_script.padded), so a 32,000-token prompt does not have
to travel in its command line.

Each class is sized at its heaviest bucket's upper bound, so no request of the class is heavier than
what is measured. Requests above the histogram's last bound can only be measured at that bound: the
mix says how many there were, and an input cap at that bound (R3) makes it exact."""

from __future__ import annotations

import json
from typing import NoReturn

from django.core.exceptions import ValidationError

from apps.calibration.curve import MAX_MIX
from apps.calibration.inputs import MAX_MIX_RUNS, OBSERVED_MIX, validate_mix, validate_request
from apps.fleet.request_sizes import classes

SIZE, PAD = "{size}", "{pad}"
# The largest filler a job expands: 64 MiB of body, past what a proxy takes in one request.
MAX_PAD = 64 * 2**20


def _refuse(field: str, message: str) -> NoReturn:
    raise ValidationError({field: f"{field}: {message}"})


def observed_mix(template: dict | None, observed: dict | None, levels: int) -> tuple[list[dict], dict]:
    """(the mix, what it was taken from: {"source", "hours", "requests", "above_last_bound"}).
    `observed` is apps.incidents.request_sizes.observed's answer for the deployment."""
    if template is None:
        _refuse(
            "request",
            f'"{OBSERVED_MIX}" sends the request at each size the traffic had: give the request, with {SIZE} or '
            f"{PAD} where its size goes.",
        )
    request = validate_request(template)
    if SIZE not in json.dumps(request) and PAD not in json.dumps(request):
        _refuse(
            "request",
            f"put {SIZE} (the size, a number) or {PAD} (a filler of that size) where the request's size goes; "
            "as it is, every size class would send the same request.",
        )
    source, side = (observed or {}).get("source"), (observed or {}).get("input")
    if source is None:
        _refuse(
            "mix",
            f'"{OBSERVED_MIX}" takes the sizes of the traffic, and nothing counts them for this deployment: name '
            "the histogram of request sizes its application exports (Request sizes, on the deployment page), "
            "or give the mix.",
        )
    hours = (observed or {}).get("hours", 24)
    if side is None:
        _refuse(
            "mix",
            f"no request of this deployment was counted by {source['metric']} in the last {hours:g} hours: nothing "
            "to take a mix from. Give the mix, or calibrate once traffic has been seen.",
        )
    buckets = [(float(b["le"]), float(b["requests"])) for b in side["buckets"]]
    found = classes(buckets, max(1, min(MAX_MIX, MAX_MIX_RUNS // max(levels, 1))))
    if not found:
        _refuse("mix", f"{source['metric']} counted requests only above its last bound: their sizes are unknown.")
    unit = source["unit"]
    mix = []
    for cls in found:
        if cls["size"] > MAX_PAD:
            _refuse("mix", f"a size class of {cls['size']:g} {unit} is past the {MAX_PAD} a calibration sends.")
        entry: dict = {"request": sized(request, cls["size"], unit), "share": cls["share"]}
        if unit == "tokens":
            entry["tokens"] = max(int(cls["size"]), 1)
        mix.append(entry)
    above = next((cls["share"] for cls in found if cls["above"]), 0.0)
    return validate_mix(mix, levels), {
        "source": source["metric"],
        "unit": unit,
        "hours": hours,
        "requests": side["quantiles"]["requests"],
        "above_last_bound": above,
    }


def sized(request: dict, size, unit: str) -> dict:
    """The template with its size marks filled in for `size`: in the query and body as text, in a
    JSON body or handle arguments a value that is exactly "{size}" as the number."""
    size = int(size) if float(size).is_integer() else size
    pad = f"{{words:{int(size)}}}" if unit == "tokens" else f"{{pad:{int(size)}}}"

    def text(value: str) -> str:
        return value.replace(SIZE, str(size)).replace(PAD, pad)

    def fill(value):
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        if value == SIZE:
            return size
        return text(value) if isinstance(value, str) else value

    out = dict(request)
    for key in ("query", "body"):
        if isinstance(out.get(key), str):
            out[key] = text(out[key])
    for key in ("json", "args"):
        if key in out:
            out[key] = fill(out[key])
    return out
