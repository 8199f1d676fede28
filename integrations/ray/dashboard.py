"""The Ray dashboard client: the only code in Fleetdeck that speaks to a Ray cluster's dashboard
(metrics, Prometheus, Serve routes, webhooks and Kubernetes each have a client of their own).

It returns the dataclasses of `payloads` and raises the errors of `errors`.

It sends its own minimal headers: Ray treats browser-looking requests (Mozilla user agent,
Origin, Referer, Sec-Fetch-*) differently (PUT is refused, env_vars are redacted).
"""

from __future__ import annotations

import functools
import json
import ssl
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Any, TypedDict
from urllib.parse import quote

import httpx

from integrations.egress import PinnedTransport, Policy
from integrations.ray.errors import (
    RayAuthRefused,
    RayBadResponse,
    RayControllerUnavailable,
    RayDeploymentNotFound,
    RayError,
    RayExternalScalerDisabled,
    RayJobNotFound,
    RayScaleUnsupported,
    RayTimeout,
    RayUnreachable,
    RayValidationError,
)
from integrations.ray.parsing import parse_actor, parse_job, parse_node, parse_serve_status, to_float, to_int
from integrations.ray.payloads import JobInfo, NodeMemory, ServeStatus, StatePage, VersionInfo

USER_AGENT = "fleetdeck-ray-adapter/1"
# Ray's state API refuses a larger limit unless the server was configured otherwise.
STATE_API_MAX_LIMIT = 10_000
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# A job's whole log comes back in one JSON string; only its end matters to Fleetdeck (results and
# errors are printed last), so at most this many characters of the tail are kept.
MAX_JOB_LOG_CHARS = 256 * 1024
VERSION_PATH = "/api/version"
SERVE_PATH = "/api/serve/applications/"
ACTORS_PATH = "/api/v0/actors"
CLUSTER_STATUS_PATH = "/api/cluster_status"
SCALE_PATH = "/api/v1/applications/{application}/deployments/{deployment}/scale"
# The first Ray whose dashboard serves the scale API (and `external_scaler_enabled` on an application).
SCALE_API_SINCE = (2, 60)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verification, built once: httpx loads the whole CA bundle for every client
    (~20 ms of CPU), and every sync builds two clients per cluster."""
    return httpx.create_ssl_context()


class RayDashboard:
    def __init__(
        self,
        base_url: str,
        *,
        token: str = "",
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        policy: Policy | None = None,
    ):
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
            transport=transport or PinnedTransport(verify=tls_context(), policy=policy),
        )
        # Timeouts apply per read; this bounds a whole answer, which a server could trickle forever.
        self._deadline_s = max(3 * timeout_s, 10.0)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RayDashboard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- low level -------------------------------------------------------------------------

    def _send(self, method: str, path: str, *, label: str = "", **kwargs) -> httpx.Response:
        body = Body(path, label, self._deadline_s)
        try:
            with self._client.stream(method, path, **kwargs) as response:
                for chunk in response.iter_bytes():
                    body.add(chunk)
        except httpx.TimeoutException as exc:
            raise timed_out(path, label, exc) from exc
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        return body.response(response)

    def _get(self, path: str, params: QueryParams | None = None) -> Any:
        return decode(path, self._send("GET", path, params=params))

    # --- endpoints -------------------------------------------------------------------------

    def version(self) -> VersionInfo:
        return version_info(self._get(VERSION_PATH))

    def authentication_mode(self) -> str:
        """'disabled', 'token', …; Ray versions that predate token auth have no such endpoint."""
        try:
            body = self._get("/api/authentication_mode")
        except RayBadResponse as exc:
            if exc.status == 404:
                return "unsupported"
            raise
        return str(_expect_dict(body, "/api/authentication_mode").get("authentication_mode") or "unknown")

    def serve_applications(self) -> ServeStatus:
        return serve_status(self._get(SERVE_PATH))

    def put_serve_applications(self, config: dict[str, Any]) -> None:
        """Replace the cluster's whole Serve config. 200 means accepted, not healthy: poll after.
        Ray answers a config it refuses with 400 and a plain-text pydantic message."""
        path = "/api/serve/applications/"
        # On a timeout the PUT may or may not have been applied: the caller must re-read before deciding.
        response = self._send("PUT", path, label="the PUT", json=config, headers={"Content-Type": "application/json"})
        if response.status_code == 400:
            raise RayValidationError(response.text.strip() or "Ray refused the config (HTTP 400).", status=400)
        if response.status_code >= 300:
            decode(path, response)  # raises the mapped error
            raise RayBadResponse(f"{path} answered HTTP {response.status_code}.", status=response.status_code)

    def list_actors(self, *, filters: Sequence[StateFilter] = (), detail: bool = True, limit: int = 1000) -> StatePage:
        return actors_page(self._get(ACTORS_PATH, state_params(filters, detail, limit)))

    def list_nodes(self, *, limit: int = 1000) -> StatePage:
        page = self._state("/api/v0/nodes", filters=(), detail=False, limit=limit)
        return StatePage(page.total, page.truncated, [parse_node(item) for item in page.items])

    def node_memory(self) -> list[NodeMemory]:
        """Memory per node from the dashboard's node summary (`mem` is [total, available, percent, used])."""
        body = _expect_dict(self._get("/nodes", (("view", "summary"),)), "/nodes")
        summary = ((body.get("data") or {}).get("summary")) or []
        nodes = []
        for node in summary:
            mem = node.get("mem") or []
            if len(mem) >= 2:
                nodes.append(NodeMemory(str(node.get("ip") or ""), to_int(mem[0], 0), to_int(mem[1], 0)))
        return nodes

    def resource_usage(self) -> dict[str, dict[str, tuple[float, float]]]:
        """Logical resources per node from `/api/cluster_status`: see `resource_usage`."""
        return resource_usage(self._get(CLUSTER_STATUS_PATH))

    def serve_ingresses(self) -> dict[str, str]:
        """{application: its ingress deployment}, from the Serve status's deployment topology."""
        body = _expect_dict(self._get("/api/serve/applications/"), "/api/serve/applications/")
        ingresses = {}
        for name, app in (body.get("applications") or {}).items():
            topology = (app or {}).get("deployment_topology") or {}
            if isinstance(topology, dict) and topology.get("ingress_deployment"):
                ingresses[str(name)] = str(topology["ingress_deployment"])
        return ingresses

    def scale_deployment(
        self, application: str, deployment: str, target_num_replicas: int, *, ray_version: str = ""
    ) -> None:
        """Ask Serve to run `target_num_replicas` replicas of a deployment whose application was
        deployed with `external_scaler_enabled: true`. 200 means accepted, not scaled: Serve
        scales asynchronously, so poll the Serve status. The next config push that changes the
        deployment resets the count to the config's `num_replicas`.

        `ray_version` (the cluster's, as last synced) refuses a Ray older than 2.60 without a
        request: its dashboard has no such route and would answer a bare 404."""
        if ray_version and _major_minor(ray_version) < SCALE_API_SINCE:
            raise RayScaleUnsupported(
                f"Ray {ray_version} cannot set a replica count from outside: this needs Ray 2.60's scale API."
            )
        if isinstance(target_num_replicas, bool) or not isinstance(target_num_replicas, int) or target_num_replicas < 0:
            raise RayValidationError(f"{target_num_replicas!r} is not a replica count (a whole number, 0 or more).")
        path = SCALE_PATH.format(application=_path_segment(application), deployment=_path_segment(deployment))
        label = f"the scale request for {application}/{deployment}"
        response = self._send(
            "POST",
            path,
            label=label,
            json={"target_num_replicas": target_num_replicas},
            headers={"Content-Type": "application/json"},
        )
        scale_answer(path, application, deployment, response)

    # --- jobs API ----------------------------------------------------------------------------

    def submit_job(
        self,
        entrypoint: str,
        *,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        submission_id: str | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
    ) -> str:
        """Start `entrypoint` as a job on the cluster and return its submission id. A timeout
        leaves it unknown whether Ray took the job: choose `submission_id` and look it up."""
        body: dict[str, Any] = {"entrypoint": entrypoint}
        optional = {
            "runtime_env": runtime_env,
            "metadata": metadata,
            "submission_id": submission_id,
            "entrypoint_num_cpus": entrypoint_num_cpus,
            "entrypoint_num_gpus": entrypoint_num_gpus,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        answer = _expect_dict(self._post("/api/jobs/", body), "/api/jobs/")
        accepted = answer.get("submission_id") or answer.get("job_id")
        if not isinstance(accepted, str) or not accepted:
            raise RayBadResponse("/api/jobs/ accepted the job but answered no submission_id.")
        return accepted

    def job(self, submission_id: str) -> JobInfo:
        path = f"/api/jobs/{_job_segment(submission_id)}"
        with _job_lookup(submission_id):
            return parse_job(_expect_dict(self._get(path), path))

    def job_logs(self, submission_id: str) -> str:
        """The job's stdout and stderr so far; only the last MAX_JOB_LOG_CHARS characters."""
        path = f"/api/jobs/{_job_segment(submission_id)}/logs"
        with _job_lookup(submission_id):
            body = _expect_dict(self._get(path), path)
        logs = body.get("logs")
        if not isinstance(logs, str):
            raise RayBadResponse(f"{path} has no 'logs' string.")
        return logs[-MAX_JOB_LOG_CHARS:]

    def stop_job(self, submission_id: str) -> bool:
        """Ask Ray to stop the job; False when it had already ended."""
        path = f"/api/jobs/{_job_segment(submission_id)}/stop"
        with _job_lookup(submission_id):
            body = _expect_dict(self._post(path, None), path)
        return bool(body.get("stopped"))

    def _post(self, path: str, body: dict[str, Any] | None) -> Any:
        response = self._send("POST", path, json=body, headers={"Content-Type": "application/json"})
        if response.status_code == 400:
            # The jobs API answers a refused request with a Python traceback; its last line says why.
            lines = [line.strip() for line in response.text.splitlines() if line.strip()]
            raise RayValidationError(_excerpt(lines[-1]) if lines else f"Ray refused {path} (HTTP 400).", status=400)
        return decode(path, response)

    def _state(self, path: str, *, filters, detail: bool, limit: int) -> StatePage:
        return state_page(path, self._get(path, state_params(filters, detail, limit)))


def scale_answer(path: str, application: str, deployment: str, response: httpx.Response) -> None:
    """Map the scale API's answer (ray/dashboard/modules/serve/serve_head.py, `scale_deployment`)
    to the error a caller acts on. Ray answers its own refusals as JSON `{"error": ...}`; a 404
    without that body is a dashboard that has no such route: a Ray before 2.60."""
    status = response.status_code
    if 200 <= status < 300:
        return
    reason = _json_error(response)
    where = f"{application}/{deployment}"
    if status == 412:
        raise RayExternalScalerDisabled(
            f"Ray will not scale {where} from outside (HTTP 412): the application must be deployed with "
            "external_scaler_enabled: true (and the deployment not be being deleted)",
            excerpt=reason or "",
            status=status,
        )
    if status == 404 and reason is not None:
        raise RayDeploymentNotFound(f"Ray has no deployment {where} (HTTP 404)", excerpt=reason, status=status)
    if status in (404, 405):
        raise RayScaleUnsupported(
            f"The dashboard has no scale API (HTTP {status} on {path}): this needs Ray 2.60's scale API.",
            status=status,
        )
    if status == 503:
        raise RayControllerUnavailable(
            f"The Serve controller could not scale {where} (HTTP 503)", excerpt=reason or "", status=status
        )
    if status == 400:
        raise RayValidationError(reason or f"Ray refused the scale request for {where} (HTTP 400).", status=status)
    checked(path, response)  # auth, redirects, 5xx: the mapping every endpoint shares
    raise RayBadResponse(f"{path} answered HTTP {status}", excerpt=_excerpt(response.text), status=status)


def _json_error(response: httpx.Response) -> str | None:
    """Ray's `{"error": ...}` message, or None when the body is not that shape."""
    try:
        body = json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return _excerpt(str(error)) if error is not None else None


def _major_minor(version: str) -> tuple[int, int]:
    try:
        major, minor, *_ = version.split(".")
        return int(major), int(minor)
    except ValueError:
        return (99, 0)  # an unparsable version is taken as current: the request itself will tell


def _path_segment(name: str) -> str:
    # Application and deployment names are free text: one must not become two path segments.
    if not name:
        raise RayError("An application and a deployment name are needed to scale.")
    return quote(name, safe="")


# A state API filter: (key, predicate, value), e.g. ("state", "=", "DEAD").
StateFilter = tuple[str, str, str]
# A tuple, not a list: httpx takes a tuple of str pairs where it would refuse a list of them (lists are invariant).
QueryParams = tuple[tuple[str, str], ...]


class StateQuery(TypedDict):
    """The keyword arguments of a state API read, for a query kept as a constant."""

    filters: Sequence[StateFilter]
    detail: bool
    limit: int


def state_params(filters: Iterable[StateFilter], detail: bool, limit: int) -> QueryParams:
    params: list[tuple[str, str]] = [("limit", str(min(max(limit, 1), STATE_API_MAX_LIMIT)))]
    if detail:
        params.append(("detail", "1"))
    for key, predicate, value in filters:
        params += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
    return tuple(params)


def state_page(path: str, body: Any) -> StatePage:
    """A state API answer's items, still raw."""
    body = _expect_dict(body, path)
    if body.get("result") is False:
        raise RayBadResponse(f"{path} failed: {body.get('msg') or 'no message'}")
    data = ((body.get("data") or {}).get("result")) or {}
    items = data.get("result")
    if not isinstance(items, list):
        raise RayBadResponse(f"{path} has no result list.")
    # `total` counts every entity before filters; the limit cuts before filtering too, so the
    # page is short only when fewer than `total` survived truncation.
    total = to_int(data.get("total"), len(items))
    after_truncation = to_int(data.get("num_after_truncation"), total)
    matching = to_int(data.get("num_filtered"), len(items))
    return StatePage(total=matching, truncated=after_truncation < total, items=items)


def actors_page(body: Any) -> StatePage:
    page = state_page(ACTORS_PATH, body)
    return StatePage(page.total, page.truncated, [parse_actor(item) for item in page.items])


def resource_usage(body: Any) -> dict[str, dict[str, tuple[float, float]]]:
    """Logical resources per node in a `/api/cluster_status` answer: {node IP: {resource: (used,
    total)}}. The node IP comes from the node's own `node:<ip>` resource; a report without
    per-node figures gives the cluster's totals under the key ""."""
    body = _expect_dict(body, CLUSTER_STATUS_PATH)
    report = ((((body.get("data") or {}).get("clusterStatus")) or {}).get("loadMetricsReport")) or {}

    def pairs(usage) -> dict[str, tuple[float, float]]:
        clean = {}
        for resource, figures in (usage or {}).items() if isinstance(usage, dict) else ():
            if isinstance(figures, list) and len(figures) == 2:
                used, total = to_float(figures[0]), to_float(figures[1])
                if used is not None and total is not None:
                    clean[str(resource)] = (used, total)
        return clean

    by_node = {}
    for usage in (report.get("usageByNode") or {}).values():
        figures = pairs(usage)
        ip = next(
            (
                name.removeprefix("node:")
                for name in figures
                if name.startswith("node:") and not name.startswith("node:__") and name != "node:InternalHead"
            ),
            "",
        )
        by_node[ip] = figures
    return by_node or {"": pairs(report.get("usage"))}


def version_info(body: Any) -> VersionInfo:
    body = _expect_dict(body, VERSION_PATH)
    ray_version = body.get("ray_version")
    if not isinstance(ray_version, str) or not ray_version:
        raise RayBadResponse("/api/version has no ray_version: this does not look like a Ray dashboard.")
    return VersionInfo(
        ray_version=ray_version,
        ray_commit=str(body.get("ray_commit") or ""),
        session_name=str(body.get("session_name") or ""),
    )


def serve_status(body: Any) -> ServeStatus:
    body = _expect_dict(body, SERVE_PATH)
    if not isinstance(body.get("applications"), dict):
        raise RayBadResponse("/api/serve/applications/ has no 'applications' object.")
    return parse_serve_status(body)


class Body:
    """An answer's body, read under a byte cap and a total deadline: reading first and measuring
    after would hold an enormous answer in memory, and a server could trickle one forever."""

    def __init__(self, path: str, label: str, deadline_s: float):
        self.path, self.label, self.deadline_s = path, label, deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > MAX_RESPONSE_BYTES:
            raise RayBadResponse(
                f"{self.path} answered more than {MAX_RESPONSE_BYTES // 2**20} MiB, more than Fleetdeck accepts."
            )
        if time.monotonic() > self.deadline:
            raise RayTimeout(
                f"Ray dashboard sent its answer to {self.label or self.path} too slowly (over {self.deadline_s:.0f} s)."
            )

    def response(self, streamed: httpx.Response) -> httpx.Response:
        # The body is already decoded: the copy must not claim an encoding or a length.
        headers = [
            (k, v) for k, v in streamed.headers.multi_items() if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx.Response(streamed.status_code, headers=headers, content=bytes(self.data), request=streamed.request)


def timed_out(path: str, label: str, exc: httpx.TimeoutException) -> RayTimeout:
    return RayTimeout(f"Ray dashboard did not answer {label or path} in time ({exc.__class__.__name__}).")


def unreachable(exc: httpx.TransportError) -> RayUnreachable:
    return RayUnreachable(f"Cannot reach the Ray dashboard: {str(exc) or exc.__class__.__name__}.")


def checked(path: str, response: httpx.Response) -> httpx.Response:
    """The answer, when its status is one Fleetdeck reads; else the mapped error."""
    status = response.status_code
    if status in (401, 403):
        raise RayAuthRefused(
            f"The Ray dashboard refused {path} with HTTP {status}: the cluster has token "
            "authentication enabled and the token is missing or wrong.",
            status=status,
        )
    if 300 <= status < 400:
        raise RayBadResponse(
            f"{path} answered a redirect (HTTP {status} to {response.headers.get('location', '?')}); "
            "give the dashboard's own URL, Fleetdeck does not follow redirects.",
            status=status,
        )
    if status == 404:
        raise RayBadResponse(f"{path} is not found (HTTP 404): is this a Ray dashboard URL?", status=status)
    if status >= 500:
        raise RayBadResponse(
            f"The Ray dashboard failed on {path} with HTTP {status}",
            excerpt=_excerpt(response.text),
            status=status,
            transient=True,
        )
    if status >= 400:
        raise RayBadResponse(f"{path} answered HTTP {status}", excerpt=_excerpt(response.text), status=status)
    if len(response.content) > MAX_RESPONSE_BYTES:
        raise RayBadResponse(f"{path} answered {len(response.content)} bytes, more than Fleetdeck accepts.")
    return response


def decode(path: str, response: httpx.Response) -> Any:
    checked(path, response)
    return json_body(path, response.content, response.headers.get("content-type", "none"), response.status_code)


def json_body(path: str, content: bytes, content_type: str, status: int = 200) -> Any:
    try:
        return json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RayBadResponse(
            f"{path} did not answer JSON (content-type {content_type})",
            excerpt=_excerpt(content.decode("utf-8", errors="replace")),
            status=status,
        ) from exc


@contextmanager
def _job_lookup(submission_id: str):
    """A 404 from a job's own path means the job is unknown, not that the URL is wrong."""
    try:
        yield
    except RayBadResponse as exc:
        if exc.status == 404 and not isinstance(exc, RayJobNotFound):
            raise RayJobNotFound(submission_id) from exc
        raise


def _job_segment(submission_id: str) -> str:
    # Ids are ours or Ray's (letters, digits, - and _); anything else would change the path.
    if not submission_id or not all(c.isalnum() or c in "-_" for c in submission_id):
        raise RayError(f"{submission_id!r} is not a job submission id.")
    return submission_id


def _expect_dict(body: Any, path: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RayBadResponse(f"{path} answered JSON that is not an object", excerpt=_excerpt(json.dumps(body)))
    return body


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[:limit] + "…"
