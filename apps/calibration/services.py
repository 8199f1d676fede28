"""Memory calibration: submit the measuring job, follow it to a result, and hand the curve to
whoever sizes the deployment (`latest_curve`). The htmx views, the API and the worker call these;
what is measured is checked in `inputs.py`, the job itself is built in `job_spec.py`."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.access import Permission
from apps.accounts.audit import Actor, record
from apps.accounts.models import Role
from apps.calibration.curve import (
    CalibrationOutputError,
    Curve,
    MixEntry,
    mixed_service_s,
    parse_output,
    reported_error,
    steepest_step,
)
from apps.calibration.inputs import (
    DEFAULTS_BY_AXIS,
    OBSERVED_MIX,
    WARMUP_MIX,
    default_calibration,
    validate_axis,
    validate_call,
    validate_levels,
    validate_mix,
    validate_request,
    warmup_mix,
)
from apps.calibration.job_script import MARKER
from apps.calibration.job_spec import build_entrypoint, fitting_nodes, import_target, job_runtime_env, stop_at_bytes
from apps.calibration.models import MemoryCalibration
from apps.calibration.observed_mix import observed_mix
from apps.clusters.services import dashboard_for
from apps.core import jobs
from apps.core.jobs import Job
from apps.core.redaction import redact_config, redact_headers
from apps.core.secrets import encrypt
from apps.fleet.models import Deployment
from integrations.ray.errors import RayError, RayJobNotFound, RayTimeout, RayUnreachable
from integrations.ray.payloads import JobInfo

__all__ = ["Curve", "latest_curve", "parse_output", "poll", "request_calibration"]

CALIBRATE = Permission(Role.OPERATOR, "calibrate deployments")
LOG_TAIL_CHARS = 8000
# A job Ray does not know after this long was never submitted (the submit timed out unanswered).
UNKNOWN_JOB_GRACE_S = 60
State = MemoryCalibration.State


def timeout_s() -> float:
    return float(settings.FLEETDECK_CALIBRATION_TIMEOUT_S)


def poll_interval_s() -> float:
    return settings.FLEETDECK_CALIBRATION_POLL_S


def stale_after_s() -> float:
    """A calibration not polled for this long lost its poll chain; the tick polls it."""
    return max(poll_interval_s() * 10, 30.0)


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
    actor: Actor,
    deployment: Deployment,
    *,
    levels=None,
    call=None,
    axis: str = "concurrency",
    request=None,
    mix=None,
    observed: dict | None = None,
) -> MemoryCalibration:
    """Submit a calibration job for `deployment`. The caller checks the operator role.

    `axis` "concurrency" runs `levels` concurrent calls of the representative `request` (see
    validate_request: an HTTP request for a Starlette or ASGI handler, or a handle call);
    `call=` is shorthand for a handle call with that one argument. Neither given: what
    default_calibration chooses (several warmup requests: their mix). `mix` instead measures a
    weighted mix of requests (see validate_mix), each on its own at every level; "warmup" takes the
    application's warmup profiles as the mix, and a mix of one request is that request; "observed"
    takes it from the traffic's sizes (`observed`, apps.incidents.request_sizes.observed's answer),
    `request` being the template each size fills in (see observed_mix). "token_sum"
    runs one batch of each token sum in `levels` through the class's `calibration_batch(token_sum)`
    hook (see job_script.py). `levels` defaults
    to the axis's defaults. The user_config is the one the deployment runs now (its effective config).

    The job reserves the replica's own CPUs and GPUs, so it runs where a replica could, and is
    refused before submitting when no node has them free. It stops before node memory crosses
    `stop_at_bytes` (see stop_at_bytes) and Ray's own threshold, so it cannot cause an OOM kill."""
    application = deployment.application
    cluster = application.cluster
    axis = validate_axis(axis)
    levels = validate_levels(list(DEFAULTS_BY_AXIS[axis] if levels is None else levels), axis)
    mix_from = None
    if mix == OBSERVED_MIX and axis == "concurrency" and call is None:
        mix, mix_from = observed_mix(request, observed, len(levels))
        request = None
    if mix is not None and (axis == "token_sum" or call is not None or request is not None):
        raise ValidationError(
            {
                "mix": "mix: a mix replaces the representative request and the call argument, on the concurrency "
                "axis: give only one of them."
            }
        )
    if mix is not None and mix != WARMUP_MIX:
        mix = validate_mix(mix, len(levels))
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
    needs = _resources(deployment)
    try:
        with dashboard_for(cluster) as ray:
            fitting = fitting_nodes(ray.resource_usage(), needs, cluster.name)
            memory = ray.node_memory()
            if mix == WARMUP_MIX:
                mix = validate_mix(warmup_mix(deployment, ray.serve_ingresses().get(application.name)), len(levels))
            elif request is None and mix is None and axis == "concurrency":
                request, mix = default_calibration(deployment, ray.serve_ingresses().get(application.name), len(levels))
    except RayUnreachable as exc:
        raise ValidationError(
            f"Cluster {cluster.name} is unreachable, so nothing was calibrated: {exc.message}"
        ) from exc
    except RayError as exc:
        raise ValidationError(
            f"Cluster {cluster.name} cannot be asked about its free resources and memory, so nothing was "
            f"calibrated: {exc.message}"
        ) from exc
    if mix is not None and len(mix) == 1:
        # One request with all the traffic is the representative request, measured exactly as one.
        request, mix = mix[0]["request"], None
    if mix is not None:
        # The largest share stands for the curve (its levels are the calibration's points).
        request = max(mix, key=lambda entry: entry["share"])["request"]
    stop_at = stop_at_bytes(
        [node for node in memory if "" in fitting or node.node_ip in fitting] or memory, cluster.name
    )
    # Without the replica's GPUs reserved the job would land on a node with none and measure host memory.
    cpus, gpus = needs["CPU"], needs["GPU"] or None
    # Header values are kept only encrypted, and env vars not at all: the job got them from Ray.
    headers = (request or {}).get("headers") or {}
    mix_headers = [entry["request"].get("headers") or {} for entry in mix or []]
    secret_headers = mix_headers if any(mix_headers) else headers
    stored = {
        "import_path": import_path,
        "axis": axis,
        "user_config": user_config,
        "representative": _redacted(request) if request is not None else None,
        "call": call,
        "runtime_env": redact_config(job_runtime_env(deployment)),
        "entrypoint_num_cpus": cpus,
        "entrypoint_num_gpus": gpus,
        "stop_at_bytes": stop_at,
    }
    if mix_from is not None:
        stored["mix_from"] = mix_from
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
                mix=[{**entry, "request": _redacted(entry["request"])} for entry in mix or []],
                headers_ciphertext=encrypt(json.dumps(secret_headers)) if secret_headers else "",
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
        mix=mix,
    )
    try:
        with dashboard_for(cluster) as ray:
            ray.submit_job(
                entrypoint,
                runtime_env=job_runtime_env(deployment, request, mix),
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
            "request": {**request, "headers": sorted(headers)} if headers else request,
            **({"mix": [{**e, "request": _header_names(e["request"])} for e in mix]} if mix else {}),
            "submission_id": calibration.submission_id,
        },
    )
    transaction.on_commit(lambda: _enqueue(calibration.pk))
    return calibration


