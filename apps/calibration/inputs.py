"""What a calibration is asked to measure, checked before anything is submitted: the levels
(concurrencies or token sums) and the representative request each call sends, or the default one
when the operator gives none, or a weighted mix of requests with their shares of traffic."""

from __future__ import annotations

import json
import math
from typing import NoReturn

from django.core.exceptions import ValidationError

from apps.calibration.curve import AXES, MAX_MIX
from apps.fleet import vouched_requests
from apps.fleet.models import Deployment

DEFAULT_LEVELS = (1, 2, 4)
MAX_LEVEL = 64
# Around the batch limits deployments commonly run (the reference app's is 1,024), so the limit the
# wizard computes falls inside the measured range, not far past it.
DEFAULT_TOKEN_SUMS = (256, 1024, 4096)
# Past any batch one replica runs; larger sums would only keep the job busy for minutes.
MAX_TOKEN_SUM = 65_536
DEFAULTS_BY_AXIS = {"concurrency": DEFAULT_LEVELS, "token_sum": DEFAULT_TOKEN_SUMS}
MAX_BY_AXIS = {"concurrency": MAX_LEVEL, "token_sum": MAX_TOKEN_SUM}
LEVEL_NAMES = {"concurrency": "concurrency levels", "token_sum": "token sums"}
MAX_LEVELS = 8
# The call argument and the representative request travel inside the job's command line.
MAX_CALL_BYTES = 16 * 1024
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
REQUEST_KEYS = {"http": {"kind", "method", "path", "query", "headers", "body", "json"}, "handle": {"kind", "args"}}


def validate_axis(axis) -> str:
    if axis not in AXES:
        raise ValidationError(f"The axis must be one of {', '.join(AXES)}, not {axis!r}.")
    return axis


def validate_levels(levels, axis: str = "concurrency") -> list[int]:
    names = LEVEL_NAMES[validate_axis(axis)]
    if not isinstance(levels, (list, tuple)) or not levels:
        raise ValidationError(f"Give at least one of the {names}.")
    if any(isinstance(k, bool) or not isinstance(k, int) for k in levels):
        raise ValidationError(f"The {names} must be whole numbers.")
    clean = sorted(set(levels))
    if clean[0] < 1 or clean[-1] > MAX_BY_AXIS[axis]:
        raise ValidationError(f"The {names} must be between 1 and {MAX_BY_AXIS[axis]:,}.")
    if len(clean) > MAX_LEVELS:
        raise ValidationError(f"At most {MAX_LEVELS} {names} per calibration.")
    return clean


def validate_call(call) -> None:
    try:
        size = len(json.dumps(call))
    except (TypeError, ValueError) as exc:
        raise ValidationError("The request argument must be JSON.") from exc
    if size > MAX_CALL_BYTES:
        raise ValidationError(
            f"The request argument is {size} bytes of JSON; at most {MAX_CALL_BYTES} fit in the job's command line."
        )


def numbered_for_check(text: str) -> str:
    """The body as one call would send it: {n} is replaced by a call number before it is parsed."""
    return text.replace("{n}", "0")


def validate_request(request) -> dict:
    """The representative request, checked and normalised: {"kind": "http", "method", "path",
    "query", "headers", "body" (text) or "json"} or {"kind": "handle", "args": [...]}."""
    if not isinstance(request, dict):
        raise ValidationError('The representative request must be an object with "kind" "http" or "handle".')
    kind = request.get("kind")
    if kind not in REQUEST_KEYS:
        raise ValidationError(f'The representative request\'s kind must be "http" or "handle", not {kind!r}.')
    unknown = sorted(set(request) - REQUEST_KEYS[kind])
    if unknown:
        raise ValidationError(
            f"A{'n' if kind == 'http' else ''} {kind} request has no {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(REQUEST_KEYS[kind] - {'kind'}))}."
        )
    if kind == "handle":
        args = request.get("args", [])
        if not isinstance(args, list):
            raise ValidationError("The handle call's args must be a list of JSON values.")
        clean = {"kind": "handle", "args": args}
    else:
        method = request.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
            raise ValidationError(f"The HTTP method must be one of {', '.join(HTTP_METHODS)}, not {method!r}.")
        path = request.get("path", "/")
        if not isinstance(path, str) or not path.startswith("/") or "?" in path or any(c.isspace() for c in path):
            raise ValidationError(
                f"The path must start with / and hold no spaces nor query string, not {path!r}; "
                "give the query string apart."
            )
        query = request.get("query", "")
        if not isinstance(query, str) or any(c.isspace() for c in query):
            raise ValidationError("The query string must be text without spaces, such as a=1&b=2 (no leading ?).")
        headers = request.get("headers", {}) or {}
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValidationError("The headers must be an object of header names to text values.")
        if any(
            not name.isascii() or not value.isascii() or "\n" in value or "\r" in value
            for name, value in headers.items()
        ):
            raise ValidationError("Header names and values must be single-line ASCII.")
        if "body" in request and "json" in request:
            raise ValidationError('Give the body as text ("body") or as JSON ("json"), not both.')
        body = request.get("body")
        if body is not None and not isinstance(body, str):
            raise ValidationError('The body must be text; give JSON under "json".')
        declared = next((v for k, v in headers.items() if k.strip().lower() == "content-type"), "")
        if body and "json" in declared.lower():
            try:
                json.loads(numbered_for_check(body))
            except json.JSONDecodeError as exc:
                # Caught here, not 10 s later as a traceback in a failed Ray job.
                raise ValidationError(
                    {
                        "body": f"The body is declared {declared} but is not JSON: {exc.msg} (line {exc.lineno}, "
                        f"column {exc.colno})."
                    }
                ) from exc
        clean = {
            "kind": "http",
            "method": method.upper(),
            "path": path,
            "query": query.removeprefix("?"),
            "headers": headers,
        }
        if body:
            clean["body"] = body
        if "json" in request:
            clean["json"] = request["json"]
    try:
        size = len(json.dumps(clean))
    except (TypeError, ValueError) as exc:
        raise ValidationError("The representative request must be JSON.") from exc
    if size > MAX_CALL_BYTES:
        raise ValidationError(
            f"The representative request is {size} bytes of JSON; at most {MAX_CALL_BYTES} fit in the job's "
            "command line."
        )
    return clean


