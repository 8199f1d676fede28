"""Memory calibration: submit the measuring job, follow it to a result, and hand the curve to
whoever sizes the deployment (`latest_curve`). The htmx views, the API and the worker call these."""

from __future__ import annotations

import base64
import json
import secrets
import shlex
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.calibration.curve import AXES, MIB, CalibrationOutputError, Curve, parse_output, reported_error
from apps.calibration.models import MemoryCalibration
from apps.clusters.services import dashboard_for
from apps.core import jobs
from apps.core.jobs import Job
from apps.fleet import vouched_requests
from apps.fleet.models import Deployment
from integrations.ray.errors import RayError, RayJobNotFound, RayTimeout, RayUnreachable
from integrations.ray.payloads import JobInfo, NodeMemory

__all__ = ["Curve", "latest_curve", "parse_output", "poll", "request_calibration"]

CALIBRATE = Permission(Role.OPERATOR, "calibrate deployments")
JOB_SCRIPT = Path(__file__).with_name("job_script.py")
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
# Ray's memory monitor kills at this share of a node's memory unless the cluster sets otherwise.
RAY_KILL_THRESHOLD = 0.95
# The share of the room below Ray's threshold a calibration may fill: the rest stays for the
# node's other work, which keeps moving while the job runs.
BUDGET_SHARE = 0.8
LOG_TAIL_CHARS = 8000
# A job Ray does not know after this long was never submitted (the submit timed out unanswered).
UNKNOWN_JOB_GRACE_S = 60
State = MemoryCalibration.State


def _python() -> str:
    """The interpreter the job runs: the cluster's own Python, which has Ray and the app's code."""
    return settings.FLEETDECK_CALIBRATION_PYTHON


def timeout_s() -> float:
    return float(settings.FLEETDECK_CALIBRATION_TIMEOUT_S)


def poll_interval_s() -> float:
    return settings.FLEETDECK_CALIBRATION_POLL_S


def stale_after_s() -> float:
    """A calibration not polled for this long lost its poll chain; the tick polls it."""
    return max(poll_interval_s() * 10, 30.0)


# --- validation ----------------------------------------------------------------------------


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


def stop_at_bytes(nodes: list[NodeMemory], cluster_name: str) -> int:
    """Node memory used that the job must not cross: on the tightest node it may run on, what is
    used now plus BUDGET_SHARE of the room below Ray's kill threshold."""
    if not nodes:
        raise ValidationError(
            f"Cluster {cluster_name} reports no node memory, so a calibration could not be kept below "
            "Ray's memory threshold: nothing was calibrated."
        )
    stops = []
    for node in nodes:
        used = node.total_bytes - node.available_bytes
        room = RAY_KILL_THRESHOLD * node.total_bytes - used
        if room <= 0:
            raise ValidationError(
                f"Node {node.node_ip or '?'} of {cluster_name} already uses {used / MIB:.0f} MiB of "
                f"{node.total_bytes / MIB:.0f} MiB, at or past Ray's memory threshold ({RAY_KILL_THRESHOLD:.0%}): a "
                "calibration there could only cause an OOM kill. Free memory first."
            )
        stops.append(int(used + BUDGET_SHARE * room))
    return min(stops)


def _fits(usage: dict[str, tuple[float, float]], needs: dict[str, float]) -> bool:
    return all(
        total - used >= amount
        for resource, amount in needs.items()
        if amount
        for used, total in [usage.get(resource, (0.0, 0.0))]
    )