def _redacted(request: dict) -> dict:
    headers = request.get("headers")
    return {**request, "headers": redact_headers(headers)} if headers else request


def _header_names(request: dict) -> dict:
    return {**request, "headers": sorted(request["headers"])} if request.get("headers") else request


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


# A log line this long with no space is encoded data (the job's script travels base64-encoded), not words.
BLOB_CHARS = 200


def readable_tail(logs: str) -> str:
    """The end of a job's log as a person reads it: the machine's result line and encoded blobs left out, each
    replaced by a note of what was there."""
    lines = []
    for line in logs.splitlines(keepends=True):
        end = line[len(line.rstrip("\r\n")) :]
        if line.startswith(f"{MARKER} "):
            lines.append(f"[the result line, {len(line.strip()):,} characters, read by Fleetdeck]{end}")
        elif any(len(word) > BLOB_CHARS for word in line.split()):
            lines.append(f"[{len(line.strip()):,} characters of encoded data left out]{end}")
        else:
            lines.append(line)
    return "".join(lines)[-LOG_TAIL_CHARS:]


# Ray's JobSupervisor appends the job's last log lines to a failed entrypoint's message; they are
# kept apart, made readable, as the calibration's log tail.
RAY_LOGS_APPENDED = ", last available logs"


def ray_message(message: str | None) -> str:
    """Ray's message about a job, without the log lines it repeats (and the job's encoded script with them)."""
    return (message or "").split(RAY_LOGS_APPENDED, 1)[0].strip()