REPRESENTATIVE_REQUEST_HELP = (
    'The representative request each call sends (concurrency axis only): {"kind": "http", "method": "GET", "path": '
    '"/route/sub", "query": "a=1", "headers": {...}, "body": "text"} (or "json": {...} instead of body) for a '
    'Starlette or FastAPI deployment, or {"kind": "handle", "args": [...]}. Absent or null: the application\'s first '
    "warmup request, else a GET of its route prefix for its ingress, else a handle call with no arguments. {n} "
    "anywhere in the query, body or args is replaced by each call's number, so an app that caches its answers computes "
    "every one."
)


# Shares are percentages typed by people: 33.3 three times is a fine 100.
SHARE_TOLERANCE = 0.5
# Each request of a mix runs every level: this bounds the job at the time of 24 single-request levels.
MAX_MIX_RUNS = 24
# The mix travels in the job's command line, as one request does.
MAX_MIX_BYTES = 2 * MAX_CALL_BYTES
MIX_KEYS = {"request", "share", "tokens"}
# What asks for the application's warmup profiles as the mix.
WARMUP_MIX = "warmup"
# What asks for the traffic's observed sizes as the mix (apps.calibration.observed_mix).
OBSERVED_MIX = "observed"

MIX_HELP = (
    f"A weighted mix instead of one representative request (concurrency axis only): up to {MAX_MIX} entries "
    '{"request": <a request as for request>, "share": percent of traffic, "tokens": what it brings to a batch '
    f"(optional; prices tokens for the input caps)}}, the shares adding up to 100 (±{SHARE_TOLERANCE:g}). Each request "
    f'is measured on its own at every level. Or "{WARMUP_MIX}": the application\'s warmup profiles, each weighted by '
    f'the requests it sends. Or "{OBSERVED_MIX}": the sizes the traffic had, from the deployment\'s request-size '
    "histogram, each size class the representative request with {size} (the size) or {pad} (a filler of that "
    "size) filled in, weighted by the requests the class had."
)


def _refuse(field: str, message: str) -> NoReturn:
    # Keyed by the field and naming it in the text: the API answers the key, a page shows the text.
    raise ValidationError({field: f"{field}: {message}"})


