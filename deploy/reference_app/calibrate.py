"""Measure the reference model's memory peak against the token sum of a batch.

R4 bounds a batch by its token sum; the bound should come from measured memory, not a guess.
This script loads the model as a replica does and runs batches of growing token sums, each made
of requests of `--request-tokens` tokens (half prompt, half generated), with the per-request
temporaries of the `Generator` deployment in a Serve config (`--config`, by default
reference.json beside this file). Run it where the model runs, as a Ray job:

    ray job submit --working-dir deploy/reference_app -- python calibrate.py
    ray job submit --entrypoint-num-gpus 1 --working-dir deploy/reference_app -- python calibrate.py

or as a plain script on Linux: `python deploy/reference_app/calibrate.py --token-sums 64 256`.
The last line it prints is

    FLEETDECK_CALIBRATION {"device": "cpu"|"cuda", "axis": "token_sum", "baseline_bytes": n,
                           "points": [{"token_sum": n, "peak_bytes": n}, ...]}

or, when it fails, `FLEETDECK_CALIBRATION_ERROR <reason>` with exit status 1.

How the peak is measured:
- cuda: torch's allocator keeps exact books. The baseline is what the loaded, warmed model holds;
  a point's peak is `max_memory_allocated` after `reset_peak_memory_stats`, the largest of
  `--repeats` runs.
- cpu: in a long-lived process freed memory stays with the allocator and hides the next peak, so
  every run happens in a fresh process that loads and warms the model, resets the kernel's
  resident high-water mark (/proc/self/clear_refs), runs one batch and reads VmHWM. The baseline
  is the median resident size before the batch; a point's peak is the baseline plus the largest
  rise over `--repeats` runs. The baseline covers the model and torch, not a Ray worker's own
  runtime.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import traceback
from pathlib import Path

import byte_lm
import torch

HERE = Path(__file__).resolve().parent
PROMPT = b"calibrating the memory of a batch against its token sum. "
MARKER = "FLEETDECK_CALIBRATION"
ERROR_MARKER = "FLEETDECK_CALIBRATION_ERROR"


class CalibrationFailed(Exception):
    pass


def temporaries_of(config_path: Path) -> dict:
    """The per-request temporaries the Generator deployment is configured with."""
    config = json.loads(config_path.read_text())
    for app in config.get("applications", []):
        for deployment in app.get("deployments", []):
            if deployment.get("name") == "Generator":
                user_config = deployment.get("user_config") or {}
                return {
                    "kb_per_token": int(user_config.get("scratch_kb_per_token", 0)),
                    "mb_per_request": int(user_config.get("scratch_mb_per_request", 0)),
                }
    raise CalibrationFailed(f"{config_path} has no Generator deployment")


def requests_for(token_sum: int, request_tokens: int) -> list[byte_lm.Request]:
    sizes = [request_tokens] * (token_sum // request_tokens)
    if token_sum % request_tokens:
        sizes.append(token_sum % request_tokens)
    prompt = PROMPT * (request_tokens // len(PROMPT) + 1)
    return [byte_lm.Request(prompt[: size // 2], size - size // 2) for size in sizes]


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise CalibrationFailed(f"/proc/self/status has no {field}; the CPU measurement needs Linux")


def measure_once_on_cpu(token_sum: int, request_tokens: int, temporaries: dict) -> dict:
    model = byte_lm.build_model(torch.device("cpu"))
    byte_lm.warm_up(model)
    requests = requests_for(token_sum, request_tokens)
    gc.collect()
    # "5" resets this process's VmHWM to its current resident size (Linux 4.0 and later).
    Path("/proc/self/clear_refs").write_text("5")
    resident = _status_bytes("VmRSS")
    byte_lm.run_batch(model, requests, **temporaries)
    return {"resident_bytes": resident, "peak_bytes": _status_bytes("VmHWM")}


def calibrate_cpu(args, temporaries: dict) -> tuple[int, list[dict]]:
    # A fixed threshold keeps every large buffer in its own mapping: glibc's dynamic threshold
    # would let a buffer freed during warmup absorb part of the batch and hide it from VmHWM.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    residents: list[int] = []
    rises: dict[int, int] = {}
    for token_sum in args.token_sums:
        for _ in range(args.repeats):
            child = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--measure-once",
                    str(token_sum),
                    "--request-tokens",
                    str(args.request_tokens),
                    "--config",
                    str(args.config),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if child.returncode != 0:
                print(child.stderr, file=sys.stderr)
                reason = (child.stdout.strip().splitlines() or ["no output"])[-1].removeprefix(ERROR_MARKER).strip()
                raise CalibrationFailed(f"measuring {token_sum} tokens failed: {reason}")
            run = json.loads(child.stdout.strip().splitlines()[-1])
            residents.append(run["resident_bytes"])
            rises[token_sum] = max(rises.get(token_sum, 0), run["peak_bytes"] - run["resident_bytes"])
        print(f"cpu: {token_sum} tokens raise the resident peak by {rises[token_sum]} bytes", file=sys.stderr)
    baseline = int(statistics.median(residents))
    return baseline, [{"token_sum": n, "peak_bytes": baseline + rises[n]} for n in args.token_sums]


def calibrate_cuda(args, temporaries: dict) -> tuple[int, list[dict]]:
    device = torch.device("cuda")
    model = byte_lm.build_model(device)
    byte_lm.warm_up(model)
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    points = []
    for token_sum in args.token_sums:
        requests = requests_for(token_sum, args.request_tokens)
        peak = 0
        for _ in range(args.repeats):
            torch.cuda.reset_peak_memory_stats(device)
            byte_lm.run_batch(model, requests, **temporaries)
            torch.cuda.synchronize(device)
            peak = max(peak, torch.cuda.max_memory_allocated(device))
        print(f"cuda: {token_sum} tokens peak at {peak} bytes allocated", file=sys.stderr)
        points.append({"token_sum": token_sum, "peak_bytes": peak})
    return baseline, points


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-sums", type=positive_int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--request-tokens", type=positive_int, default=64, help="tokens per request in a batch")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per point; the largest peak counts")
    parser.add_argument(
        "--config", type=Path, default=HERE / "reference.json", help="Serve config that sets the temporaries"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--measure-once", type=positive_int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    temporaries = temporaries_of(args.config)

    if args.measure_once:
        print(json.dumps(measure_once_on_cpu(args.measure_once, args.request_tokens, temporaries)))
        return
    device = byte_lm.pick_device().type if args.device == "auto" else args.device
    args.token_sums = sorted(set(args.token_sums))
    calibrate = calibrate_cuda if device == "cuda" else calibrate_cpu
    baseline, points = calibrate(args, temporaries)
    result = {"device": device, "axis": "token_sum", "baseline_bytes": baseline, "points": points}
    print(f"{MARKER} {json.dumps(result)}")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # whatever it is, the caller reads it from the last line
        traceback.print_exc()
        print(f"{ERROR_MARKER} {type(exc).__name__}: {exc}")
        sys.exit(1)
