"""Memory calibration: the output parser, the curve the wizard reads, the job script itself, the
service against a fake dashboard in every job state, the API's roles and the deployment card."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.accounts.audit import Actor
from apps.accounts.models import AuditEvent
from apps.calibration import inputs, job_spec, services
from apps.calibration.curve import CalibrationOutputError, Curve, parse_output
from apps.calibration.models import MemoryCalibration
from apps.clusters.models import Cluster
from apps.fleet import sync
from apps.fleet.models import Deployment
from tests.conftest import ray_fixture
from tests.factories import ClusterFactory

MIB = 2**20
WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=dt_timezone.utc)


def result_line(**overrides) -> str:
    body = {
        "device": "cpu",
        "axis": "concurrency",
        "baseline_bytes": 100 * MIB,
        "points": [
            {"concurrency": 1, "peak_bytes": 164 * MIB},
            {"concurrency": 2, "peak_bytes": 228 * MIB},
            {"concurrency": 4, "peak_bytes": 356 * MIB},
        ],
    }
    body.update(overrides)
    return "FLEETDECK_CALIBRATION " + json.dumps(body)


def curve(points, baseline=100, monotone=True) -> Curve:
    return Curve(
        axis="concurrency",
        device="cpu",
        baseline_bytes=baseline,
        points=points,
        measured_at=WHEN,
        calibration_id=1,
        monotone=monotone,
    )


# --- parse_output ----------------------------------------------------------------------------


def test_the_concurrency_result_is_read_from_the_last_marker_line_among_other_logs():
    logs = "Running entrypoint for job x\nbaseline: 100 MiB\n" + result_line() + "\n"
    parsed = parse_output(logs)
    # An older script's line: no shape, cold baseline, USS, service time nor limit reason.
    assert parsed == {
        "axis": "concurrency",
        "device": "cpu",
        "shape": "",
        "baseline_bytes": 100 * MIB,
        "cold_baseline_bytes": None,
        "limit_reason": None,
        "points": [
            {"x": 1, "peak_bytes": 164 * MIB},
            {"x": 2, "peak_bytes": 228 * MIB},
            {"x": 4, "peak_bytes": 356 * MIB},
        ],
        "monotone": True,
        "warnings": [],
    }


def test_the_token_sum_axis_of_the_reference_app_is_accepted_and_sorted():
    line = result_line(
        axis="token_sum",
        device="cuda",
        points=[{"token_sum": 2048, "peak_bytes": 900}, {"token_sum": 512, "peak_bytes": 600}],
    )
    parsed = parse_output(line)
    assert parsed["axis"] == "token_sum" and parsed["device"] == "cuda"
    assert [p["x"] for p in parsed["points"]] == [512, 2048]


def test_a_later_result_line_wins_and_a_log_prefix_before_the_marker_is_ignored():
    logs = result_line(device="old") + "\n(pid=12) " + result_line(device="new")
    assert parse_output(logs)["device"] == "new"


def test_extra_keys_on_points_such_as_host_rss_are_ignored():
    line = result_line(points=[{"concurrency": 1, "peak_bytes": 5, "rss_peak_bytes": 9}], baseline_bytes=1)
    assert parse_output(line)["points"] == [{"x": 1, "peak_bytes": 5}]


def test_a_peak_that_falls_is_kept_as_measured_and_flagged_not_monotone():
    line = result_line(
        points=[{"concurrency": 1, "peak_bytes": 300 * MIB}, {"concurrency": 2, "peak_bytes": 250 * MIB}]
    )
    parsed = parse_output(line)
    assert parsed["monotone"] is False
    assert [p["peak_bytes"] for p in parsed["points"]] == [300 * MIB, 250 * MIB]
    assert parsed["warnings"] == [
        "Peak memory falls from 300.0 MiB at concurrency 1 to 250.0 MiB at concurrency 2: the measurement "
        "is noisy or memory was freed in between; the curve is kept as measured."
    ]


def test_a_peak_below_the_baseline_is_flagged_too():
    parsed = parse_output(result_line(baseline_bytes=500, points=[{"concurrency": 1, "peak_bytes": 400}]))
    assert parsed["monotone"] is False and "at the baseline" in parsed["warnings"][0]


@pytest.mark.parametrize(
    "logs, message",
    [
        ("nothing to see\n", "printed no FLEETDECK_CALIBRATION line"),
        ("FLEETDECK_CALIBRATION {not json", "not JSON"),
        ("FLEETDECK_CALIBRATION [1, 2]", "not an object"),
        (result_line(axis="batch"), "axis is 'batch'"),
        (result_line(device=""), "no device"),
        (result_line(baseline_bytes=-1), "baseline_bytes"),
        (result_line(baseline_bytes=True), "baseline_bytes"),
        (result_line(points=[]), "no points"),
        (result_line(points=[{"concurrency": 0, "peak_bytes": 1}]), "Point 0 has no positive concurrency"),
        (result_line(points=[{"token_sum": 1, "peak_bytes": 1}]), "Point 0 has no positive concurrency"),
        (result_line(points=[{"concurrency": 1, "peak_bytes": 1.5}]), "Point 0 has no non-negative integer peak_bytes"),
        (
            result_line(points=[{"concurrency": 2, "peak_bytes": 1}, {"concurrency": 2, "peak_bytes": 2}]),
            "same concurrency",
        ),
        (result_line(points=[{"concurrency": k + 1, "peak_bytes": 1} for k in range(65)]), "at most 64"),
        (
            "FLEETDECK_CALIBRATION_ERROR ModuleNotFoundError: No module named 'x'",
            "The calibration failed: ModuleNotFoundError",
        ),
    ],
)
def test_malformed_output_is_refused_with_a_sentence(logs, message):
    with pytest.raises(CalibrationOutputError, match=message) as caught:
        parse_output(logs)
    assert str(caught.value).endswith(".") or "ModuleNotFoundError" in str(caught.value)


def test_an_error_line_after_an_older_result_means_the_run_failed():
    with pytest.raises(CalibrationOutputError, match="boom"):
        parse_output(result_line() + "\nFLEETDECK_CALIBRATION_ERROR boom")


# --- Curve -------------------------------------------------------------------------------------


def test_peak_at_interpolates_between_points_and_from_the_baseline_to_the_first():
    c = curve([(1, 200), (3, 400)])
    assert c.peak_at(1) == 200 and c.peak_at(2) == 300 and c.peak_at(3) == 400
    assert c.peak_at(0.5) == 150  # between the baseline at 0 and the first point
    assert c.peak_at(0) == 100 and c.peak_at(-5) == 100


def test_peak_at_extrapolates_along_the_last_step():
    c = curve([(1, 200), (2, 250), (4, 450)])
    assert c.peak_at(8) == 450 + 4 * 100


def test_one_point_extrapolates_from_the_baseline():
    c = curve([(2, 300)])
    assert c.peak_at(1) == 200 and c.peak_at(4) == 500
    assert c.per_unit_bytes == 100


def test_a_flat_curve_costs_nothing_per_unit_and_stays_at_the_baseline():
    c = curve([(1, 100), (2, 100), (4, 100)])
    assert c.per_unit_bytes == 0 and c.peak_at(64) == 100


def test_per_unit_bytes_is_the_steepest_step_including_the_first_request():
    assert curve([(1, 400), (2, 450), (4, 550)]).per_unit_bytes == 300  # 100 -> 400 for the first request
    assert curve([(1, 150), (2, 200), (4, 600)]).per_unit_bytes == 200  # (600 - 200) / 2


def test_per_unit_bytes_rounds_fractional_slopes_up():
    c = Curve(axis="token_sum", device="cuda", baseline_bytes=0, points=[(3.0, 10)], measured_at=WHEN, calibration_id=1)
    assert c.per_unit_bytes == 4


def test_a_dip_at_the_end_never_extrapolates_downwards_nor_below_the_baseline():
    c = curve([(1, 300), (2, 200)], monotone=False)
    assert c.peak_at(10) == 200
    assert curve([(1, 50)]).peak_at(1) == 100  # a peak under the baseline reads as the baseline
    assert curve([(1, 300), (2, 200)]).per_unit_bytes == 200


# --- the job script, run for real in a subprocess -------------------------------------------------


FAKE_APP = '''
import asyncio, threading

class Deployment:
    """Stands in for ray.serve.Deployment: what the script looks for."""
    def __init__(self, cls, name):
        self.func_or_class, self.name = cls, name

class AsyncModel:
    def __init__(self):
        self.mb = 0
    def reconfigure(self, config):
        self.mb = config["alloc_mb"]
    async def __call__(self, text):
        scratch = bytearray(b"\\x01") * (self.mb * 1024 * 1024)
        await asyncio.sleep(0.2)
        return len(scratch) + len(text)

class SyncModel:
    def __init__(self):
        self.mb, self.barrier = 0, None
    async def reconfigure(self, config):
        self.mb = config["alloc_mb"]
    def __call__(self):
        scratch = bytearray(b"\\x01") * (self.mb * 1024 * 1024)
        threading.Event().wait(0.2)
        return len(scratch)

class Broken:
    async def __call__(self, text):
        raise RuntimeError("model exploded")

Model = Deployment(AsyncModel, "Model")
renamed = Deployment(SyncModel, "Renamed")

def function_deployment(request):
    return request

fn = Deployment(function_deployment, "fn")
'''


@pytest.fixture
def fake_app(tmp_path):
    (tmp_path / "fake_app.py").write_text(textwrap.dedent(FAKE_APP))
    return tmp_path


def run_job(fake_app, import_path, *, user_config=None, call=None, levels=(1, 2, 4), axis="concurrency", timeout=60):
    entrypoint = job_spec.build_entrypoint(
        import_path, user_config=user_config, call=call, levels=list(levels), axis=axis, python=sys.executable
    )
    return subprocess.run(
        entrypoint,
        shell=True,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PYTHONPATH": str(fake_app), "PATH": "/usr/bin:/bin"},
        cwd=fake_app,
    )


def test_the_job_measures_an_async_deployment_and_prints_one_result_line_last(fake_app):
    done = run_job(fake_app, "fake_app:Model", user_config={"alloc_mb": 16}, call="hi")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("FLEETDECK_CALIBRATION {")
    assert sum("FLEETDECK_CALIBRATION" in line for line in done.stdout.splitlines()) == 1
    parsed = parse_output(done.stdout)
    assert parsed["axis"] == "concurrency" and parsed["device"] == "cpu" and parsed["monotone"]
    peaks = {p["x"]: p["peak_bytes"] - parsed["baseline_bytes"] for p in parsed["points"]}
    assert peaks[4] >= 3 * 16 * MIB, peaks  # four 16 MiB requests held at once


def test_the_job_finds_a_deployment_by_its_serve_name_and_runs_sync_calls_in_threads(fake_app):
    done = run_job(fake_app, "fake_app:Renamed", user_config={"alloc_mb": 8}, levels=(1, 3))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p["x"] for p in parse_output(done.stdout)["points"]] == [1, 3]


@pytest.mark.parametrize(
    "import_path, call, message",
    [
        ("no_such_module:Model", "x", "ModuleNotFoundError: No module named 'no_such_module'"),
        ("fake_app:Nope", "x", "module 'fake_app' has no deployment or class named 'Nope'"),
        ("fake_app:fn", "x", "is a function deployment"),
        (
            "fake_app:Broken",
            "x",
            'The representative request handle call __call__("x") failed at concurrency 1: RuntimeError: '
            "model exploded. Nothing was measured.",
        ),
        (
            "fake_app:Model",
            None,
            "The representative request handle call __call__() failed at concurrency 1: TypeError: "
            "AsyncModel.__call__() missing 1 required positional argument: 'text'. Nothing was measured.",
        ),
    ],
)
def test_a_failing_job_prints_the_error_line_and_exits_1(fake_app, import_path, call, message):
    done = run_job(fake_app, import_path, call=call, levels=(4,) if "Broken" in import_path else (1,))
    assert done.returncode == 1
    last = done.stdout.splitlines()[-1]
    assert last.startswith("FLEETDECK_CALIBRATION_ERROR ") and message in last, done.stdout


FAKE_TORCH = """
class _Cuda:
    allocated = peak = 1000
    def is_available(self):
        return True
    def synchronize(self):
        pass
    def memory_allocated(self):
        return self.allocated
    def reset_peak_memory_stats(self):
        self.peak = self.allocated
    def max_memory_allocated(self):
        return self.peak