def validate_mix(mix, levels: int = 1) -> list[dict]:
    """A weighted mix, checked and normalised: [{"request": <validate_request's>, "share": float,
    "tokens": int (when given)}], the shares adding up to 100 within SHARE_TOLERANCE, the requests
    all HTTP or all handle calls. Errors are keyed and worded by the field: "mix", "mix[2].share"."""
    if not isinstance(mix, list) or not mix:
        _refuse("mix", f'give a list of 1 to {MAX_MIX} entries {{"request": {{...}}, "share": percent}}.')
    if len(mix) > MAX_MIX:
        _refuse("mix", f"{len(mix)} requests; at most {MAX_MIX} are measured.")
    if len(mix) * levels > MAX_MIX_RUNS:
        _refuse(
            "mix",
            f"{len(mix)} requests at {levels} levels each is {len(mix) * levels} levels to run; at most {MAX_MIX_RUNS} "
            "keep the job within its time. Give fewer levels or fewer requests.",
        )
    clean = []
    for index, entry in enumerate(mix):
        where = f"mix[{index}]"
        if not isinstance(entry, dict):
            _refuse(where, 'must be an object {"request": {...}, "share": percent}.')
        if unknown := sorted(set(entry) - MIX_KEYS):
            _refuse(where, f"has no {', '.join(unknown)}; an entry takes {', '.join(sorted(MIX_KEYS))}.")
        try:
            request = validate_request(entry.get("request"))
        except ValidationError as exc:
            _refuse(f"{where}.request", " ".join(exc.messages))
        share = entry.get("share")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share):
            _refuse(f"{where}.share", f"a percentage of traffic is a number, not {share!r}.")
        if not 0 < share <= 100:
            _refuse(f"{where}.share", f"a share is above 0 and at most 100 percent, not {share:g}.")
        item = {"request": request, "share": float(share)}
        if "tokens" in entry and entry["tokens"] is not None:
            tokens = entry["tokens"]
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                _refuse(
                    f"{where}.tokens", f"the tokens a request brings are a whole number of at least 1, not {tokens!r}."
                )
            item["tokens"] = tokens
        clean.append(item)
    total = sum(item["share"] for item in clean)
    if abs(total - 100) > SHARE_TOLERANCE:
        _refuse("mix", f"the shares add up to {total:g}, not 100 (±{SHARE_TOLERANCE:g}); nothing was calibrated.")
    if len({item["request"]["kind"] for item in clean}) > 1:
        _refuse(
            "mix", "the requests of a mix are all HTTP requests or all handle calls: the deployment has one interface."
        )
    size = len(json.dumps(clean))
    if size > MAX_MIX_BYTES:
        _refuse("mix", f"{size} bytes of JSON; at most {MAX_MIX_BYTES} fit in the job's command line.")
    return clean


def warmup_mix(deployment: Deployment, ingress: str | None) -> list[dict]:
    """The preset mix: the application's warmup profiles, each a request the operator vouched for,
    weighted by the requests it sends. Only for the ingress, which is what the profiles call."""
    application = deployment.application
    if not _is_ingress(deployment, ingress):
        _refuse(
            "mix",
            f'"{WARMUP_MIX}" takes the warmup profiles of {application.name}, which call its ingress, and '
            f"{deployment.name} is not it: give the mix.",
        )
    vouched = vouched_requests.all_of(application)
    if not vouched:
        _refuse(
            "mix", f'"{WARMUP_MIX}" takes the warmup profiles of {application.name}, and it has none: give the mix.'
        )
    total = sum(max(v.get("weight") or 1, 1) for v in vouched)
    return [
        {"request": _vouched_request(v), "share": round(100 * max(v.get("weight") or 1, 1) / total, 2)} for v in vouched
    ]


def _is_ingress(deployment: Deployment, ingress: str | None) -> bool:
    return ingress == deployment.name or (ingress is None and deployment.application.deployments.count() == 1)


def _vouched_request(vouched: dict) -> dict:
    path, _, query = vouched["path"].partition("?")
    # A profile's path already includes the route prefix (validate_profile insists on it).
    request = {
        "kind": "http",
        "method": vouched["method"].upper(),
        "path": path,
        "query": query,
        "headers": dict(vouched["headers"] or {}),
    }
    if vouched["body"] is not None:
        request["json"] = vouched["body"]
    return validate_request(request)


def default_calibration(deployment: Deployment, ingress: str | None, levels: int) -> tuple[dict, list[dict] | None]:
    """What a calibration measures when the operator gives nothing: (the representative request,
    the mix or None). With warmup profiles that send different requests (a short prompt and a long
    one), all of them, weighted by the requests each sends: sized from the first alone, the
    deployment would be unsafe for the heavier ones. One kind of request, or more than a job can
    measure at these levels, is default_request."""
    vouched = vouched_requests.all_of(deployment.application) if _is_ingress(deployment, ingress) else []
    kinds = {json.dumps(_vouched_request(v), sort_keys=True) for v in vouched}
    if len(kinds) >= 2 and len(vouched) <= MAX_MIX and len(vouched) * levels <= MAX_MIX_RUNS:
        return default_request(deployment, ingress), validate_mix(warmup_mix(deployment, ingress), levels)
    return default_request(deployment, ingress), None


def default_request(deployment: Deployment, ingress: str | None) -> dict:
    """What a calibration sends when the operator gives nothing: the first warmup request of the
    application if it has a profile (a request the operator already vouched for), else a GET of
    the route prefix for the application's ingress, else a handle call without arguments."""
    application = deployment.application
    is_ingress = _is_ingress(deployment, ingress)
    vouched = vouched_requests.first(application) if is_ingress else None
    if vouched is not None:
        return _vouched_request(vouched)
    if is_ingress and application.route_prefix:
        return {"kind": "http", "method": "GET", "path": application.route_prefix, "query": "", "headers": {}}
    return {"kind": "handle", "args": []}
