"""Measure one Serve deployment's memory on its own cluster, as a Ray job, against one of two axes.

Fleetdeck ships this file inline (base64 in the job's entrypoint), so it imports nothing but the
standard library, starlette (every Serve install has it) and whatever the deployment itself
imports; it never runs inside Fleetdeck.

It builds ONE instance of the deployment's class in this process, as a replica builds it (an
async constructor awaited, the replica context set, an ASGI app's lifespan started), applies the
user_config through `reconfigure`, and drives it through the app's own interface, by shape:

- `starlette`: `__call__(request)` gets a real `starlette.requests.Request` built from the
  representative HTTP request; a returned Response is rendered as Serve renders it, and its
  status counts (>= 400 is a failed call).
- `asgi`: an `@serve.ingress` class (FastAPI or any ASGI app) is called with a real ASGI scope,
  receive and send; the status it sends counts.
- `handle`: `__call__(*args)` with the JSON arguments of a handle call.
- `hook` (`--axis token_sum`): one batch per level through the deployment's calibration hook,

      def calibration_batch(self, token_sum: int) -> None

  which runs ONE batch whose prompt and generated tokens sum to `token_sum`, synchronously and
  without Serve, holding the same temporaries a served batch of that sum holds.

Memory: a sampler thread reads this process's RSS and USS every SAMPLE_S, and the kernel's own
high-water mark (VmHWM, reset through /proc/self/clear_refs before each level) catches peaks
shorter than a sample. Each level's peak is therefore its own, not the highest so far. On CUDA
the peak is torch's max_memory_allocated, reset per level.

The baseline is the replica at rest once warm: after one request, since allocators keep the
pages a request used; the cold one (before any request) is reported beside it.

A weighted mix (`--mix`) replaces the one request: each of its requests is called once to warm
the replica (the baseline is then a replica that served them all), and each is measured on its
own at every level, so the control plane gets each one's increment and spread. A request that
fails, or that alone would cross the budget, is named and ends the run with nothing measured.

Budget: the run never crosses the lower of `--stop-at-bytes` and Ray's own kill threshold
(RAY_memory_usage_threshold x MemTotal), less a margin. A level whose predicted peak would cross
it is not run, and the sampler ends the process at once if node usage crosses it mid-level, so a
calibration cannot cause the OOM kill it is meant to prevent.

The last line it prints is the result, one line of JSON after a marker:
    FLEETDECK_CALIBRATION {"device": "cpu", "axis": "concurrency", "shape": "starlette", "baseline_bytes": N,
                           "cold_baseline_bytes": N, "points": [...], "limit_reason": null}
or, when anything fails, `FLEETDECK_CALIBRATION_ERROR <message>` with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import inspect
import itertools
import json
import os
import re
import statistics
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

MARKER = "FLEETDECK_CALIBRATION"
# The representative request's headers, as JSON: they may carry credentials, so they come in the
# job's environment rather than on its command line, which anyone on the node can read.
HEADERS_VAR = "FLEETDECK_CALIBRATION_HEADERS"
ERROR_MARKER = "FLEETDECK_CALIBRATION_ERROR"
MIB = 1024 * 1024
AXES = ("concurrency", "token_sum")
SHAPES = ("starlette", "asgi", "handle", "hook")
HOOK = "calibration_batch"
SAMPLE_S = 0.01
RAY_THRESHOLD_VAR = "RAY_memory_usage_threshold"
RAY_DEFAULT_THRESHOLD = 0.95
# Rounds of each level: three peaks give a spread (max - min) without tripling a long calibration again.
REPEATS = 3
# Room left below the stop for what moves between two samples (the allocator grows in steps).
MIN_MARGIN_BYTES = 64 * MIB
MARGIN_FRACTION = 0.01


class CalibrationFailed(Exception):
    pass


# --- memory readings -----------------------------------------------------------------------------


def _kib_fields(path: str) -> dict[str, int]:
    fields = {}
    with open(path) as file:
        for line in file:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * 1024
    return fields


def rss_bytes() -> int:
    return _kib_fields("/proc/self/status")["VmRSS"]


def hwm_bytes() -> int:
    return _kib_fields("/proc/self/status")["VmHWM"]


def uss_bytes() -> int | None:
    try:
        fields = _kib_fields("/proc/self/smaps_rollup")
    except OSError:
        return None
    return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def reset_hwm() -> bool:
    """Set VmHWM back to the current RSS; False where the kernel does not let this process."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def node_memory() -> tuple[int, int]:
    """(total, used) of this node, used as Ray's memory monitor counts it: total - available."""
    fields = _kib_fields("/proc/meminfo")
    return fields["MemTotal"], fields["MemTotal"] - fields["MemAvailable"]