cuda = _Cuda()
"""

GPU_APP = """
import torch

class GpuModel:
    def __call__(self):
        torch.cuda.peak += 100  # each call holds 100 bytes of GPU memory at its peak
"""


def test_on_a_gpu_the_job_reports_cuda_peaks_from_torch_and_keeps_host_rss_aside(fake_app):
    # A stand-in torch module: this checks the CUDA branch of the script, not a real GPU.
    (fake_app / "torch.py").write_text(FAKE_TORCH)
    (fake_app / "gpu_app.py").write_text(GPU_APP)
    done = run_job(fake_app, "gpu_app:GpuModel", levels=(1, 2))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1].removeprefix("FLEETDECK_CALIBRATION "))
    assert result["device"] == "cuda" and result["baseline_bytes"] == 1000
    assert [(p["concurrency"], p["peak_bytes"]) for p in result["points"]] == [(1, 1100), (2, 1200)]
    assert all(p["rss_peak_bytes"] > 0 for p in result["points"])


def test_bad_levels_end_in_the_error_line_not_an_argparse_exit():
    from apps.calibration import job_script

    assert job_script.main(["--import-path", "fake_app:Model", "--levels", "4,2"]) == 1
    assert job_script.main(["--bogus"]) == 1


def test_the_entrypoint_quotes_every_argument_for_the_shell():
    entrypoint = job_spec.build_entrypoint(
        "m:Cls", user_config={"q": "it's $HOME"}, call={"t": "a b"}, levels=[1, 2], python="python"
    )
    argv = shlex.split(entrypoint)
    assert argv[:2] == ["python", "-c"] and "fleetdeck_calibrate" in argv[2]
    assert argv[3:] == [
        "--import-path",
        "m:Cls",
        "--user-config",
        '{"q": "it\'s $HOME"}',
        "--axis",
        "concurrency",
        "--levels",
        "1,2",
        "--call",
        '{"t": "a b"}',
    ]


TOKEN_APP = """
class Batcher:
    \"\"\"Holds 8 KiB per token of a batch while it runs.\"\"\"
    def __init__(self):
        self.kib = 0
    def reconfigure(self, config):
        self.kib = config["kib_per_token"]
    def calibration_batch(self, token_sum):
        scratch = bytearray(b"\\x01") * (token_sum * self.kib * 1024)
        return len(scratch)