def fitting_nodes(
    usage_by_node: dict[str, dict[str, tuple[float, float]]], needs: dict[str, float], cluster_name: str
) -> set[str]:
    """IPs of the nodes with `needs` free ("" for a cluster-wide report); none: a clear refusal,
    since the job would wait unscheduled until it timed out."""
    fitting = {ip for ip, usage in usage_by_node.items() if _fits(usage, needs)}
    if fitting:
        return fitting
    wanted = " and ".join(f"{amount:g} {resource}" for resource, amount in needs.items() if amount)
    in_use = "; ".join(
        ", ".join(
            f"{usage.get(resource, (0.0, 0.0))[0]:g} of {usage.get(resource, (0.0, 0.0))[1]:g} {resource} in use"
            for resource, amount in needs.items()
            if amount
        )
        + (f" on {ip}" if ip else "")
        for ip, usage in usage_by_node.items()
    )
    raise ValidationError(
        f"No node of {cluster_name} has {wanted} free for a calibration replica ({in_use}): free some, "
        "or calibrate when the cluster is quieter."
    )


def import_target(deployment: Deployment) -> str:
    """`module:DeploymentName` from the application's import path (`module:app` or `module.app`)."""
    application = deployment.application
    path = (application.import_path or "").strip()
    module = path.split(":", 1)[0] if ":" in path else path.rpartition(".")[0]
    if not module:
        raise ValidationError(
            f"The import path of application {application.name} is unknown"
            f"{f' ({path!r})' if path else ''}: sync the cluster, then calibrate."
        )
    return f"{module}:{deployment.name}"


def job_runtime_env(deployment: Deployment) -> dict | None:
    """The runtime_env the deployment's replicas get, so the job can import the same code:
    the application's, overlaid with the deployment's own (env_vars merged), as Serve does."""
    app_env = (deployment.application.deployed_app_config or {}).get("runtime_env") or {}
    actor_options = (
        deployment.effective_config.get("ray_actor_options")
        or deployment.submitted_config.get("ray_actor_options")
        or {}
    )
    own_env = actor_options.get("runtime_env") or {}
    merged = {**app_env, **own_env}
    env_vars = {**(app_env.get("env_vars") or {}), **(own_env.get("env_vars") or {})}
    if env_vars:
        merged["env_vars"] = env_vars
    return merged or None


def build_entrypoint(
    import_path: str,
    *,
    user_config,
    call=None,
    levels: list[int],
    axis: str = "concurrency",
    python: str | None = None,
    request: dict | None = None,
    stop_at_bytes: int | None = None,
    route_prefix: str | None = None,
    app_name: str = "",
    deployment_name: str = "",
) -> str:
    """The job's shell command: the measuring script shipped inline, so nothing is installed on the
    cluster beforehand. Every argument is shell-quoted."""
    code = base64.b64encode(JOB_SCRIPT.read_bytes()).decode("ascii")
    loader = f"import base64,sys;exec(compile(base64.b64decode('{code}'),'fleetdeck_calibrate','exec'))"
    args = [
        python or _python(),
        "-c",
        loader,
        "--import-path",
        import_path,
        "--user-config",
        json.dumps(user_config),
        "--axis",
        axis,
        "--levels",
        ",".join(str(k) for k in levels),
    ]
    if call is not None:
        args += ["--call", json.dumps(call)]
    if request is not None:
        args += ["--request", json.dumps(request)]
    if stop_at_bytes is not None:
        args += ["--stop-at-bytes", str(stop_at_bytes)]
    if route_prefix:
        args += ["--route-prefix", route_prefix]
    if app_name:
        args += ["--app-name", app_name]
    if deployment_name:
        args += ["--deployment-name", deployment_name]
    return shlex.join(args)


# --- requesting ----------------------------------------------------------------------------


def _resources(deployment: Deployment) -> dict[str, float]:
    """What one replica of the deployment reserves; Serve's default is one CPU."""
    actor_options = (
        deployment.effective_config.get("ray_actor_options")
        or deployment.submitted_config.get("ray_actor_options")
        or {}
    )
    cpus = actor_options.get("num_cpus")
    return {"CPU": float(1 if cpus is None else cpus), "GPU": float(actor_options.get("num_gpus") or 0)}


