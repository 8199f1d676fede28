"""The calibration service against the replayed dashboard: submitting, refusing, and polling a job
through every state."""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.calibration import inputs, services
from apps.calibration.curve import Curve
from apps.calibration.models import MemoryCalibration
from apps.fleet.models import Deployment
from tests.conftest import ray_fixture
from tests.unit.calibration.helpers import MIB, job_says, result_line


def test_requesting_submits_the_inline_script_with_the_app_s_runtime_env_and_audits(model, operator, use_replay):
    calibration = services.request_calibration(operator, model, levels=[4, 1, 2], call="hello")
    assert calibration.state == "pending" and calibration.levels == [1, 2, 4]
    assert (calibration.application_name, calibration.deployment_name) == ("demo", "Model")
    submitted = json.loads(use_replay.requests[-1].content)
    assert submitted["submission_id"] == calibration.submission_id
    assert submitted["runtime_env"] == {"env_vars": {"PYTHONPATH": "/opt/demo-app", "RECYCLE_GENERATION": "1"}}
    assert submitted["metadata"] == {"fleetdeck": "calibration", "deployment": "demo/Model"}
    argv = shlex.split(submitted["entrypoint"])
    assert argv[argv.index("--import-path") + 1] == "demo_app:Model"
    assert json.loads(argv[argv.index("--user-config") + 1]) == {"alloc_mb": 0, "hold_s": 0.05}
    # A call argument is a handle call with that one argument.
    assert argv[argv.index("--levels") + 1] == "1,2,4"
    assert json.loads(argv[argv.index("--request") + 1]) == {"kind": "handle", "args": ["hello"]}
    assert calibration.request["representative"] == {"kind": "handle", "args": ["hello"]}
    # The replica's own CPUs (demo's Model asks 0.2), and a stop below 0.95 of the node's memory.
    assert submitted["entrypoint_num_cpus"] == 0.2 and "entrypoint_num_gpus" not in submitted
    total, available = 25276063744, 24670765056  # nodes_view_summary.json
    stop = int(argv[argv.index("--stop-at-bytes") + 1])
    assert (
        stop
        == int(total - available + 0.8 * (0.95 * total - (total - available)))
        == calibration.request["stop_at_bytes"]
    )
    event = AuditEvent.objects.get(action="calibration.request")
    assert event.actor_name == "operator" and event.changes["levels"] == [1, 2, 4]


def test_a_gpu_deployment_reserves_a_gpu_for_the_job(model, operator, use_replay):
    model.effective_config["ray_actor_options"]["num_gpus"] = 1
    model.save()
    status = ray_fixture("cluster_status.json")
    for usage in [
        status["data"]["clusterStatus"]["loadMetricsReport"]["usage"],
        *status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"].values(),
    ]:
        usage["GPU"] = [0.0, 1.0]
    use_replay.routes["/api/cluster_status"] = status
    services.request_calibration(operator, model)
    assert json.loads(use_replay.requests[-1].content)["entrypoint_num_gpus"] == 1.0


def test_a_second_calibration_is_refused_while_one_runs(model, operator):
    services.request_calibration(operator, model)
    with pytest.raises(ValidationError, match="already running"):
        services.request_calibration(operator, model)
    assert MemoryCalibration.objects.count() == 1


def test_an_unreachable_cluster_refuses_and_leaves_no_row(model, operator, use_replay):
    use_replay.routes["/api/jobs/"] = httpx.ConnectError("connection refused")
    with pytest.raises(ValidationError, match="Cluster vision-prod is unreachable"):
        services.request_calibration(operator, model)
    assert (
        not MemoryCalibration.objects.exists() and not AuditEvent.objects.filter(action="calibration.request").exists()
    )


def test_ray_refusing_the_job_is_reported(model, operator, use_replay):
    use_replay.routes["/api/jobs/"] = httpx.Response(400, text="Traceback\nValueError: bad runtime_env")
    with pytest.raises(ValidationError, match="Ray refused the calibration job: ValueError: bad runtime_env"):
        services.request_calibration(operator, model)
    assert not MemoryCalibration.objects.exists()


def test_a_submit_that_times_out_keeps_the_row_for_polling_to_settle(model, operator, use_replay):
    use_replay.routes["/api/jobs/"] = httpx.ReadTimeout("slow")
    assert services.request_calibration(operator, model).state == "pending"


def test_an_unknown_import_path_is_refused(model, operator):
    model.application.import_path = ""
    model.application.save()
    with pytest.raises(ValidationError, match="import path of application demo is unknown"):
        services.request_calibration(operator, model)