class NoHook:
    def __call__(self):
        return 1

class BadHook:
    def calibration_batch(self, token_sum):
        raise MemoryError(f"{token_sum} tokens do not fit")
"""


def test_the_token_sum_axis_runs_one_batch_per_sum_through_the_calibration_hook(fake_app):
    (fake_app / "token_app.py").write_text(TOKEN_APP)
    done = run_job(
        fake_app, "token_app:Batcher", user_config={"kib_per_token": 64}, levels=(256, 1024, 2048), axis="token_sum"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1].removeprefix("FLEETDECK_CALIBRATION "))
    assert result["axis"] == "token_sum" and [p["token_sum"] for p in result["points"]] == [256, 1024, 2048]
    parsed = parse_output(done.stdout)
    assert (
        parsed["monotone"] and parsed["points"][-1]["peak_bytes"] - parsed["baseline_bytes"] >= 0.9 * 2048 * 64 * 1024
    )


@pytest.mark.parametrize(
    "import_path, message",
    [
        (
            "token_app:NoHook",
            "token_app:NoHook has no calibration_batch(token_sum) method: the token_sum axis runs one batch of each "
            "token sum through it. Add the hook to the deployment class, or calibrate the concurrency axis.",
        ),
        ("token_app:BadHook", "calibration_batch(64) failed: MemoryError: 64 tokens do not fit"),
    ],
)
def test_a_class_without_a_working_hook_cannot_be_calibrated_by_token_sum(fake_app, import_path, message):
    (fake_app / "token_app.py").write_text(TOKEN_APP)
    done = run_job(fake_app, import_path, levels=(64,), axis="token_sum")
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == f"FLEETDECK_CALIBRATION_ERROR {message}"


def test_the_reference_generator_is_calibrated_by_token_sum_outside_serve():
    """The shipped reference app, built in a plain process as a Ray job builds it: no replica, no
    Serve metrics, its own temporaries (64 KiB per token in reference.json) in every batch."""
    from controlplane.local_ray import REFERENCE_APP_DIR

    user_config = next(
        d
        for d in json.loads((REFERENCE_APP_DIR / "reference.json").read_text())["applications"][0]["deployments"]
        if d["name"] == "Generator"
    )["user_config"]
    done = run_job(
        REFERENCE_APP_DIR,
        "reference_app:Generator",
        user_config=user_config,
        levels=(64, 1024),
        axis="token_sum",
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    parsed = parse_output(done.stdout)
    (_, small), (_, large) = [(p["x"], p["peak_bytes"]) for p in parsed["points"]]
    scratch = (1024 - 64) * user_config["scratch_kb_per_token"] * 1024
    assert parsed["monotone"] and large - small >= 0.9 * scratch, parsed


# --- the service against a fake dashboard ------------------------------------------------------


@pytest.fixture
def cluster(team, use_replay):
    cluster = ClusterFactory(name="vision-prod", team=team)
    assert sync.sync_cluster(cluster.pk).ok
    use_replay.routes["/api/jobs/"] = "jobs_submit_response.json"
    use_replay.routes["/api/cluster_status"] = "cluster_status.json"
    use_replay.routes["/nodes"] = "nodes_view_summary.json"
    return Cluster.objects.get(pk=cluster.pk)


@pytest.fixture
def model(cluster) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application__cluster=cluster, application__name="demo", name="Model"
    )


@pytest.fixture
def operator(people):
    return Actor(user=people["operator"], via="test")


def job_says(replay, calibration, status, *, logs="", message="", end=True):
    payload = {
        **ray_fixture("jobs_get_one.json"),
        "submission_id": calibration.submission_id,
        "status": status,
        "message": message,
        "end_time": 1796044014770 if end else None,
    }
    replay.routes[f"/api/jobs/{calibration.submission_id}"] = payload
    replay.routes[f"/api/jobs/{calibration.submission_id}/logs"] = {"logs": logs}


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
    assert done.finished_at == datetime(2026, 11, 30, 13, 6, 54, 770000, tzinfo=dt_timezone.utc)

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


# --- API -----------------------------------------------------------------------------------------


def test_an_operator_calibrates_through_the_api_and_gets_202(api_as, model):
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": model.pk, "levels": [1, 2], "call": "hi"}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "pending" and body["levels"] == [1, 2] and body["request"]["call"] == "hi"
    assert body["per_unit_bytes"] is None


def test_automation_calibrates_by_token_sum_through_the_api(api_as, model):
    operator = api_as("operator")
    response = operator.post(
        "/api/v1/calibrations/", {"deployment": model.pk, "axis": "token_sum", "levels": [512, 2048]}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["axis"] == "token_sum" and response.json()["levels"] == [512, 2048]
    MemoryCalibration.objects.all().delete()
    refused = operator.post("/api/v1/calibrations/", {"deployment": model.pk, "axis": "pixels"}, format="json")
    assert refused.status_code == 400 and "axis" in refused.json()
    too_big = operator.post(
        "/api/v1/calibrations/", {"deployment": model.pk, "axis": "token_sum", "levels": [100_000]}, format="json"
    )
    assert too_big.status_code == 400 and "between 1 and 65,536" in too_big.json()["detail"][0]


def test_a_viewer_cannot_calibrate(api_as, model):
    response = api_as("viewer").post("/api/v1/calibrations/", {"deployment": model.pk}, format="json")
    assert response.status_code == 403 and "operator role" in response.json()["detail"]


def test_an_outsider_sees_no_calibration_and_cannot_request_one(api_as, model, operator):
    services.request_calibration(operator, model)
    assert api_as("outsider").get("/api/v1/calibrations/").json()["count"] == 0
    response = api_as("outsider").post("/api/v1/calibrations/", {"deployment": model.pk}, format="json")
    # Exactly what naming a deployment that does not exist answers.
    assert response.status_code == 400 and response.json() == {
        "deployment": [f'Invalid pk "{model.pk}" - object does not exist.']
    }


def test_service_refusals_come_back_as_400_with_the_reason(api_as, model, operator):
    services.request_calibration(operator, model)
    response = api_as("operator").post("/api/v1/calibrations/", {"deployment": model.pk}, format="json")
    assert response.status_code == 400 and "already running" in response.json()["detail"][0]


def test_the_list_filters_by_deployment_and_cluster_and_shows_the_curve(
    api_as, model, operator, use_replay, other_team
):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    viewer = api_as("viewer")
    listed = viewer.get(f"/api/v1/calibrations/?deployment={model.pk}").json()
    assert listed["count"] == 1 and listed["results"][0]["per_unit_bytes"] == 64 * MIB
    assert listed["results"][0]["points"][0] == {"x": 1, "peak_bytes": 164 * MIB}
    assert viewer.get(f"/api/v1/calibrations/?cluster={model.application.cluster_id + 1}").json()["count"] == 0
    assert viewer.get(f"/api/v1/calibrations/{calibration.pk}/").json()["state"] == "succeeded"


def test_the_list_costs_the_same_queries_for_one_or_many(api_as, model, operator, use_replay):
    def count_queries() -> int:
        client = api_as("viewer")
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/calibrations/").status_code == 200
        return len(queries)

    first = services.request_calibration(operator, model)
    job_says(use_replay, first, "SUCCEEDED", logs=result_line())
    services.poll(first.pk)
    one = count_queries()
    for _ in range(3):
        extra = services.request_calibration(operator, model)
        job_says(use_replay, extra, "SUCCEEDED", logs=result_line())
        services.poll(extra.pk)
    assert count_queries() == one


# --- the deployment card -------------------------------------------------------------------------


@pytest.fixture
def login(client, people):
    def as_(who: str):
        client.force_login(people[who])
        return client

    return as_


def page_of(client, deployment) -> str:
    return client.get(reverse("fleet:deployment", args=[deployment.pk])).content.decode()


def test_the_card_explains_calibration_and_offers_the_form_to_operators_only(login, model):
    page = page_of(login("operator"), model)
    assert "Memory calibration" in page and "compute max_ongoing_requests" in page and "conservative defaults" in page
    assert reverse("calibration:calibrate", args=[model.pk]) in page
    assert reverse("calibration:calibrate", args=[model.pk]) not in page_of(login("viewer"), model)


def test_calibrating_from_the_card_swaps_in_a_card_that_polls(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]), {"levels": "1, 2,4", "call": '"hi"'}, HTTP_HX_REQUEST="true"
    )
    card = response.content.decode()
    assert response.status_code == 200 and 'hx-trigger="every 2s"' in card and "pending" in card
    assert reverse("calibration:calibrate", args=[model.pk]) not in card  # no second form while one runs
    calibration = MemoryCalibration.objects.get()
    assert calibration.levels == [1, 2, 4] and calibration.request["call"] == "hi"


def test_the_form_shows_what_is_wrong(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]), {"levels": "a,b", "call": "hi"}, HTTP_HX_REQUEST="true"
    )
    card = response.content.decode()
    assert "whole numbers separated by commas" in card and "A string needs quotes" in card
    assert not MemoryCalibration.objects.exists()


def test_a_viewer_cannot_calibrate_from_the_page(login, model):
    assert login("viewer").post(reverse("calibration:calibrate", args=[model.pk]), {"levels": "1"}).status_code == 403


def test_the_card_charts_the_latest_curve_and_stops_polling(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line())
    services.poll(calibration.pk)
    card = login("viewer").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in card and 'id="calibration-chart"' in card
    assert '"baseline": 100.0' in card and '{"x": 4.0, "y": 356.0}' in card and "64\xa0MiB" in card


def test_calibrating_by_token_sum_from_the_card_uses_the_axis_defaults_and_says_so(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]),
        {"axis": "token_sum", "levels": "", "call": ""},
        HTTP_HX_REQUEST="true",
    )
    assert "measures peak memory at batch token sums 256, 1024, 4096" in response.content.decode()
    calibration = MemoryCalibration.objects.get()
    assert calibration.axis == "token_sum" and calibration.levels == [256, 1024, 4096]


def test_the_form_judges_levels_by_their_axis(login, model):
    response = login("operator").post(
        reverse("calibration:calibrate", args=[model.pk]),
        {"axis": "concurrency", "levels": "4096"},
        HTTP_HX_REQUEST="true",
    )
    assert "The concurrency levels must be between 1 and 64." in response.content.decode()
    assert not MemoryCalibration.objects.exists()


def test_the_card_charts_a_token_sum_curve_against_the_token_sum(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model, axis="token_sum")
    points = [{"token_sum": 256, "peak_bytes": 116 * MIB}, {"token_sum": 1024, "peak_bytes": 164 * MIB}]
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(axis="token_sum", points=points))
    assert services.poll(calibration.pk).state == "succeeded"
    card = login("viewer").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert '"axis": "token sum per batch"' in card and "per token" in card and '{"x": 1024.0, "y": 164.0}' in card


def test_the_card_shows_a_failure_with_the_log_tail(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(
        use_replay, calibration, "FAILED", logs="oops\nFLEETDECK_CALIBRATION_ERROR it broke\n", message="exit code 1"
    )
    services.poll(calibration.pk)
    page = page_of(login("viewer"), model)
    assert "it broke (Ray: exit code 1)" in page and "End of the job's log" in page and "oops" in page


def test_the_card_fragment_is_only_for_htmx_and_visible_teams(login, model):
    assert login("viewer").get(reverse("calibration:card", args=[model.pk])).status_code == 302
    assert (
        login("outsider").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").status_code == 404
    )


# --- the representative request, resources and the memory budget ---------------------------------

NEW_RESULT = {
    "shape": "starlette",
    "cold_baseline_bytes": 90 * MIB,
    "limit_reason": "concurrency 8 would exceed the memory budget",
    "points": [
        {"concurrency": 1, "peak_bytes": 164 * MIB, "uss_peak_bytes": 150 * MIB, "service_s": 0.5},
        {"concurrency": 2, "peak_bytes": 228 * MIB, "uss_peak_bytes": 214 * MIB, "service_s": 0.6},
    ],
}


def submitted_argv(replay) -> list[str]:
    return shlex.split(json.loads(replay.requests[-1].content)["entrypoint"])


def argument(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def echo_of(model) -> Deployment:
    return Deployment.objects.select_related("application__cluster__team").get(
        application=model.application, name="Echo"
    )


def test_without_a_request_the_ingress_gets_a_get_of_its_route_prefix_and_others_a_bare_handle_call(
    model, operator, use_replay
):
    services.request_calibration(operator, echo_of(model))
    argv = submitted_argv(use_replay)
    assert json.loads(argument(argv, "--request")) == {
        "kind": "http",
        "method": "GET",
        "path": "/demo",
        "query": "",
        "headers": {},
    }
    assert (argument(argv, "--route-prefix"), argument(argv, "--app-name"), argument(argv, "--deployment-name")) == (
        "/demo",
        "demo",
        "Echo",
    )
    MemoryCalibration.objects.all().delete()
    services.request_calibration(operator, model)
    assert json.loads(argument(submitted_argv(use_replay), "--request")) == {"kind": "handle", "args": []}


def test_a_warmup_profile_s_request_is_the_default_for_the_ingress(model, operator, use_replay):
    from apps.maintenance.models import WarmupProfile

    WarmupProfile.objects.create(
        application=model.application,
        name="a-first",
        method="post",
        path="/demo/generate?n=2",
        headers={"x-team": "vision"},
        body={"prompt": "hi"},
    )
    WarmupProfile.objects.create(application=model.application, name="b-second", path="/demo/other")
    calibration = services.request_calibration(operator, echo_of(model))
    assert calibration.request["representative"] == {
        "kind": "http",
        "method": "POST",
        "path": "/demo/generate",
        "query": "n=2",
        "headers": {"x-team": "vision"},
        "json": {"prompt": "hi"},
    }


def test_a_given_http_request_is_normalised_stored_and_sent(model, operator, use_replay):
    request = {
        "kind": "http",
        "method": "post",
        "path": "/demo/generate",
        "query": "?a=1",
        "headers": {"X-Key": "v"},
        "body": "text",
    }
    calibration = services.request_calibration(operator, echo_of(model), request=request)
    expected = {
        "kind": "http",
        "method": "POST",
        "path": "/demo/generate",
        "query": "a=1",
        "headers": {"X-Key": "v"},
        "body": "text",
    }
    assert calibration.request["representative"] == expected
    assert json.loads(argument(submitted_argv(use_replay), "--request")) == expected
    assert AuditEvent.objects.get(action="calibration.request").changes["request"] == expected


@pytest.mark.parametrize(
    "request_, message",
    [
        ("GET /", 'The representative request must be an object with "kind" "http" or "handle".'),
        ({"kind": "grpc"}, 'kind must be "http" or "handle", not'),
        (
            {"kind": "http", "url": "/x"},
            "An http request has no url; it takes body, headers, json, method, path, query.",
        ),
        ({"kind": "http", "method": "BREW"}, "The HTTP method must be one of"),
        ({"kind": "http", "path": "/x?a=1"}, "give the query string apart"),
        ({"kind": "http", "path": "x"}, "The path must start with /"),
        ({"kind": "http", "headers": {"a": 1}}, "The headers must be an object of header names to text values."),
        ({"kind": "http", "headers": {"a": "b\nc"}}, "Header names and values must be single-line ASCII."),
        ({"kind": "http", "body": "x", "json": {}}, "not both"),
        ({"kind": "http", "body": {"a": 1}}, 'The body must be text; give JSON under "json".'),
        ({"kind": "handle", "args": "x"}, "The handle call's args must be a list of JSON values."),
        ({"kind": "handle", "args": ["x" * 20000]}, "at most 16384 fit in the job's command line"),
    ],
)
def test_a_bad_representative_request_is_refused_with_the_reason(model, operator, request_, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        services.request_calibration(operator, model, request=request_)
    assert not MemoryCalibration.objects.exists()


def test_a_request_and_a_call_together_are_refused(model, operator):
    with pytest.raises(ValidationError, match="not both"):
        services.request_calibration(operator, model, call="x", request={"kind": "handle", "args": []})


def test_no_node_with_the_replica_s_cpus_free_refuses_before_submitting(model, operator, use_replay):
    status = ray_fixture("cluster_status.json")
    for usage in [
        status["data"]["clusterStatus"]["loadMetricsReport"]["usage"],
        *status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"].values(),
    ]:
        usage["CPU"] = [1.9, 2.0]
    use_replay.routes["/api/cluster_status"] = status
    with pytest.raises(ValidationError) as refused:
        services.request_calibration(operator, model)
    assert refused.value.messages == [
        "No node of vision-prod has 0.2 CPU free for a calibration replica (1.9 of 2 CPU in use on "
        "192.0.2.2): free some, or calibrate when the cluster is quieter."
    ]
    assert not MemoryCalibration.objects.exists() and not any(r.url.path == "/api/jobs/" for r in use_replay.requests)


def test_a_node_past_ray_s_memory_threshold_refuses_before_submitting(model, operator, use_replay):
    total = 16 * 2**30
    use_replay.routes["/nodes"] = {
        "result": True,
        "msg": "",
        "data": {"summary": [{"ip": "192.0.2.2", "mem": [total, int(total * 0.04), 96.0, int(total * 0.96)]}]},
    }
    with pytest.raises(
        ValidationError,
        match=r"Node 192\.0\.2\.2 of vision-prod already uses 15729 MiB of 16384 MiB, at or past "
        r"Ray's memory threshold \(95%\)",
    ):
        services.request_calibration(operator, model)
    assert not MemoryCalibration.objects.exists()


def test_polling_a_new_result_stores_shape_cold_baseline_limit_reason_and_service_times(model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(**NEW_RESULT))
    done = services.poll(calibration.pk)
    assert done.state == "succeeded" and (done.shape, done.cold_baseline_bytes) == ("starlette", 90 * MIB)
    curve = services.latest_curve(model)
    assert curve.shape == "starlette" and curve.cold_baseline_bytes == 90 * MIB
    assert curve.limit_reason == "concurrency 8 would exceed the memory budget"
    assert curve.service_s == {1.0: 0.5, 2.0: 0.6} and curve.per_unit_bytes == 64 * MIB
    assert done.points[0] == {"x": 1, "peak_bytes": 164 * MIB, "uss_peak_bytes": 150 * MIB, "service_s": 0.5}


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"shape": "grpc"}, "The result's shape is 'grpc'"),
        ({"cold_baseline_bytes": -1}, "cold_baseline_bytes is not a non-negative integer"),
        ({"limit_reason": 5}, "limit_reason is not a sentence"),
        (
            {"points": [{"concurrency": 1, "peak_bytes": 5, "service_s": -1}]},
            "service_s that is not a non-negative number",
        ),
        ({"points": [{"concurrency": 1, "peak_bytes": 5, "uss_peak_bytes": 1.5}]}, "uss_peak_bytes that is not"),
    ],
)
def test_malformed_new_fields_are_refused(overrides, message):
    with pytest.raises(CalibrationOutputError, match=re.escape(message)):
        parse_output(result_line(**overrides))


def test_an_operator_gives_the_representative_request_through_the_api(api_as, model):
    request = {"kind": "http", "method": "POST", "path": "/demo/generate", "json": {"prompt": "hi"}}
    response = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": echo_of(model).pk, "request": request}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["request"]["representative"] == {**request, "query": "", "headers": {}}
    bad = api_as("operator").post(
        "/api/v1/calibrations/", {"deployment": model.pk, "request": {"kind": "ftp"}}, format="json"
    )
    assert bad.status_code == 400 and "kind must be" in bad.content.decode()


def test_the_form_builds_the_http_request_from_its_fields(login, model):
    echo = echo_of(model)
    response = login("operator").post(
        reverse("calibration:calibrate", args=[echo.pk]),
        {
            "method": "POST",
            "path": "/demo/generate",
            "query": "a=1",
            "headers": "Content-Type: application/json\nX-Team: v",
            "body": '{"prompt": "hi"}',
        },
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200 and "pending" in response.content.decode()
    assert MemoryCalibration.objects.get().request["representative"] == {
        "kind": "http",
        "method": "POST",
        "path": "/demo/generate",
        "query": "a=1",
        "headers": {"Content-Type": "application/json", "X-Team": "v"},
        "body": '{"prompt": "hi"}',
    }
    MemoryCalibration.objects.all().delete()
    refused = (
        login("operator")
        .post(
            reverse("calibration:calibrate", args=[echo.pk]),
            {"method": "GET", "headers": "no colon"},
            HTTP_HX_REQUEST="true",
        )
        .content.decode()
    )
    assert "is not `Name: value`" in refused and not MemoryCalibration.objects.exists()


def test_the_card_shows_shape_rest_levels_service_time_and_why_it_stopped(login, model, operator, use_replay):
    calibration = services.request_calibration(operator, model)
    job_says(use_replay, calibration, "SUCCEEDED", logs=result_line(**NEW_RESULT))
    services.poll(calibration.pk)
    card = login("viewer").get(reverse("calibration:card", args=[model.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "Starlette Request handler" in card and "handle call __call__()" in card
    assert "100\xa0MiB" in card  # the warm rest
    assert "90\xa0MiB cold, before any request" in card
    assert "164.0 MiB" in card and "+64.0 MiB" in card and "150.0 MiB" in card and "0.500 s" in card
    assert "Stopped early:" in card and "concurrency 8 would exceed the memory budget" in card