def stop_bytes(stop_at: int | None, total: int) -> int:
    """Node usage this run must stay below: the caller's budget or Ray's kill threshold, whichever
    is lower, less a margin."""
    try:
        threshold = float(os.environ.get(RAY_THRESHOLD_VAR, RAY_DEFAULT_THRESHOLD))
    except ValueError:
        threshold = RAY_DEFAULT_THRESHOLD
    limit = int(threshold * total)
    if stop_at is not None:
        limit = min(limit, stop_at)
    return limit - max(MIN_MARGIN_BYTES, int(MARGIN_FRACTION * total))


class Sampler(threading.Thread):
    """Samples RSS, USS and node usage; calls `on_breach(node_used)` once when node usage crosses
    `stop`. A thread, not the event loop: it must keep sampling while a request holds the loop."""

    def __init__(self, stop: int, on_breach):
        super().__init__(name="fleetdeck-sampler", daemon=True)
        self.stop, self.on_breach = stop, on_breach
        self.lock = threading.Lock()
        self.rss_peak = self.uss_peak = 0
        self.breached = False
        self.halt = threading.Event()

    def reset(self) -> None:
        with self.lock:
            self.rss_peak, self.uss_peak = rss_bytes(), uss_bytes() or 0

    def peaks(self) -> tuple[int, int | None]:
        self.sample()
        with self.lock:
            return self.rss_peak, self.uss_peak or None

    def sample(self) -> None:
        rss, uss = rss_bytes(), uss_bytes()
        with self.lock:
            self.rss_peak = max(self.rss_peak, rss)
            self.uss_peak = max(self.uss_peak, uss or 0)
        _, used = node_memory()
        if used > self.stop and not self.breached:
            self.breached = True
            self.on_breach(used)

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            self.sample()


