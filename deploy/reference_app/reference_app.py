"""The reference Serve application: a heavy deployment that behaves well.

`Generator` serves the byte-level model of `byte_lm` with the code-level remedies of the
operations playbook: input caps at the edge (R3), batches bounded by their token sum rather than
their request count (R4), small JSON responses (R5), a warmup inference before the replica takes
traffic (R6) and a response cache bounded by size and age (R7). It reports its own memory peaks
(`GET <route>/stats` and Ray metrics) so that findings and calibrations have numbers to use.

Every limit lives in the user_config. Setting the limits to null and the temporaries high turns
the same code into the misbehaving deployment of `misbehaving.json`, which reproduces OOM kills
(OOM-1, OOM-2) and latency spikes on demand; switching between the two is a plain config change.

    POST <route>      {"prompt": "...", "max_tokens": 32}
                      -> {"text", "prompt_tokens", "completion_tokens", "cached"}
    GET  <route>/stats

`Generator.calibration_batch(token_sum)` is Fleetdeck's calibration hook: a calibration job builds
the class outside Serve, applies the user_config and calls it with rising token sums to measure
the memory peak of one batch against its token sum, which sizes `max_batch_tokens`.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, fields

import byte_lm
import torch
from cachetools import TTLCache
from ray import serve
from ray.serve import metrics
from ray.serve.exceptions import RayServeException
from starlette.requests import Request
from starlette.responses import JSONResponse

DEFAULT_MAX_TOKENS = 32
# JSON may spend up to six characters on one byte of the prompt ("\u0001"); the rest of the
# body is a few short fields.
BODY_BYTES_PER_PROMPT_TOKEN = 6
BODY_OVERHEAD_BYTES = 1024
# Calibration batches are made of requests this long (calibrate.py's default): short requests put
# many in a batch of a given sum, so the per-request temporaries count as fully as they can.
CALIBRATION_REQUEST_TOKENS = 64
CALIBRATION_PROMPT = b"calibrating the memory of a batch against its token sum. "


@dataclass(frozen=True)
class Settings:
    """The deployment's user_config. A limit of None means no limit (the misbehaving mode)."""

    max_prompt_tokens: int | None = 512
    max_tokens_cap: int | None = 128
    max_batch_tokens: int | None = 1024
    batch_wait_timeout_s: float = 0.01
    cache_max_entries: int = 256
    cache_ttl_s: float = 300.0
    scratch_kb_per_token: int = 0
    scratch_mb_per_request: int = 0

    @classmethod
    def from_user_config(cls, config: dict) -> Settings:
        """Refuse what would silently do something else: a misspelt key would leave a limit at
        its default and nobody would be told."""
        known = {field.name for field in fields(cls)}
        if unknown := sorted(set(config) - known):
            raise ValueError(f"unknown user_config keys {unknown}; known keys: {sorted(known)}")
        settings = cls(**config)
        for name in ("max_prompt_tokens", "max_tokens_cap", "max_batch_tokens"):
            value = getattr(settings, name)
            if value is not None and not (_is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a positive integer or null, not {value!r}")
        for name in ("scratch_kb_per_token", "scratch_mb_per_request"):
            if not (_is_int(getattr(settings, name)) and getattr(settings, name) >= 0):
                raise ValueError(f"{name} must be a non-negative integer")
        if not (_is_int(settings.cache_max_entries) and settings.cache_max_entries >= 1):
            raise ValueError("cache_max_entries must be a positive integer: every cache is bounded")
        if not (_is_number(settings.cache_ttl_s) and settings.cache_ttl_s > 0):
            raise ValueError("cache_ttl_s must be a positive number of seconds")
        if not (_is_number(settings.batch_wait_timeout_s) and settings.batch_wait_timeout_s >= 0):
            raise ValueError("batch_wait_timeout_s must be a non-negative number of seconds")
        return settings

    @property
    def max_body_bytes(self) -> int | None:
        if self.max_prompt_tokens is None:
            return None
        return self.max_prompt_tokens * BODY_BYTES_PER_PROMPT_TOKEN + BODY_OVERHEAD_BYTES


DEFAULTS = Settings()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return _is_int(value) or isinstance(value, float)


class Rejected(Exception):
    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail

    def response(self) -> JSONResponse:
        return error_response(self.status, self.error, self.detail)


def error_response(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def parse_request(body: bytes, settings: Settings) -> byte_lm.Request:
    """Everything a request may ask for is checked here, before it can cost memory."""
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise Rejected(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise Rejected(400, "invalid_request", "the body must be a JSON object")
    if unknown := sorted(set(payload) - {"prompt", "max_tokens"}):
        raise Rejected(400, "invalid_request", f"unknown fields {unknown}; send prompt and max_tokens")
    prompt = payload.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise Rejected(400, "invalid_request", "prompt must be a non-empty string")
    max_tokens = payload.get("max_tokens", min(DEFAULT_MAX_TOKENS, settings.max_tokens_cap or DEFAULT_MAX_TOKENS))
    if not _is_int(max_tokens):
        raise Rejected(400, "invalid_request", "max_tokens must be an integer")
    try:
        # The model's tokens are the prompt's UTF-8 bytes, so the cap counts bytes.
        encoded = prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise Rejected(400, "invalid_request", "prompt is not valid Unicode") from None

    if settings.max_prompt_tokens is not None and len(encoded) > settings.max_prompt_tokens:
        raise Rejected(
            413,
            "prompt_too_long",
            f"prompt is {len(encoded)} tokens (UTF-8 bytes); the limit is {settings.max_prompt_tokens}",
        )
    if max_tokens < 1:
        raise Rejected(422, "max_tokens_out_of_range", "max_tokens must be at least 1")
    if settings.max_tokens_cap is not None and max_tokens > settings.max_tokens_cap:
        raise Rejected(
            422, "max_tokens_too_large", f"max_tokens is {max_tokens}; the limit is {settings.max_tokens_cap}"
        )
    request = byte_lm.Request(encoded, max_tokens)
    # Serve's batcher fails a request larger than a whole batch with a RuntimeError (a 500);
    # that is the client's doing, so it is answered as such.
    if settings.max_batch_tokens is not None and request.tokens > settings.max_batch_tokens:
        raise Rejected(
            413,
            "request_too_large",
            f"prompt and max_tokens need {request.tokens} tokens; a batch holds at most {settings.max_batch_tokens}",
        )
    return request


async def read_body(request: Request, limit: int | None) -> bytes:
    """Read the body in chunks and stop at the limit, so an oversized upload is refused
    before it is held in memory."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if limit is not None and len(body) > limit:
            raise Rejected(413, "body_too_large", f"the request body exceeds {limit} bytes")
    return bytes(body)


def memory_usage(device: torch.device) -> dict:
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return {
        # Linux reports ru_maxrss in KiB.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_bytes": resident_pages * os.sysconf("SC_PAGE_SIZE"),
        "gpu_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def new_batch_stats() -> dict:
    return {"count": 0, "largest_token_sum": 0, "largest_size": 0}


def calibration_requests(token_sum: int, settings: Settings) -> list[byte_lm.Request]:
    """Requests whose tokens sum to `token_sum`, each one as the edge would accept it: half
    prompt, half generated, within max_prompt_tokens and max_tokens_cap."""
    if not (_is_int(token_sum) and token_sum >= 1):
        raise ValueError(f"token_sum must be a positive integer, not {token_sum!r}")
    prompt_cap = settings.max_prompt_tokens or sys.maxsize
    generated_cap = settings.max_tokens_cap or sys.maxsize
    size = min(CALIBRATION_REQUEST_TOKENS, prompt_cap + generated_cap)
    sizes = [size] * (token_sum // size) + ([token_sum % size] if token_sum % size else [])
    requests = []
    for tokens in sizes:
        generated = min(tokens - tokens // 2, generated_cap)
        prompt = min(tokens - generated, prompt_cap)
        generated = tokens - prompt
        text = CALIBRATION_PROMPT * (prompt // len(CALIBRATION_PROMPT) + 1)
        requests.append(byte_lm.Request(text[:prompt], generated))
    return requests


def replica_gauges() -> dict[str, metrics.Gauge]:
    """The replica's memory and batch gauges. Outside a Serve replica (a calibration job) there
    are none: Serve could not tag the series with a deployment and replica, and a calibration
    run's figures published as this deployment's would mislead whoever reads them."""
    try:
        serve.get_replica_context()
    except RayServeException:
        return {}
    return {
        name: metrics.Gauge(f"reference_app_{name}", description=description)
        for name, description in (
            ("peak_rss_bytes", "Peak resident memory of the replica process."),
            ("rss_bytes", "Resident memory of the replica process."),
            ("gpu_peak_bytes", "Peak GPU memory allocated by torch in the replica."),
            ("largest_batch_token_sum", "Largest token sum of a batch the replica ran."),
            ("cache_entries", "Entries in the replica's response cache."),
        )
    }


@serve.deployment
class Generator:
    def __init__(self) -> None:
        self.device = byte_lm.pick_device()
        self.model = byte_lm.build_model(self.device)
        self.settings = DEFAULTS
        self.cache: TTLCache = TTLCache(maxsize=DEFAULTS.cache_max_entries, ttl=DEFAULTS.cache_ttl_s)
        self.counts = {"total": 0, "generated": 0, "cache_hits": 0, "rejected": 0}
        self.batches = new_batch_stats()
        self.gauges = replica_gauges()
        # Serve only routes traffic to a replica once its constructor has returned, so the
        # first real request finds the kernels, allocator pools and code paths already warm.
        started = time.perf_counter()
        byte_lm.warm_up(self.model)
        self.warmup_s = time.perf_counter() - started
        self.observe()

    def reconfigure(self, user_config: dict) -> None:
        settings = Settings.from_user_config(user_config)
        # With a batch_size_fn the batch size counts tokens. Ray logs a warning when it exceeds
        # max_ongoing_requests, which only holds for request counts; it does not apply here.
        self._generate_batch.set_max_batch_size(settings.max_batch_tokens or sys.maxsize)
        self._generate_batch.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)
        if (settings.cache_max_entries, settings.cache_ttl_s) != (self.cache.maxsize, self.cache.ttl):
            self.cache = TTLCache(maxsize=settings.cache_max_entries, ttl=settings.cache_ttl_s)
        self.settings = settings
        # Batch figures are checked against the limits in force, so they start over with them.
        self.batches = new_batch_stats()

    async def __call__(self, request: Request) -> JSONResponse:
        path = request.url.path.removeprefix(request.scope.get("root_path", "")).rstrip("/")
        if path == "/stats" and request.method == "GET":
            return JSONResponse(self.stats())
        if path == "" and request.method == "POST":
            self.counts["total"] += 1
            try:
                return await self.generate(request)
            except Rejected as rejected:
                self.counts["rejected"] += 1
                return rejected.response()
        return error_response(404, "not_found", "POST a prompt to the route, or GET <route>/stats")

    async def generate(self, request: Request) -> JSONResponse:
        settings = self.settings
        parsed = parse_request(await read_body(request, settings.max_body_bytes), settings)
        key = (parsed.prompt, parsed.max_tokens)
        text = self.cache.get(key)
        cached = text is not None
        if cached:
            self.counts["cache_hits"] += 1
        else:
            text = await self._generate_batch(parsed)
            self.cache[key] = text
        return JSONResponse(
            {"text": text, "prompt_tokens": len(parsed.prompt), "completion_tokens": len(text), "cached": cached}
        )

    @serve.batch(
        max_batch_size=DEFAULTS.max_batch_tokens,
        batch_wait_timeout_s=DEFAULTS.batch_wait_timeout_s,
        batch_size_fn=byte_lm.batch_token_sum,
    )
    async def _generate_batch(self, requests: list[byte_lm.Request]) -> list[str]:
        settings = self.settings
        token_sum = byte_lm.batch_token_sum(requests)
        # Recorded before the run, so a batch that never finishes (OOM) still shows.
        self.batches["count"] += 1
        self.batches["largest_token_sum"] = max(self.batches["largest_token_sum"], token_sum)
        self.batches["largest_size"] = max(self.batches["largest_size"], len(requests))
        # Off the event loop: a CPU-bound forward pass in the handler would stall every other
        # request and health check of this replica (LAT-3).
        outputs = await asyncio.to_thread(
            byte_lm.run_batch,
            self.model,
            requests,
            kb_per_token=settings.scratch_kb_per_token,
            mb_per_request=settings.scratch_mb_per_request,
        )
        self.counts["generated"] += len(requests)
        self.observe()
        return [output.decode("ascii") for output in outputs]

    def calibration_batch(self, token_sum: int) -> None:
        """Fleetdeck's calibration hook: run one batch of `token_sum` tokens now, synchronously
        and without Serve's batcher, holding the same temporaries as a served batch of that sum.
        Sums above max_batch_tokens are allowed: calibration measures past the current limit."""
        settings = self.settings
        byte_lm.run_batch(
            self.model,
            calibration_requests(token_sum, settings),
            kb_per_token=settings.scratch_kb_per_token,
            mb_per_request=settings.scratch_mb_per_request,
        )

    def observe(self) -> dict:
        memory = memory_usage(self.device)
        self.cache.expire()
        values = {
            **memory,
            "largest_batch_token_sum": self.batches["largest_token_sum"],
            "cache_entries": len(self.cache),
        }
        for name, gauge in self.gauges.items():
            if values[name] is not None:
                gauge.set(values[name])
        return memory

    def stats(self) -> dict:
        memory = self.observe()
        return {
            "pid": os.getpid(),
            "device": self.device.type,
            "warmup_s": round(self.warmup_s, 4),
            "settings": asdict(self.settings),
            "requests": dict(self.counts),
            "batches": dict(self.batches),
            "cache": {"entries": len(self.cache), "max_entries": self.cache.maxsize, "ttl_s": self.cache.ttl},
            "memory": memory,
        }


app = Generator.bind()
