"""What a calibration is asked to measure, checked before anything is submitted: the levels
(concurrencies or token sums) and the representative request each call sends, or the default one
when the operator gives none."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError

from apps.calibration.curve import AXES
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


def default_request(deployment: Deployment, ingress: str | None) -> dict:
    """What a calibration sends when the operator gives nothing: the first warmup request of the
    application if it has a profile (a request the operator already vouched for), else a GET of
    the route prefix for the application's ingress, else a handle call without arguments."""
    application = deployment.application
    is_ingress = ingress == deployment.name or (ingress is None and application.deployments.count() == 1)
    vouched = vouched_requests.first(application) if is_ingress else None
    if vouched is not None:
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
    if is_ingress and application.route_prefix:
        return {"kind": "http", "method": "GET", "path": application.route_prefix, "query": "", "headers": {}}
    return {"kind": "handle", "args": []}