def _cuda_torch():
    """torch, when the deployment imported it and a GPU is visible; None otherwise. Importing
    torch here for a deployment that does not use it would only add to its baseline."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch
    return None


# --- the deployment ------------------------------------------------------------------------------


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
            (
                value
                for value in vars(module).values()
                if hasattr(value, "func_or_class") and getattr(value, "name", None) == attribute
            ),
            None,
        )
    if target is None:
        raise CalibrationFailed(f"module {module_name!r} has no deployment or class named {attribute!r}")
    target = getattr(target, "func_or_class", target)
    if not inspect.isclass(target):
        raise CalibrationFailed(f"{import_path} is a function deployment; calibration needs a class with __call__")
    return target


def is_asgi_ingress(cls: type) -> bool:
    # By name, so a handle-called class does not pay for importing Serve's HTTP machinery.
    return any(base.__name__ == "ASGIAppReplicaWrapper" for base in cls.__mro__)


def _set_replica_context(servable, app_name: str, deployment_name: str) -> None:
    """What a replica sets before and after building its class: FastAPI class-based views find
    `self` through it, and deployments may read their names from it. Private Serve API, so a
    Serve that changed it only loses those, with a note in the log."""
    serve_context = sys.modules.get("ray.serve.context")
    if serve_context is None:
        return
    try:
        from ray.serve._private.common import DeploymentID, ReplicaID
        from ray.serve._private.config import DeploymentConfig

        serve_context._set_internal_replica_context(
            replica_id=ReplicaID(
                unique_id="fleetdeck-calibration", deployment_id=DeploymentID(name=deployment_name, app_name=app_name)
            ),
            servable_object=servable,
            _deployment_config=DeploymentConfig(),
            rank=None,
            world_size=1,
        )
    except (ImportError, TypeError, AttributeError) as exc:
        print(f"note: no Serve replica context for the instance ({type(exc).__name__}: {exc})", flush=True)


async def build(cls: type, app_name: str, deployment_name: str):
    """One instance, built as Serve's replica builds it: `__init__` may be a coroutine (it is for
    every @serve.ingress class), and an ASGI app needs its lifespan started."""
    _set_replica_context(None, app_name, deployment_name)
    instance = cls.__new__(cls)
    started = cls.__init__(instance)
    if inspect.isawaitable(started):
        await started
    _set_replica_context(instance, app_name, deployment_name)
    if is_asgi_ingress(cls):
        build_app = getattr(instance, "__serve_build_asgi_app__", None)
        if not hasattr(instance, "_asgi_app") and build_app is not None:
            app = build_app()
            instance._set_asgi_app(await app if inspect.isawaitable(app) else app)
        await instance._run_asgi_lifespan_startup()
    return instance


# --- requests ------------------------------------------------------------------------------------


class CallFailed(Exception):
    """A call that answered an HTTP error status; the message is the status."""


# An observed mix's requests carry their size as {pad:N} (N bytes of "x") or {words:N} (N words, a
# token each in common tokenizers), expanded here once per driver: the job's command line stays small.
PAD_MARK = re.compile(r"\{(pad|words):(\d{1,9})\}")


def describe(request: dict) -> str:
    if request.get("kind") == "http":
        query = request.get("query") or ""
        line = f"{request.get('method', 'GET').upper()} {request.get('path', '/')}{'?' + query if query else ''}"
        # An observed mix's requests differ by their body's filler: say how much each carries.
        body = json.dumps(request["json"]) if "json" in request else str(request.get("body") or "")
        fillers = [f"{int(n):,} {'words' if kind == 'words' else 'bytes'}" for kind, n in PAD_MARK.findall(body)]
        return f"{line} with {' + '.join(fillers)} of filler" if fillers else line
    args = ", ".join(json.dumps(arg) for arg in request.get("args") or [])
    return f"handle call __call__({args[:200]})"


CALL_NUMBER = "{n}"


def padded(text: str) -> str:
    return PAD_MARK.sub(lambda m: "x" * int(m[2]) if m[1] == "pad" else " ".join(["word"] * int(m[2])), text)


def numbered(text: str, n: int) -> str:
    """The request's text with `{n}` replaced by the call's number, so an app that caches its
    answers (by prompt, by URL) computes each one instead of serving the first from its cache."""
    return text.replace(CALL_NUMBER, str(n))


class HttpRequest:
    """The representative HTTP request, as Serve's proxy hands it to a replica: a fresh ASGI scope
    and receive per call, the body in one message, then a client that stays connected."""

    def __init__(self, request: dict, route_prefix: str):
        self.method = str(request.get("method") or "GET").upper()
        self.path = str(request.get("path") or "/")
        self.query = padded(str(request.get("query") or ""))
        self.headers = {str(k).lower(): str(v) for k, v in (request.get("headers") or {}).items()}
        if "json" in request:
            self.body = padded(json.dumps(request["json"]))
            self.headers.setdefault("content-type", "application/json")
        else:
            self.body = padded(str(request.get("body") or ""))
        self.headers.setdefault("host", "127.0.0.1:8000")
        self.root_path = "" if route_prefix in ("", "/") else route_prefix.rstrip("/")

    def call(self, n: int):
        """The scope and receive of call number `n`."""
        body = numbered(self.body, n).encode()
        headers = {**self.headers, **({"content-length": str(len(body))} if body else {})}
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": self.method,
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": self.root_path,
            "query_string": numbered(self.query, n).encode("latin-1"),
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        sent = False

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()

        return scope, receive


class StatusSend:
    def __init__(self):
        self.status: int | None = None

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])


def _check_status(status: int | None) -> None:
    if status is not None and status >= 400:
        raise CallFailed(f"answered {status}")


class Driver:
    """Makes the calls of one shape on one event loop; sync methods run in threads, as Serve runs
    them, so k of them are really in flight at once."""

    def __init__(self, shape: str, instance, request: dict, route_prefix: str, numbers=None):
        self.shape, self.instance = shape, instance
        self.http = HttpRequest(request, route_prefix) if request.get("kind") == "http" else None
        self.args = padded(json.dumps(list(request.get("args") or [])))
        # Shared by the drivers of a mix, so no two of its calls get the same {n}.
        self.numbers = numbers if numbers is not None else itertools.count()
        self.pool: ThreadPoolExecutor | None = None

    async def _maybe_in_thread(self, function, *args):
        if inspect.iscoroutinefunction(function):
            return await function(*args)
        result = await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)
        return await result if inspect.isawaitable(result) else result

    async def call(self, level: int) -> None:
        n = next(self.numbers)
        if self.shape == "hook":
            await self._maybe_in_thread(getattr(self.instance, HOOK), level)
        elif self.shape == "handle":
            await self._maybe_in_thread(self.instance.__call__, *json.loads(numbered(self.args, n)))
        elif self.shape == "asgi":
            send = StatusSend()
            await self.instance(*self.http.call(n), send)
            _check_status(send.status)
        else:
            from starlette.requests import Request
            from starlette.responses import Response

            scope, receive = self.http.call(n)
            result = await self._maybe_in_thread(self.instance.__call__, Request(scope, receive))
            if isinstance(result, Response):
                # Serve renders the response inside the replica: a streamed body's memory counts.
                send = StatusSend()
                await result(scope, receive, send)
                _check_status(send.status)

    async def _timed(self, level: int) -> float:
        started = time.perf_counter()
        await self.call(level)
        return time.perf_counter() - started

    async def level(self, k: int, x: int) -> list:
        """k calls at once; each one's seconds, or its exception."""
        self.pool = ThreadPoolExecutor(max_workers=k)
        try:
            return await asyncio.gather(*(self._timed(x) for _ in range(k)), return_exceptions=True)
        finally:
            self.pool.shutdown(wait=True)