@pytest.mark.parametrize(
    "levels, message",
    [
        ([], "at least one"),
        ([0, 1], "between 1 and 64"),
        ([1, 100], "between 1 and 64"),
        (list(range(1, 10)), "At most 8"),
        (["2"], "whole numbers"),
    ],
)
def test_bad_levels_are_refused(model, operator, levels, message):
    with pytest.raises(ValidationError, match=message):
        services.request_calibration(operator, model, levels=levels)


def test_a_token_sum_calibration_submits_the_axis_with_its_default_sums_and_records_it(model, operator, use_replay):
    calibration = services.request_calibration(operator, model, axis="token_sum")
    assert calibration.axis == "token_sum" and calibration.levels == [256, 1024, 4096]
    assert calibration.request["axis"] == "token_sum" and calibration.request["call"] is None
    argv = shlex.split(json.loads(use_replay.requests[-1].content)["entrypoint"])
    assert argv[argv.index("--axis") + 1] == "token_sum" and argv[argv.index("--levels") + 1] == "256,1024,4096"
    assert "--call" not in argv
    assert AuditEvent.objects.get(action="calibration.request").changes["axis"] == "token_sum"


@pytest.mark.parametrize(
    "axis, levels, call, message",
    [
        ("token_sum", [64, 65_537], None, "The token sums must be between 1 and 65,536."),
        ("token_sum", list(range(1, 10)), None, "At most 8 token sums per calibration."),
        ("token_sum", [1024], "hi", "leave the request empty"),
        ("batch", [1], None, "The axis must be one of concurrency, token_sum, not 'batch'."),
    ],
)
def test_token_sums_are_validated_by_their_own_rules(model, operator, axis, levels, call, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        services.request_calibration(operator, model, axis=axis, levels=levels, call=call)
    assert inputs.validate_levels([65_536, 64], "token_sum") == [64, 65_536]


def test_a_job_that_measured_another_axis_than_requested_fails(model, operator, use_replay):
    calibration = services.request_calibration(operator, model, axis="token_sum")
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    failed = services.poll(calibration.pk)
    assert (
        failed.state == "failed"
        and failed.error == "The job measured the concurrency axis, but token_sum was requested."
    )


def test_a_huge_call_argument_is_refused(model, operator):
    with pytest.raises(ValidationError, match="at most 16384"):
        services.request_calibration(operator, model, call="x" * 20000)


def test_polling_follows_the_job_to_a_curve_that_latest_curve_returns(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    assert services.latest_curve(model) is None
    job_says(use_replay, calibration, "PENDING", end=False)
    assert services.poll(calibration.pk).state == "pending"
    job_says(use_replay, calibration, "RUNNING", end=False)
    running = services.poll(calibration.pk)
    assert running.state == "running" and running.started_at is not None
    job_says(use_replay, calibration, "SUCCEEDED", logs="baseline: 100 MiB\n" + result_line() + "\n")
    done = services.poll(calibration.pk)
    assert done.state == "succeeded" and done.monotone is True and done.baseline_bytes == 100 * MIB
    assert done.finished_at == datetime(2026, 11, 30, 13, 6, 54, 770000, tzinfo=UTC)

    found = services.latest_curve(model)
    assert found == Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=100 * MIB,
        points=[(1.0, 164 * MIB), (2.0, 228 * MIB), (4.0, 356 * MIB)],
        measured_at=done.finished_at,
        calibration_id=calibration.pk,
        monotone=True,
    )
    assert found.per_unit_bytes == 64 * MIB and found.peak_at(8) == 612 * MIB


def test_polling_a_final_calibration_asks_ray_nothing(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    asked = len(use_replay.requests)
    assert services.poll(calibration.pk).state == "succeeded" and len(use_replay.requests) == asked


def test_a_failed_job_keeps_the_script_s_reason_ray_s_message_and_the_log_tail(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    logs = (
        "Traceback (most recent call last):\n  ...\n"
        "FLEETDECK_CALIBRATION_ERROR ModuleNotFoundError: No module named 'demo_app'\n"
    )
    job_says(use_replay, calibration, "FAILED", logs=logs, message="Job entrypoint command failed with exit code 1")
    failed = services.poll(calibration.pk)
    assert failed.state == "failed"
    assert (
        failed.error
        == "ModuleNotFoundError: No module named 'demo_app' (Ray: Job entrypoint command failed with exit code 1)"
    )
    assert failed.log_tail == logs
    assert services.latest_curve(model) is None


def test_a_failed_job_s_error_leaves_out_the_log_lines_ray_appends_to_its_message(model, operator, use_replay):
    # Ray 2.60's JobSupervisor appends the job's last log lines to the message of a failed entrypoint,
    # the base64 of the job's script among them; they belong in the log tail, made readable.
    calibration = services.request_calibration(operator, model)
    logs = (
        "python -c import base64,sys;exec(compile(base64.b64decode('" + "QUJD" * 300 + "')))\n"
        "FLEETDECK_CALIBRATION_ERROR Node memory reached 3667 MiB during concurrency 1, past the stop at 3664 MiB; "
        "the run ended there. Nothing was measured.\n"
    )
    message = (
        "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + logs
    )
    job_says(use_replay, calibration, "FAILED", logs=logs, message=message)
    failed = services.poll(calibration.pk)
    assert failed.error == (
        "Node memory reached 3667 MiB during concurrency 1, past the stop at 3664 MiB; the run ended there. "
        "Nothing was measured. (Ray: Job entrypoint command failed with exit code 1)"
    )
    assert "QUJD" not in failed.log_tail and "characters of encoded data left out" in failed.log_tail


def test_a_job_that_succeeded_without_a_result_line_fails_the_calibration(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs="hello\n")
    failed = services.poll(calibration.pk)
    assert (
        failed.state == "failed"
        and "left no usable result: The job printed no FLEETDECK_CALIBRATION line." in failed.error
    )


def test_a_stopped_job_is_recorded_as_stopped(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "STOPPED", message="Job was intentionally stopped.")
    stopped = services.poll(calibration.pk)
    assert stopped.state == "stopped" and stopped.error == "Job was intentionally stopped."


def test_a_non_monotone_result_is_stored_with_its_warning_and_still_served(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    line = result_line(
        points=[{"concurrency": 1, "peak_bytes": 300 * MIB}, {"concurrency": 2, "peak_bytes": 250 * MIB}]
    )
    job_says(use_replay, calibration, "SUCCEEDED", logs=line)
    done = services.poll(calibration.pk)
    assert done.state == "succeeded" and done.monotone is False and len(done.warnings) == 1
    assert services.latest_curve(model).monotone is False


def test_an_overdue_job_is_stopped_and_failed_with_the_reason(model, operator, use_replay, settings):
    settings.FLEETDECK_CALIBRATION_TIMEOUT_S = 60
    calibration = services.request_calibration(operator, model)
    MemoryCalibration.objects.filter(pk=calibration.pk).update(created_at=timezone.now() - timedelta(seconds=61))
    job_says(use_replay, calibration, "PENDING", message="Job is waiting for resources.", end=False)
    use_replay.routes[f"/api/jobs/{calibration.submission_id}/stop"] = {"stopped": True}
    failed = services.poll(calibration.pk)
    assert failed.state == "failed"
    assert failed.error == "No result after 60 s (Ray: PENDING, Job is waiting for resources.); the job was stopped."
    assert use_replay.requests[-1].url.path.endswith("/stop")


def test_a_job_ray_does_not_know_yet_stays_pending_then_fails_after_the_grace_period(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    assert services.poll(calibration.pk).state == "pending"  # ReplayRay answers 404 for the unknown path
    MemoryCalibration.objects.filter(pk=calibration.pk).update(
        created_at=timezone.now() - timedelta(seconds=services.UNKNOWN_JOB_GRACE_S + 1)
    )
    failed = services.poll(calibration.pk)
    assert failed.state == "failed" and "never reached the cluster" in failed.error


def test_an_unreachable_cluster_while_polling_keeps_the_calibration_pending(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    use_replay.routes[f"/api/jobs/{calibration.submission_id}"] = httpx.ConnectError("down")
    assert services.poll(calibration.pk).state == "pending"


def test_poll_tolerates_a_deleted_row(db):
    assert services.poll(999_999) is None


def test_stale_ids_lists_unfinished_calibrations_nobody_polled_lately(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    later = timezone.now() + timedelta(seconds=services.stale_after_s() + 1)
    assert services.stale_ids() == [] and services.stale_ids(later) == [calibration.pk]
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    assert services.stale_ids(later + timedelta(hours=1)) == []


def test_the_poll_task_follows_until_final_and_the_tick_poll_does_not(model, operator, use_replay, monkeypatch):
    from workers import tasks

    follows = []
    monkeypatch.setattr(
        tasks.poll_calibration, "apply_async", lambda args, countdown: follows.append((args, countdown))
    )
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "RUNNING", end=False)
    tasks.poll_calibration(calibration.pk)
    tasks.poll_calibration(calibration.pk, follow=False)
    assert follows == [([calibration.pk], services.poll_interval_s())]
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    tasks.poll_calibration(calibration.pk)
    assert len(follows) == 1


def test_latest_curve_matches_by_names_after_the_deployment_row_was_recreated(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    application = model.application
    model.delete()
    assert MemoryCalibration.objects.get(pk=calibration.pk).deployment is None
    reborn = Deployment.objects.create(application=application, name="Model", status="HEALTHY")
    assert services.latest_curve(reborn).calibration_id == calibration.pk
