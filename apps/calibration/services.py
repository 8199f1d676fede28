"""Memory calibration: submit the measuring job, follow it to a result, and hand the curve to
whoever sizes the deployment (`latest_curve`). The htmx views, the API and the worker call these."""

from __future__ import annotations

import base64
import json
import secrets
import shlex
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.audit import Actor, record
from apps.calibration.curve import AXES, CalibrationOutputError, Curve, parse_output, reported_error
from apps.calibration.models import MemoryCalibration
from apps.clusters.ray_dashboard import JobInfo, RayError, RayJobNotFound, RayTimeout, RayUnreachable
from apps.clusters.services import dashboard_for
from apps.fleet.models import Deployment

__all__ = ["Curve", "latest_curve", "parse_output", "poll", "request_calibration"]

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
# The call argument travels inside the job's command line.
MAX_CALL_BYTES = 16 * 1024
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
        raise ValidationError(f"The request argument is {size} bytes of JSON; at most {MAX_CALL_BYTES} fit in the job's command line.")


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
    actor_options = deployment.effective_config.get("ray_actor_options") or deployment.submitted_config.get("ray_actor_options") or {}
    own_env = actor_options.get("runtime_env") or {}
    merged = {**app_env, **own_env}
    env_vars = {**(app_env.get("env_vars") or {}), **(own_env.get("env_vars") or {})}
    if env_vars:
        merged["env_vars"] = env_vars
    return merged or None


def build_entrypoint(import_path: str, *, user_config, call, levels: list[int], axis: str = "concurrency",
                     python: str | None = None) -> str:
    """The job's shell command: the measuring script shipped inline, so nothing is installed on the
    cluster beforehand. Every argument is shell-quoted."""
    code = base64.b64encode(JOB_SCRIPT.read_bytes()).decode("ascii")
    loader = f"import base64,sys;exec(compile(base64.b64decode('{code}'),'fleetdeck_calibrate','exec'))"
    args = [python or _python(), "-c", loader, "--import-path", import_path, "--user-config", json.dumps(user_config),
            "--axis", axis, "--levels", ",".join(str(k) for k in levels)]
    if call is not None:
        args += ["--call", json.dumps(call)]
    return shlex.join(args)


# --- requesting ----------------------------------------------------------------------------


def request_calibration(actor: Actor, deployment: Deployment, *, axis: str = "concurrency", levels=None,
                        call=None) -> MemoryCalibration:
    """Submit a calibration job for `deployment`. The caller checks the operator role.

    `axis` "concurrency" runs `levels` concurrent `__call__`s, each with the one argument `call`
    (None: no argument); "token_sum" runs one batch of each token sum in `levels` through the
    class's `calibration_batch(token_sum)` hook (see job_script.py). `levels` defaults to the
    axis's defaults. The user_config is the one the deployment runs now (its effective config).
    The job runs where Ray places job drivers (the head node, unless a GPU is reserved), and its
    peak memory lands there while it runs."""
    application = deployment.application
    cluster = application.cluster
    axis = validate_axis(axis)
    levels = validate_levels(list(DEFAULTS_BY_AXIS[axis] if levels is None else levels), axis)
    if axis == "token_sum" and call is not None:
        raise ValidationError("A token_sum calibration calls calibration_batch(token_sum), not __call__: leave the request "
                              "argument empty.")
    validate_call(call)
    if deployment.removed_at is not None:
        raise ValidationError(f"{application.name}/{deployment.name} is no longer on the cluster.")
    import_path = import_target(deployment)
    user_config = deployment.effective_config.get("user_config", deployment.submitted_config.get("user_config"))
    runtime_env = job_runtime_env(deployment)
    actor_options = deployment.effective_config.get("ray_actor_options") or {}
    # Without a GPU reserved the job would land on a node with none and measure host memory.
    gpus = float(actor_options.get("num_gpus") or 0) or None
    request = {"import_path": import_path, "axis": axis, "user_config": user_config, "call": call, "runtime_env": runtime_env,
               "entrypoint_num_gpus": gpus}
    try:
        with transaction.atomic():
            calibration = MemoryCalibration.objects.create(
                deployment=deployment, cluster=cluster, application_name=application.name, deployment_name=deployment.name,
                submission_id=f"fleetdeck-calibration-{secrets.token_hex(6)}", axis=axis, levels=levels, request=request,
                created_by=actor.user,
            )
    except IntegrityError as exc:
        raise ValidationError(
            f"A calibration of {application.name}/{deployment.name} is already running; wait for it to finish."
        ) from exc
    entrypoint = build_entrypoint(import_path, user_config=user_config, call=call, levels=levels, axis=axis)
    try:
        with dashboard_for(cluster) as ray:
            ray.submit_job(
                entrypoint,
                runtime_env=runtime_env,
                metadata={"fleetdeck": "calibration", "deployment": f"{application.name}/{deployment.name}"},
                submission_id=calibration.submission_id,
                entrypoint_num_gpus=gpus,
            )
    except RayTimeout:
        # Ray may have taken the job: keep the row. Polling finds the job by its id, or reports
        # that it never arrived once UNKNOWN_JOB_GRACE_S has passed.
        pass
    except RayError as exc:
        calibration.delete()
        if isinstance(exc, RayUnreachable):
            raise ValidationError(f"Cluster {cluster.name} is unreachable, so nothing was calibrated: {exc.message}") from exc
        raise ValidationError(f"Ray refused the calibration job: {exc.message}") from exc
    record(actor, "calibration.request", calibration, team=cluster.team,
           changes={"deployment": f"{application.name}/{deployment.name}", "axis": axis, "levels": levels, "call": call,
                    "submission_id": calibration.submission_id})
    transaction.on_commit(lambda: _enqueue(calibration.pk))
    return calibration