def _finish_from_job(calibration: MemoryCalibration, info: JobInfo, logs: str) -> MemoryCalibration:
    tail = readable_tail(logs)
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
        measured = result.pop("mix")
        if len(measured) != len(calibration.mix):
            return _finish(
                calibration,
                State.FAILED,
                log_tail=tail,
                **times,
                error=f"The job measured {f'a mix of {len(measured)}' if measured else 'one request'}, but "
                f"{f'a mix of {len(calibration.mix)}' if calibration.mix else 'one representative request'} was asked.",
            )
        if measured:
            result["mix"] = [
                {
                    **asked,
                    "label": got["label"],
                    "points": got["points"],
                    "increment_bytes": steepest_step(
                        result["baseline_bytes"], [(p["x"], p["peak_bytes"]) for p in got["points"]]
                    ),
                    "limit_reason": got["limit_reason"] or "",
                }
                for asked, got in zip(calibration.mix, measured, strict=True)
            ]
        return _finish(calibration, State.SUCCEEDED, log_tail=tail, **times, **result)
    if info.status == "STOPPED":
        return _finish(calibration, State.STOPPED, error=info.message or "The job was stopped.", log_tail=tail, **times)
    reason = reported_error(logs)
    ray_says = ray_message(info.message) or f"the job {info.status.lower()}"
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
    mix = tuple(
        _mix_entry(entry, int(calibration.baseline_bytes or 0)) for entry in calibration.mix if entry.get("points")
    )
    return Curve(
        axis=calibration.axis,
        device=calibration.device,
        baseline_bytes=int(calibration.baseline_bytes or 0),
        points=[(float(point["x"]), int(point["peak_bytes"])) for point in calibration.points],
        measured_at=calibration.finished_at or calibration.created_at,
        calibration_id=calibration.pk,
        monotone=calibration.monotone is not False,
        service_s=mixed_service_s(mix)
        if len(mix) >= 2
        else {
            float(point["x"]): float(point["service_s"])
            for point in calibration.points
            if point.get("service_s") is not None
        },
        cold_baseline_bytes=calibration.cold_baseline_bytes,
        limit_reason=calibration.limit_reason or None,
        shape=calibration.shape,
        peak_samples={float(p["x"]): list(p["peak_samples"]) for p in calibration.points if p.get("peak_samples")},
        rest_after={float(p["x"]): int(p["rest_after_bytes"]) for p in calibration.points if "rest_after_bytes" in p},
        mix=mix,
    )


def _mix_entry(entry: dict, baseline: int) -> MixEntry:
    points = entry["points"]
    return MixEntry(
        label=entry.get("label") or "",
        share=float(entry["share"]),
        increment_bytes=steepest_step(baseline, [(p["x"], p["peak_bytes"]) for p in points]),
        points=tuple((float(p["x"]), int(p["peak_bytes"])) for p in points),
        service_s={float(p["x"]): float(p["service_s"]) for p in points if p.get("service_s") is not None},
        peak_samples={float(p["x"]): list(p["peak_samples"]) for p in points if p.get("peak_samples")},
        rest_after={float(p["x"]): int(p["rest_after_bytes"]) for p in points if "rest_after_bytes" in p},
        tokens=entry.get("tokens"),
        limit_reason=entry.get("limit_reason") or None,
    )
