"""Measure one Serve deployment's memory on its own cluster, as a Ray job, against one of two axes.

Fleetdeck ships this file inline (base64 in the job's entrypoint), so it imports nothing but the
standard library and whatever the deployment itself imports; it never runs inside Fleetdeck.

It imports the deployment class, builds it with no arguments (deployments whose constructor
takes arguments, such as handles to other deployments, cannot be calibrated this way), applies
the user_config through `reconfigure`, takes the process's peak memory as the baseline, then
measures each level in increasing order and records the peak after each:

- `--axis concurrency`: k concurrent calls of `__call__` for each level k.
- `--axis token_sum`: one batch per level through the deployment's calibration hook,

      def calibration_batch(self, token_sum: int) -> None

  which runs ONE batch whose prompt and generated tokens sum to `token_sum`, synchronously and
  without Serve (no batcher, no replica context), holding the same temporaries a served batch of
  that sum holds. It is called on an instance built and reconfigured as above, with sums that may
  exceed the deployment's own batch limit. A class without it cannot be calibrated on this axis.

The peak is a high-water mark (ru_maxrss, or torch's max_memory_allocated on CUDA), hence the
increasing order: each level only shows memory beyond what the earlier ones reached.

The last line it prints is the result, one line of JSON after a marker:
    FLEETDECK_CALIBRATION {"device": "cpu", "axis": "concurrency", "baseline_bytes": N, "points": [...]}
or, when anything fails, `FLEETDECK_CALIBRATION_ERROR <message>` with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import inspect
import json
import resource
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor

MARKER = "FLEETDECK_CALIBRATION"
ERROR_MARKER = "FLEETDECK_CALIBRATION_ERROR"
MIB = 1024 * 1024
AXES = ("concurrency", "token_sum")
HOOK = "calibration_batch"


class CalibrationFailed(Exception):
    pass


def peak_rss_bytes() -> int:
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def load_class(import_path: str) -> type:
    module_name, _, attribute = import_path.partition(":")
    if not module_name or not attribute:
        raise CalibrationFailed(f"import path {import_path!r} is not 'module:Class'")
    module = importlib.import_module(module_name)
    target = getattr(module, attribute, None)
    if target is None:
        # Serve names a deployment after its class unless given a name, so the deployment may be
        # bound to another attribute: look for a Serve Deployment object carrying that name.
        target = next(
            (value for value in vars(module).values()
             if hasattr(value, "func_or_class") and getattr(value, "name", None) == attribute),
            None,
        )
    if target is None:
        raise CalibrationFailed(f"module {module_name!r} has no deployment or class named {attribute!r}")
    target = getattr(target, "func_or_class", target)
    if not inspect.isclass(target):
        raise CalibrationFailed(f"{import_path} is a function deployment; calibration needs a class with __call__")
    return target


def _cuda_torch():
    """torch, when the deployment imported it and a GPU is visible; None otherwise. Importing
    torch here for a deployment that does not use it would only add to its baseline."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch
    return None


class Caller:
    """Runs the measured call: k at once on one event loop for coroutine functions, in threads
    otherwise; `run` makes one call and awaits it if it returns an awaitable."""

    def __init__(self, call, args: tuple):
        self.loop = asyncio.new_event_loop()
        # Deployments that look up "the" event loop (asyncio.get_event_loop) must find this one.
        asyncio.set_event_loop(self.loop)
        self.call = call
        self.args = args
        self.is_async = inspect.iscoroutinefunction(self.call)

    async def _one(self):
        return await self.call(*self.args)

    async def _gather(self, k: int) -> list:
        # Each call inside its own coroutine, so a bad signature fails like any other call.
        return await asyncio.gather(*(self._one() for _ in range(k)), return_exceptions=True)

    def run(self, function, *args):
        result = function(*args)
        if inspect.isawaitable(result):
            result = self.loop.run_until_complete(result)
        return result

    def concurrently(self, k: int) -> list:
        if self.is_async:
            return self.loop.run_until_complete(self._gather(k))
        with ThreadPoolExecutor(max_workers=k) as pool:
            futures = [pool.submit(self.call, *self.args) for _ in range(k)]
        return [future.exception() or future.result() for future in futures]


def calibrate(import_path: str, user_config, call_args: tuple, levels: list[int], axis: str = "concurrency") -> dict:
    cls = load_class(import_path)
    if axis == "token_sum" and not callable(getattr(cls, HOOK, None)):
        raise CalibrationFailed(
            f"{import_path} has no {HOOK}(token_sum) method: the token_sum axis runs one batch of each token sum "
            "through it. Add the hook to the deployment class, or calibrate the concurrency axis."
        )
    instance = cls()
    caller = Caller(getattr(instance, HOOK) if axis == "token_sum" else instance.__call__, call_args)
    if user_config is not None and hasattr(instance, "reconfigure"):
        caller.run(instance.reconfigure, user_config)
    torch = _cuda_torch()
    gc.collect()
    if torch is not None:
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = peak_rss_bytes()
    print(f"baseline: {baseline / MIB:.1f} MiB on {'cuda' if torch else 'cpu'}", flush=True)
    points = []
    for level in levels:
        gc.collect()
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()
        if axis == "token_sum":
            try:
                caller.run(caller.call, level)
            except Exception as exc:
                raise CalibrationFailed(f"{HOOK}({level}) failed: {type(exc).__name__}: {exc}") from exc
        else:
            results = caller.concurrently(level)
            failures = [result for result in results if isinstance(result, BaseException)]
            if failures:
                first = failures[0]
                raise CalibrationFailed(f"{len(failures)} of {level} calls failed at concurrency {level}: {type(first).__name__}: {first}")
        point = {axis: level}
        if torch is not None:
            torch.cuda.synchronize()
            point.update(peak_bytes=torch.cuda.max_memory_allocated(), rss_peak_bytes=peak_rss_bytes())
        else:
            point["peak_bytes"] = peak_rss_bytes()
        points.append(point)
        print(f"{axis} {level}: peak {point['peak_bytes'] / MIB:.1f} MiB", flush=True)
    return {"device": "cuda" if torch else "cpu", "axis": axis, "baseline_bytes": baseline, "points": points}


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise CalibrationFailed(f"levels must be integers separated by commas, not {text!r}") from exc
    if not levels or any(k < 1 for k in levels) or levels != sorted(set(levels)):
        raise CalibrationFailed(f"levels must be increasing positive integers, not {text!r}")
    return levels


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # Bad arguments must end in the error line too, not in argparse's exit code 2.
        raise CalibrationFailed(message)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="fleetdeck_calibrate")
    parser.add_argument("--import-path", required=True, help="module:Class of the deployment")
    parser.add_argument("--user-config", default="null", help="JSON given to reconfigure()")
    parser.add_argument("--call", default=None, help="JSON value passed as __call__'s one argument; absent: no argument")
    parser.add_argument("--axis", choices=AXES, default="concurrency", help="what the levels count")
    parser.add_argument("--levels", default="1,2,4", help="concurrency levels or token sums, increasing")
    try:
        args = parser.parse_args(argv)
        user_config = json.loads(args.user_config)
        call_args = () if args.call is None else (json.loads(args.call),)
        result = calibrate(args.import_path, user_config, call_args, parse_levels(args.levels), args.axis)
    except Exception as exc:  # noqa: BLE001 - every failure must end in the error line
        traceback.print_exc()
        message = " ".join((str(exc) if isinstance(exc, CalibrationFailed) else f"{type(exc).__name__}: {exc}").split())
        print(f"{ERROR_MARKER} {message}", flush=True)
        return 1
    print(f"{MARKER} {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