def _enqueue(calibration_id: int) -> None:
    from controlplane.celery import send

    # A lost poll leaves the calibration stale: the tick polls it again (stale_ids).
    send("calibration.poll", [calibration_id], countdown=poll_interval_s())


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
            return _finish(calibration, State.FAILED, error=f"Ray has no job {calibration.submission_id}: the submission never "
                                                             "reached the cluster, or the cluster restarted since.")
        return _reload(calibration)
    except RayError as exc:
        if overdue:
            return _finish(calibration, State.FAILED,
                           error=f"No result after {timeout_s():.0f} s, and the cluster cannot be asked: {exc.message}")
        return _reload(calibration)
    if not info.is_final:
        if overdue:
            return _finish(calibration, State.FAILED, error=f"No result after {timeout_s():.0f} s (Ray: {info.status}, "
                                                             f"{info.message or 'no message'}); the job was stopped.")
        if info.status == "RUNNING":
            MemoryCalibration.objects.filter(pk=calibration.pk, state=State.PENDING).update(
                state=State.RUNNING, started_at=_ray_time(info.start_time) or now)
        return _reload(calibration)
    return _finish_from_job(calibration, info, logs)


def _finish_from_job(calibration: MemoryCalibration, info: JobInfo, logs: str) -> MemoryCalibration:
    tail = logs[-LOG_TAIL_CHARS:]
    times = {"started_at": _ray_time(info.start_time) or calibration.started_at, "finished_at": _ray_time(info.end_time)}
    if info.status == "SUCCEEDED":
        try:
            result = parse_output(logs)
        except CalibrationOutputError as exc:
            return _finish(calibration, State.FAILED, error=f"The job ended but left no usable result: {exc}", log_tail=tail, **times)
        if calibration.axis and result["axis"] != calibration.axis:
            return _finish(calibration, State.FAILED, log_tail=tail, **times,
                           error=f"The job measured the {result['axis']} axis, but {calibration.axis} was requested.")
        return _finish(calibration, State.SUCCEEDED, log_tail=tail, **times, **result)
    if info.status == "STOPPED":
        return _finish(calibration, State.STOPPED, error=info.message or "The job was stopped.", log_tail=tail, **times)
    reason = reported_error(logs)
    ray_says = info.message or f"the job {info.status.lower()}"
    return _finish(calibration, State.FAILED, error=f"{reason} (Ray: {ray_says})" if reason else ray_says, log_tail=tail, **times)


def _finish(calibration: MemoryCalibration, state: str, **fields) -> MemoryCalibration:
    fields["finished_at"] = fields.get("finished_at") or timezone.now()
    MemoryCalibration.objects.filter(pk=calibration.pk, state__in=MemoryCalibration.ACTIVE_STATES).update(state=state, **fields)
    return _reload(calibration)


def _reload(calibration: MemoryCalibration) -> MemoryCalibration:
    calibration.refresh_from_db()
    return calibration


def _ray_time(ms: int | None) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms else None


def stale_ids(now: datetime | None = None) -> list[int]:
    """Unfinished calibrations nobody polled lately (their poll chain was lost)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=stale_after_s())
    unfinished = MemoryCalibration.objects.filter(state__in=MemoryCalibration.ACTIVE_STATES)
    return list(unfinished.filter(Q(polled_at__lt=cutoff) | Q(polled_at__isnull=True, created_at__lt=cutoff))
                .order_by("id").values_list("id", flat=True))


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
    )