def shape_of(cls: type, axis: str, request: dict) -> str:
    if axis == "token_sum":
        return "hook"
    if is_asgi_ingress(cls):
        if request.get("kind") != "http":
            raise CalibrationFailed(
                f"{cls.__name__} is an ASGI (@serve.ingress) app: it is calibrated with an HTTP request, "
                "not a handle call."
            )
        return "asgi"
    return "starlette" if request.get("kind") == "http" else "handle"


# --- the run -------------------------------------------------------------------------------------


class Calibration:
    def __init__(
        self,
        import_path: str,
        user_config,
        request: dict,
        levels: list[int],
        axis: str,
        stop_at: int | None,
        route_prefix: str,
        app_name: str,
        deployment_name: str,
        mix: list[dict] | None = None,
    ):
        self.import_path, self.user_config, self.request = import_path, user_config, request
        # A weighted mix: [{"request", "share"}, ...], each request measured at every level on its own.
        self.mix = mix
        self.entry: int | None = None
        self.warming = False
        self.levels, self.axis, self.route_prefix = levels, axis, route_prefix
        self.app_name, self.deployment_name = app_name, deployment_name or import_path.partition(":")[2]
        total, _ = node_memory()
        self.stop = stop_bytes(stop_at, total)
        self.hwm_resets = reset_hwm()
        self.sampler = Sampler(self.stop, self._breached)
        self.torch = None
        self.shape = "handle"
        self.result: dict = {}
        self.running: str = "construction"

    # What measures the level's peak: the kernel's high-water mark where it can be reset, and the
    # sampler always (USS has no kernel high-water mark).
    def _start_peak(self) -> None:
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        reset_hwm()
        self.sampler.reset()

    def _host_peaks(self) -> tuple[int, int | None]:
        rss_peak, uss_peak = self.sampler.peaks()
        if self.hwm_resets:
            rss_peak = max(rss_peak, hwm_bytes())
        return rss_peak, uss_peak

    def _breached(self, used: int) -> None:
        """Node usage crossed the stop mid-run: report what was measured and leave before Ray's
        memory monitor kills anything. A mix with a request not yet measured is no result: sizing
        would miss that request."""
        reason = (
            f"Node memory reached {used / MIB:.0f} MiB during {self.running}, past the stop at {self.stop / MIB:.0f} "
            "MiB; the run ended there."
        )
        entries = self.result.get("mix") or []
        missing = [f"mix[{i}]" for i, e in enumerate(entries) if not e["points"]]
        # Before the first request of the mix (building the class) nothing was measured, as for one request.
        if self.mix is not None and self.entry is not None and (self.warming or not entries or missing):
            if self.warming or not entries:
                why = f"{self._entry_name()} alone exceeds the memory budget"
            elif not entries[self.entry]["points"]:
                why = f"{self._entry_name()} has no level within the budget"
            else:
                why = f"{', '.join(missing)} could not be measured after it"
            print(
                f"{ERROR_MARKER} {reason} {why}, so the mix is not calibrated; nothing was pushed.",
                flush=True,
            )
            os._exit(1)
        if self.result.get("points"):
            self.result["limit_reason"] = reason
            print(f"{MARKER} {json.dumps(self.result)}", flush=True)
            os._exit(0)
        print(f"{ERROR_MARKER} {reason} Nothing was measured.", flush=True)
        os._exit(1)

    def run(self) -> dict:
        cls = load_class(self.import_path)
        if self.axis == "token_sum" and not callable(getattr(cls, HOOK, None)):
            raise CalibrationFailed(
                f"{self.import_path} has no {HOOK}(token_sum) method: the token_sum axis runs one batch of each token "
                "sum through it. Add the hook to the deployment class, or calibrate the concurrency axis."
            )
        self.shape = shape_of(cls, self.axis, self.request)
        if self.mix is not None and any(shape_of(cls, self.axis, e["request"]) != self.shape for e in self.mix):
            raise CalibrationFailed("The requests of a mix must all be HTTP requests or all handle calls.")
        self.sampler.start()
        try:
            return self._run(cls)
        finally:
            self.sampler.halt.set()

    def _run(self, cls: type) -> dict:
        loop = asyncio.new_event_loop()
        # Deployments that look up "the" event loop (asyncio.get_event_loop) must find this one.
        asyncio.set_event_loop(loop)
        try:
            instance = loop.run_until_complete(build(cls, self.app_name, self.deployment_name))
        except Exception as exc:  # every failure must end in the error line
            raise CalibrationFailed(f"{self.import_path} could not be built: {type(exc).__name__}: {exc}") from exc
        if self.user_config is not None and hasattr(instance, "reconfigure"):
            self.running = "reconfigure"
            done = instance.reconfigure(self.user_config)
            if inspect.isawaitable(done):
                loop.run_until_complete(done)
        self.torch = _cuda_torch()
        if self.mix is not None:
            numbers = itertools.count()
            drivers = [Driver(self.shape, instance, e["request"], self.route_prefix, numbers) for e in self.mix]
            return self._measure_mix(loop, drivers)
        return self._measure(loop, Driver(self.shape, instance, self.request, self.route_prefix))

    def _resting(self) -> int:
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.synchronize()
            return self.torch.cuda.memory_allocated()
        return rss_bytes()

    def _what(self, x: int) -> str:
        if self.shape == "hook":
            return f"{HOOK}({x})"
        return f"concurrency {x}" + (f" of {self._entry_name()}" if self.entry is not None else "")

    def _entry_name(self) -> str:
        return f"mix[{self.entry}] ({describe(self.mix[self.entry]['request'])})"

    def _run_level(self, loop, driver: Driver, x: int, request: dict | None = None) -> list[float]:
        k = 1 if self.shape == "hook" else x
        self.running = self._what(x)
        outcomes = loop.run_until_complete(driver.level(k, x))
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            first = failures[0]
            if self.shape == "hook":
                raise CalibrationFailed(f"{HOOK}({x}) failed: {type(first).__name__}: {first}") from first
            what = describe(request or self.request)
            said = str(first) if isinstance(first, CallFailed) else f"{type(first).__name__}: {first}"
            raise CalibrationFailed(
                f"{len(failures)} of {k} calls of {what} failed at concurrency {k}: {said}"
            ) from first
        return outcomes

    def _warm_call(self, loop, driver: Driver, warm_x: int, request: dict, name: str) -> None:
        """The first call, not a level: what fails here is the request itself."""
        try:
            self._run_level(loop, driver, warm_x, request)
        except CalibrationFailed as exc:
            first = exc.__cause__
            if self.shape != "hook" and isinstance(first, CallFailed):
                raise CalibrationFailed(
                    f"{name} {first} at concurrency 1: give a request the deployment serves. Nothing was measured."
                ) from exc
            if self.shape != "hook":
                raise CalibrationFailed(
                    f"{name} failed at concurrency 1: {type(first).__name__}: {first}. Nothing was measured."
                ) from exc
            raise

    def _measure(self, loop, driver: Driver) -> dict:
        cold = self._resting()
        host_cold = rss_bytes()
        warm_x = self.levels[0] if self.shape == "hook" else 1
        self._start_peak()
        self._warm_call(loop, driver, warm_x, self.request, f"The representative request {describe(self.request)}")
        warm_peak, _ = self._host_peaks()
        baseline = self._resting()
        host_baseline = rss_bytes()
        device = "cuda" if self.torch is not None else "cpu"
        print(
            f"shape {self.shape}; at rest {cold / MIB:.1f} MiB cold, {baseline / MIB:.1f} MiB warm on {device}",
            flush=True,
        )
        self.result = self._result(device, baseline, cold, [])
        # Host memory per unit of the axis at worst so far; the warm call gives the first estimate.
        step = max(warm_peak - min(host_baseline, host_cold), 0) / warm_x
        self.result["limit_reason"] = self._levels(loop, driver, step, host_baseline, self.result["points"])
        return self.result

    def _measure_mix(self, loop, drivers: list[Driver]) -> dict:
        """Each request of the mix warmed once (the replica then rests as one that served them all),
        then measured at every level on its own, so its increment and spread are its own."""
        cold = self._resting()
        host_cold = rss_bytes()
        steps = []
        for index, driver in enumerate(drivers):
            self.entry, self.warming = index, True
            self._start_peak()
            before = rss_bytes()
            self._warm_call(loop, driver, 1, self.mix[index]["request"], self._entry_name())
            self.warming = False
            warm_peak, _ = self._host_peaks()
            steps.append(max(warm_peak - min(before, host_cold), 0))
        baseline = self._resting()
        host_baseline = rss_bytes()
        device = "cuda" if self.torch is not None else "cpu"
        print(f"mix of {len(drivers)}; at rest {cold / MIB:.1f} MiB cold, {baseline / MIB:.1f} MiB warm", flush=True)
        entries = [
            {"label": describe(e["request"])[:300], "share": e["share"], "points": [], "limit_reason": None}
            for e in self.mix
        ]
        typical = max(range(len(entries)), key=lambda i: (entries[i]["share"], -i))
        # The levels of the largest share stand for the curve; sizing reads each request's own.
        self.result = {**self._result(device, baseline, cold, entries[typical]["points"]), "mix": entries}
        for index, driver in enumerate(drivers):
            self.entry = index
            entries[index]["limit_reason"] = self._levels(
                loop, driver, steps[index], host_baseline, entries[index]["points"], self.mix[index]["request"]
            )
        reasons = [e["limit_reason"] for e in entries if e["limit_reason"]]
        self.result["limit_reason"] = "; ".join(reasons)[:2000] if reasons else None
        return self.result

    def _result(self, device: str, baseline: int, cold: int, points: list) -> dict:
        return {
            "device": device,
            "axis": self.axis,
            "shape": self.shape,
            "baseline_bytes": baseline,
            "cold_baseline_bytes": cold,
            "points": points,
            "limit_reason": None,
        }

    def _levels(
        self, loop, driver: Driver, step: float, host_baseline: int, points: list, request: dict | None = None
    ) -> str | None:
        """Run the levels into `points` until one would cross the stop; why it stopped, or None."""
        knots = [(0, host_baseline)]
        for x in self.levels:
            _, used = node_memory()
            predicted = used - rss_bytes() + host_baseline + x * step
            if predicted > self.stop:
                reason = (
                    f"{self._what(x)} would exceed the memory budget: about {predicted / MIB:.0f} MiB used on the node "
                    f"({step / MIB:.1f} MiB per {'token' if self.shape == 'hook' else 'request'}) against a stop at "
                    f"{self.stop / MIB:.0f} MiB"
                )
                if not points:
                    if self.entry is not None:
                        raise CalibrationFailed(
                            f"{reason}: {self._entry_name()} has no level within the budget, so the mix is not "
                            "calibrated; nothing was pushed."
                        )
                    raise CalibrationFailed(f"{reason}; nothing was pushed.")
                limit = f"{reason}; the larger levels were not run."
                print(limit, flush=True)
                return limit
            # Each level runs REPEATS times: the spread of its peaks is what the memory budget's margin is
            # sized from, and what a replica keeps at rest afterwards is the allocator's retention.
            samples, seconds, uss_peak, rss_peak = [], [], None, 0
            for _ in range(REPEATS):
                self._start_peak()
                seconds += self._run_level(loop, driver, x, request)
                round_rss, round_uss = self._host_peaks()
                if self.torch is not None:
                    self.torch.cuda.synchronize()
                    samples.append(self.torch.cuda.max_memory_allocated())
                else:
                    samples.append(round_rss)
                rss_peak = max(rss_peak, round_rss)
                uss_peak = max(uss_peak or 0, round_uss) if round_uss is not None else uss_peak
            point = {
                self.axis: x,
                "peak_bytes": max(samples),
                "peak_samples": samples,
                "rest_after_bytes": self._resting(),
                "uss_peak_bytes": uss_peak,
                "service_s": round(statistics.median(seconds), 6),
            }
            if self.torch is not None:
                point["rss_peak_bytes"] = rss_peak
            points.append(point)
            knots.append((x, rss_peak))
            step = max(step, (knots[-1][1] - knots[-2][1]) / (knots[-1][0] - knots[-2][0]))
            print(
                f"{self._what(x)}: peak {point['peak_bytes'] / MIB:.1f} MiB, {point['service_s']:.3f} s per request",
                flush=True,
            )
        return None


