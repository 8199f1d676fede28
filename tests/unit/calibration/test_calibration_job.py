"""The calibration job script, run for real in a subprocess on small fake applications."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import pytest

from apps.calibration import job_spec
from apps.calibration.curve import parse_output
from tests.unit.calibration.helpers import MIB

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
    from apps.demo.local_ray import REFERENCE_APP_DIR

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
