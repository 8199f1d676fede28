"""The jobs API side of the Ray dashboard adapter, against payloads captured from Ray 2.60."""

from __future__ import annotations

import json

import httpx
import pytest

from integrations.ray.dashboard import MAX_JOB_LOG_CHARS, USER_AGENT
from integrations.ray.errors import (
    RayBadResponse,
    RayError,
    RayJobNotFound,
    RayTimeout,
    RayUnreachable,
    RayValidationError,
)
from integrations.ray.payloads import JobInfo
from tests.conftest import ReplayRay, ray_fixture

JOB_ID = "raysubmit_SjDLX2M9YPftGk6J"
JOBS = "/api/jobs/"


def dashboard(routes: dict) -> tuple:
    replay = ReplayRay(routes)
    return replay.dashboard(), replay


def envelope_response(name: str) -> httpx.Response:
    envelope = ray_fixture(name)
    return httpx.Response(envelope["status"], text=envelope["body"], headers={"content-type": envelope["content_type"]})


# --- submit --------------------------------------------------------------------------------


def test_submit_posts_the_entrypoint_and_options_and_returns_the_submission_id():
    ray, replay = dashboard({JOBS: "jobs_submit_response.json"})
    accepted = ray.submit_job(
        "python -c 'print(1)'",
        runtime_env={"env_vars": {"A": "1"}},
        metadata={"owner": "fleetdeck"},
        submission_id=JOB_ID,
    )
    assert accepted == JOB_ID
    request = replay.requests[-1]
    assert request.method == "POST" and request.headers["user-agent"] == USER_AGENT
    assert json.loads(request.content) == {
        "entrypoint": "python -c 'print(1)'",
        "runtime_env": {"env_vars": {"A": "1"}},
        "metadata": {"owner": "fleetdeck"},
        "submission_id": JOB_ID,
    }


def test_submit_leaves_out_options_that_were_not_given():
    ray, replay = dashboard({JOBS: "jobs_submit_response.json"})
    ray.submit_job("true", entrypoint_num_gpus=1.0)
    assert json.loads(replay.requests[-1].content) == {"entrypoint": "true", "entrypoint_num_gpus": 1.0}


def test_a_refused_submission_says_why_in_ray_s_last_traceback_line():
    traceback = (
        'Traceback (most recent call last):\n  File "job_head.py", line 1\n'
        "ValueError: Job with submission_id x already exists.\n"
    )
    ray, _ = dashboard({JOBS: httpx.Response(400, text=traceback)})
    with pytest.raises(RayValidationError) as caught:
        ray.submit_job("true", submission_id="x")
    assert caught.value.message == "ValueError: Job with submission_id x already exists." and caught.value.status == 400


def test_a_submission_answer_without_an_id_is_a_bad_response():
    ray, _ = dashboard({JOBS: {"something": "else"}})
    with pytest.raises(RayBadResponse, match="no submission_id"):
        ray.submit_job("true")


def test_a_submission_that_times_out_is_transient_and_may_have_been_taken():
    ray, _ = dashboard({JOBS: httpx.ReadTimeout("slow")})
    with pytest.raises(RayTimeout) as caught:
        ray.submit_job("true", submission_id="mine")
    assert caught.value.transient


def test_an_unreachable_dashboard_refuses_the_submission_as_transient():
    ray, _ = dashboard({JOBS: httpx.ConnectError("refused")})
    with pytest.raises(RayUnreachable) as caught:
        ray.submit_job("true")
    assert caught.value.transient


# --- one job, its logs, stop ---------------------------------------------------------------


def test_job_parses_status_message_times_and_entrypoint():
    ray, replay = dashboard({f"{JOBS}{JOB_ID}": "jobs_get_one.json"})
    info = ray.job(JOB_ID)
    assert info == JobInfo(
        submission_id=JOB_ID,
        status="SUCCEEDED",
        message="Job finished successfully.",
        start_time=1796044013242,
        end_time=1796044014770,
        entrypoint="python -c \"import ray; print('hello from job', ray.__version__)\"",
        error_type="",
        driver_exit_code=0,
    )
    assert info.is_final and replay.requests[-1].method == "GET"


@pytest.mark.parametrize(
    "status, final", [("PENDING", False), ("RUNNING", False), ("SUCCEEDED", True), ("FAILED", True), ("STOPPED", True)]
)
def test_only_succeeded_failed_and_stopped_are_final(status, final):
    running = {**ray_fixture("jobs_get_one.json"), "status": status, "end_time": None}
    ray, _ = dashboard({f"{JOBS}{JOB_ID}": running})
    info = ray.job(JOB_ID)
    assert info.status == status and info.is_final is final


def test_an_unknown_job_is_job_not_found_with_status_404():
    ray, _ = dashboard({f"{JOBS}nonexistent_job_id": envelope_response("jobs_get_404.json")})
    with pytest.raises(RayJobNotFound) as caught:
        ray.job("nonexistent_job_id")
    assert caught.value.status == 404 and not caught.value.transient
    assert isinstance(caught.value, RayBadResponse)
    assert caught.value.message == "Ray has no job 'nonexistent_job_id' (HTTP 404)."


def test_a_server_failure_reading_a_job_stays_a_transient_bad_response():
    ray, _ = dashboard({f"{JOBS}{JOB_ID}": httpx.Response(500, text="boom")})
    with pytest.raises(RayBadResponse) as caught:
        ray.job(JOB_ID)
    assert caught.value.transient and not isinstance(caught.value, RayJobNotFound)


def test_a_job_id_that_would_change_the_path_is_refused_before_any_request():
    ray, replay = dashboard({})
    with pytest.raises(RayError):
        ray.job("../serve/applications")
    assert replay.requests == []


def test_job_logs_returns_the_text():
    ray, _ = dashboard({f"{JOBS}{JOB_ID}/logs": "jobs_logs.json"})
    assert ray.job_logs(JOB_ID).splitlines()[-1] == "hello from job 2.60.0"


def test_job_logs_keep_only_the_tail_of_a_long_log():
    long_log = "x" * MAX_JOB_LOG_CHARS + "\nthe end\n"
    ray, _ = dashboard({f"{JOBS}{JOB_ID}/logs": {"logs": long_log}})
    logs = ray.job_logs(JOB_ID)
    assert len(logs) == MAX_JOB_LOG_CHARS and logs.endswith("the end\n")


def test_logs_of_an_unknown_job_are_job_not_found():
    ray, _ = dashboard({f"{JOBS}gone/logs": envelope_response("jobs_get_404.json")})
    with pytest.raises(RayJobNotFound):
        ray.job_logs("gone")


def test_logs_without_a_logs_string_are_a_bad_response():
    ray, _ = dashboard({f"{JOBS}{JOB_ID}/logs": {"lines": []}})
    with pytest.raises(RayBadResponse, match="no 'logs' string"):
        ray.job_logs(JOB_ID)


def test_stop_posts_and_reports_whether_ray_stopped_the_job():
    ray, replay = dashboard({f"{JOBS}{JOB_ID}/stop": {"stopped": True}})
    assert ray.stop_job(JOB_ID) is True
    assert replay.requests[-1].method == "POST"
    ray, _ = dashboard({f"{JOBS}{JOB_ID}/stop": {"stopped": False}})
    assert ray.stop_job(JOB_ID) is False


def test_stopping_an_unknown_job_is_job_not_found():
    ray, _ = dashboard({f"{JOBS}gone/stop": envelope_response("jobs_get_404.json")})
    with pytest.raises(RayJobNotFound):
        ray.stop_job("gone")