def calibrate(
    import_path: str,
    user_config,
    request: dict,
    levels: list[int],
    axis: str = "concurrency",
    *,
    stop_at: int | None = None,
    route_prefix: str = "/",
    app_name: str = "",
    deployment_name: str = "",
    mix: list[dict] | None = None,
) -> dict:
    return Calibration(
        import_path, user_config, request, levels, axis, stop_at, route_prefix, app_name, deployment_name, mix
    ).run()


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise CalibrationFailed(f"levels must be integers separated by commas, not {text!r}") from exc
    if not levels or any(k < 1 for k in levels) or levels != sorted(set(levels)):
        raise CalibrationFailed(f"levels must be increasing positive integers, not {text!r}")
    return levels


def parse_request(text: str | None, call: str | None) -> dict:
    if text is None:
        return {"kind": "handle", "args": [] if call is None else [json.loads(call)]}
    if call is not None:
        raise CalibrationFailed("give --request or --call, not both")
    request = json.loads(text)
    if not isinstance(request, dict) or request.get("kind") not in ("http", "handle"):
        raise CalibrationFailed('--request must be a JSON object with "kind" "http" or "handle"')
    headers = os.environ.get(HEADERS_VAR)
    if headers and request["kind"] == "http":
        request["headers"] = {**(request.get("headers") or {}), **json.loads(headers)}
    return request