def request_calibration(
    actor: Actor, deployment: Deployment, *, levels=None, call=None, axis: str = "concurrency", request=None
) -> MemoryCalibration:
    """Submit a calibration job for `deployment`. The caller checks the operator role.

    `axis` "concurrency" runs `levels` concurrent calls of the representative `request` (see
    validate_request: an HTTP request for a Starlette or ASGI handler, or a handle call);
    `call=` is shorthand for a handle call with that one argument. Neither given: the default of
    default_request. "token_sum" runs one batch of each token sum in `levels` through the class's
    `calibration_batch(token_sum)` hook (see job_script.py). `levels` defaults to the axis's
    defaults. The user_config is the one the deployment runs now (its effective config).

    The job reserves the replica's own CPUs and GPUs, so it runs where a replica could, and is
    refused before submitting when no node has them free. It stops before node memory crosses
    `stop_at_bytes` (see stop_at_bytes) and Ray's own threshold, so it cannot cause an OOM kill."""
    application = deployment.application
    cluster = application.cluster
    axis = validate_axis(axis)
    levels = validate_levels(list(DEFAULTS_BY_AXIS[axis] if levels is None else levels), axis)
    if axis == "token_sum" and (call is not None or request is not None):
        raise ValidationError(
            "A token_sum calibration calls calibration_batch(token_sum), not the deployment's interface: "
            "leave the request empty."
        )
    if call is not None and request is not None:
        raise ValidationError(
            "Give the representative request or the call argument, not both: a call argument is a handle "
            "call with that one argument."
        )
    validate_call(call)
    if call is not None:
        request = {"kind": "handle", "args": [call]}
    elif request is not None:
        request = validate_request(request)
    if deployment.removed_at is not None:
        raise ValidationError(f"{application.name}/{deployment.name} is no longer on the cluster.")
    import_path = import_target(deployment)
    user_config = deployment.effective_config.get("user_config", deployment.submitted_config.get("user_config"))
    runtime_env = job_runtime_env(deployment)
    needs = _resources(deployment)
    try:
        with dashboard_for(cluster) as ray:
            fitting = fitting_nodes(ray.resource_usage(), needs, cluster.name)
            memory = ray.node_memory()
            if request is None and axis == "concurrency":
                request = default_request(deployment, ray.serve_ingresses().get(application.name))
    except RayUnreachable as exc:
        raise ValidationError(
            f"Cluster {cluster.name} is unreachable, so nothing was calibrated: {exc.message}"
        ) from exc
    except RayError as exc:
        raise ValidationError(
            f"Cluster {cluster.name} cannot be asked about its free resources and memory, so nothing was "
            f"calibrated: {exc.message}"
        ) from exc
    stop_at = stop_at_bytes(
        [node for node in memory if "" in fitting or node.node_ip in fitting] or memory, cluster.name
    )
    # Without the replica's GPUs reserved the job would land on a node with none and measure host memory.
    cpus, gpus = needs["CPU"], needs["GPU"] or None
    stored = {
        "import_path": import_path,
        "axis": axis,
        "user_config": user_config,
        "representative": request,
        "call": call,
        "runtime_env": runtime_env,
        "entrypoint_num_cpus": cpus,
        "entrypoint_num_gpus": gpus,
        "stop_at_bytes": stop_at,
    }
    try:
        with transaction.atomic():
            calibration = MemoryCalibration.objects.create(
                deployment=deployment,
                cluster=cluster,
                application_name=application.name,
                deployment_name=deployment.name,
                submission_id=f"fleetdeck-calibration-{secrets.token_hex(6)}",
                axis=axis,
                levels=levels,
                request=stored,
                created_by=actor.user,
            )
    except IntegrityError as exc:
        raise ValidationError(
            f"A calibration of {application.name}/{deployment.name} is already running; wait for it to finish."
        ) from exc
    entrypoint = build_entrypoint(
        import_path,
        user_config=user_config,
        levels=levels,
        axis=axis,
        request=request,
        stop_at_bytes=stop_at,
        route_prefix=application.route_prefix,
        app_name=application.name,
        deployment_name=deployment.name,
    )
    try:
        with dashboard_for(cluster) as ray:
            ray.submit_job(
                entrypoint,
                runtime_env=runtime_env,
                metadata={"fleetdeck": "calibration", "deployment": f"{application.name}/{deployment.name}"},
                submission_id=calibration.submission_id,
                entrypoint_num_cpus=cpus,
                entrypoint_num_gpus=gpus,
            )
    except RayTimeout:
        # Ray may have taken the job: keep the row. Polling finds the job by its id, or reports
        # that it never arrived once UNKNOWN_JOB_GRACE_S has passed.
        pass
    except RayError as exc:
        calibration.delete()
        if isinstance(exc, RayUnreachable):
            raise ValidationError(
                f"Cluster {cluster.name} is unreachable, so nothing was calibrated: {exc.message}"
            ) from exc
        raise ValidationError(f"Ray refused the calibration job: {exc.message}") from exc
    record(
        actor,
        "calibration.request",
        calibration,
        team=cluster.team,
        changes={
            "deployment": f"{application.name}/{deployment.name}",
            "axis": axis,
            "levels": levels,
            "call": call,
            "request": request,
            "submission_id": calibration.submission_id,
        },
    )
    transaction.on_commit(lambda: _enqueue(calibration.pk))
    return calibration


def _enqueue(calibration_id: int) -> None:
    # A lost poll leaves the calibration stale: the tick polls it again (stale_ids).
    jobs.enqueue(jobs.POLL_CALIBRATION, calibration_id, countdown=poll_interval_s())


# --- following the job ---------------------------------------------------------------------


def poll(calibration_id: int) -> MemoryCalibration | None:
    """Read the job once and move the calibration on. Idempotent: a final row is left alone, and
    only one caller can make the final transition. Past the deadline the job is stopped and the
    calibration fails with the reason, so nothing stays pending forever."""
    calibration = MemoryCalibration.objects.select_related("cluster").filter(pk=calibration_id).first()
    if calibration is None or calibration.is_final:
        return calibration
    now = timezone.now()
    MemoryCalibration.objects.filter(pk=calibration.pk).update(polled_at=now)
    age_s = (now - calibration.created_at).total_seconds()
    overdue = age_s > timeout_s()
    logs = ""
    try:
        with dashboard_for(calibration.cluster) as ray:
            info = ray.job(calibration.submission_id)
            if info.is_final:
                logs = ray.job_logs(calibration.submission_id)
            elif overdue:
                ray.stop_job(calibration.submission_id)
    except RayJobNotFound:
        if age_s > UNKNOWN_JOB_GRACE_S or overdue:
            return _finish(
                calibration,
                State.FAILED,
                error=f"Ray has no job {calibration.submission_id}: the submission never "
                "reached the cluster, or the cluster restarted since.",
            )
        return _reload(calibration)
    except RayError as exc:
        if overdue:
            return _finish(
                calibration,
                State.FAILED,
                error=f"No result after {timeout_s():.0f} s, and the cluster cannot be asked: {exc.message}",
            )
        return _reload(calibration)
    if not info.is_final:
        if overdue:
            return _finish(
                calibration,
                State.FAILED,
                error=f"No result after {timeout_s():.0f} s (Ray: {info.status}, "
                f"{info.message or 'no message'}); the job was stopped.",
            )
        if info.status == "RUNNING":
            MemoryCalibration.objects.filter(pk=calibration.pk, state=State.PENDING).update(
                state=State.RUNNING, started_at=_ray_time(info.start_time) or now
            )
        return _reload(calibration)
    return _finish_from_job(calibration, info, logs)