def parse_mix(text: str | None) -> list[dict] | None:
    """The weighted mix, [{"request", "share"}, ...]; the headers of each request come apart, as a
    list in the environment, in the mix's order."""
    if text is None:
        return None
    mix = json.loads(text)
    if not isinstance(mix, list) or not mix or not all(isinstance(e, dict) for e in mix):
        raise CalibrationFailed('--mix must be a JSON list of {"request", "share"} objects')
    headers = json.loads(os.environ.get(HEADERS_VAR) or "[]")
    entries = []
    for index, entry in enumerate(mix):
        request = entry.get("request")
        if not isinstance(request, dict) or request.get("kind") not in ("http", "handle"):
            raise CalibrationFailed(f'mix[{index}].request must be a JSON object with "kind" "http" or "handle"')
        if isinstance(headers, list) and index < len(headers) and headers[index] and request["kind"] == "http":
            request = {**request, "headers": {**(request.get("headers") or {}), **headers[index]}}
        entries.append({"request": request, "share": float(entry.get("share") or 0)})
    return entries


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # Bad arguments must end in the error line too, not in argparse's exit code 2.
        raise CalibrationFailed(message)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="fleetdeck_calibrate")
    parser.add_argument("--import-path", required=True, help="module:Class of the deployment")
    parser.add_argument("--user-config", default="null", help="JSON given to reconfigure()")
    parser.add_argument(
        "--request",
        default=None,
        help='the representative request, JSON: {"kind": "http", "method", "path", '
        '"query", "headers", "body" or "json"} or {"kind": "handle", "args": [...]}',
    )
    parser.add_argument(
        "--mix",
        default=None,
        help='a weighted mix instead of one request, JSON: [{"request": {...}, "share": percent}, ...]',
    )
    parser.add_argument("--call", default=None, help="JSON value passed as __call__'s one argument (a handle call)")
    parser.add_argument("--axis", choices=AXES, default="concurrency", help="what the levels count")
    parser.add_argument("--levels", default="1,2,4", help="concurrency levels or token sums, increasing")
    parser.add_argument("--stop-at-bytes", type=int, default=None, help="node memory use this run must not cross")
    parser.add_argument("--route-prefix", default="/", help="the application's route prefix (the ASGI root_path)")
    parser.add_argument("--app-name", default="", help="the application, for the replica context")
    parser.add_argument("--deployment-name", default="", help="the deployment, for the replica context")
    try:
        args = parser.parse_args(argv)
        mix = parse_mix(args.mix)
        if mix is not None and (args.request is not None or args.call is not None):
            raise CalibrationFailed("give --mix or --request (or --call), not both")
        result = calibrate(
            args.import_path,
            json.loads(args.user_config),
            max(mix, key=lambda e: e["share"])["request"] if mix else parse_request(args.request, args.call),
            parse_levels(args.levels),
            args.axis,
            stop_at=args.stop_at_bytes,
            route_prefix=args.route_prefix,
            app_name=args.app_name,
            deployment_name=args.deployment_name,
            mix=mix,
        )
    except Exception as exc:
        traceback.print_exc()
        message = " ".join((str(exc) if isinstance(exc, CalibrationFailed) else f"{type(exc).__name__}: {exc}").split())
        print(f"{ERROR_MARKER} {message}", flush=True)
        return 1
    print(f"{MARKER} {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