def _finish_from_job(calibration: MemoryCalibration, info: JobInfo, logs: str) -> MemoryCalibration:
    tail = logs[-LOG_TAIL_CHARS:]
    times = {
        "started_at": _ray_time(info.start_time) or calibration.started_at,
        "finished_at": _ray_time(info.end_time),
    }
    if info.status == "SUCCEEDED":
        try:
            result = parse_output(logs)
        except CalibrationOutputError as exc:
            return _finish(
                calibration,
                State.FAILED,
                error=f"The job ended but left no usable result: {exc}",
                log_tail=tail,
                **times,
            )
        if calibration.axis and result["axis"] != calibration.axis:
            return _finish(
                calibration,
                State.FAILED,
                log_tail=tail,
                **times,
                error=f"The job measured the {result['axis']} axis, but {calibration.axis} was requested.",
            )
        result["limit_reason"] = result["limit_reason"] or ""
        return _finish(calibration, State.SUCCEEDED, log_tail=tail, **times, **result)
    if info.status == "STOPPED":
        return _finish(calibration, State.STOPPED, error=info.message or "The job was stopped.", log_tail=tail, **times)
    reason = reported_error(logs)
    ray_says = info.message or f"the job {info.status.lower()}"
    return _finish(
        calibration, State.FAILED, error=f"{reason} (Ray: {ray_says})" if reason else ray_says, log_tail=tail, **times
    )


def _finish(calibration: MemoryCalibration, state: str, **fields) -> MemoryCalibration:
    fields["finished_at"] = fields.get("finished_at") or timezone.now()
    MemoryCalibration.objects.filter(pk=calibration.pk, state__in=MemoryCalibration.ACTIVE_STATES).update(
        state=state, **fields
    )
    return _reload(calibration)


def _reload(calibration: MemoryCalibration) -> MemoryCalibration:
    calibration.refresh_from_db()
    return calibration


def _ray_time(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms else None


def stale_polls() -> Iterator[Job]:
    """One poll, not a chain, for each calibration whose chain was lost."""
    for calibration_id in stale_ids():
        yield Job(jobs.POLL_CALIBRATION, (calibration_id,), {"follow": False})


def stale_ids(now: datetime | None = None) -> list[int]:
    """Unfinished calibrations nobody polled lately (their poll chain was lost)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=stale_after_s())
    unfinished = MemoryCalibration.objects.filter(state__in=MemoryCalibration.ACTIVE_STATES)
    return list(
        unfinished.filter(Q(polled_at__lt=cutoff) | Q(polled_at__isnull=True, created_at__lt=cutoff))
        .order_by("id")
        .values_list("id", flat=True)
    )


# --- what sizing reads ---------------------------------------------------------------------


def calibrations_of(deployment: Deployment):
    """Calibrations of this deployment, also those made before its row was re-created."""
    application = deployment.application
    return MemoryCalibration.objects.filter(
        Q(deployment=deployment)
        | Q(cluster_id=application.cluster_id, application_name=application.name, deployment_name=deployment.name)
    )


def latest_curve(deployment: Deployment) -> Curve | None:
    """The most recent successful calibration of `deployment` as a Curve, or None if it was never
    calibrated. A curve whose measurements dip is returned too, with `monotone` False."""
    row = latest_succeeded(deployment)
    return curve_of(row) if row is not None else None


def latest_succeeded(deployment: Deployment) -> MemoryCalibration | None:
    return calibrations_of(deployment).filter(state=State.SUCCEEDED).order_by("-finished_at", "-id").first()


def curve_of(calibration: MemoryCalibration) -> Curve:
    return Curve(
        axis=calibration.axis,
        device=calibration.device,
        baseline_bytes=int(calibration.baseline_bytes or 0),
        points=[(float(point["x"]), int(point["peak_bytes"])) for point in calibration.points],
        measured_at=calibration.finished_at or calibration.created_at,
        calibration_id=calibration.pk,
        monotone=calibration.monotone is not False,
        service_s={
            float(point["x"]): float(point["service_s"])
            for point in calibration.points
            if point.get("service_s") is not None
        },
        cold_baseline_bytes=calibration.cold_baseline_bytes,
        limit_reason=calibration.limit_reason or None,
        shape=calibration.shape,
    )
