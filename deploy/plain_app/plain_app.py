"""An ordinary Serve application written as in Ray's documentation, with no Fleetdeck hook.

It stands for a user's own service: Fleetdeck must calibrate, size and verify it through its own
interface only. Each request fills and holds a scratch buffer while it works, as a model server's
activations do, so memory grows with the requests a replica holds at once. Sizes come from
environment variables (set through the application's `runtime_env.env_vars`), not from any
Fleetdeck-specific setting:

- `PLAIN_ALLOC_MB` (default 256): MiB a request fills;
- `PLAIN_HOLD_S` (default 1.0): seconds it holds them, awaiting (other requests run meanwhile);
- `PLAIN_BASE_MB` (default 64): MiB the replica allocates once at start, standing for its model;
- `PLAIN_MB_PER_KB` (default 0): MiB `PlainAPI` fills on top for each KiB of the prompt, as a model's
  activations grow with its input.

`PlainAPI` also exports the size of each prompt it gets as a histogram, `plain_prompt_bytes`, the
way Ray's documentation exports an application's own metric (`ray.serve.metrics.Histogram`).

Three shapes, one per way Serve calls a deployment:
- `app`: `Plain`, a Starlette `Request` handler (`?mb=` may ask for less or more per request);
- `fastapi_app`: `PlainAPI`, a FastAPI `@serve.ingress` app with `POST /generate` taking JSON;
- `handle_app`: `Front` (HTTP) calling `Worker` through a deployment handle with plain arguments.
"""

from __future__ import annotations

import asyncio
import os

from fastapi import FastAPI
from ray import serve
from ray.serve import metrics
from starlette.requests import Request
from starlette.responses import JSONResponse

MIB = 1024 * 1024


def _setting(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _fill(mb: float) -> bytearray:
    # Filled, not just reserved: untouched pages would never count against the node's memory.
    return bytearray(b"\x01") * int(mb * MIB)


class _Work:
    def __init__(self) -> None:
        self.model = _fill(_setting("PLAIN_BASE_MB", 64))
        self.alloc_mb = _setting("PLAIN_ALLOC_MB", 256)
        self.hold_s = _setting("PLAIN_HOLD_S", 1.0)

    async def work(self, mb: float | None = None) -> dict:
        scratch = _fill(self.alloc_mb if mb is None else mb)
        await asyncio.sleep(self.hold_s)
        return {"scratch_mb": len(scratch) // MIB, "pid": os.getpid()}


@serve.deployment
class Plain(_Work):
    async def __call__(self, request: Request) -> JSONResponse:
        mb = request.query_params.get("mb")
        if mb is not None and not mb.replace(".", "", 1).isdigit():
            return JSONResponse({"error": "mb must be a number"}, status_code=422)
        return JSONResponse(await self.work(float(mb) if mb is not None else None))


api = FastAPI()


@serve.deployment
@serve.ingress(api)
class PlainAPI(_Work):
    def __init__(self) -> None:
        super().__init__()
        self.mb_per_kb = _setting("PLAIN_MB_PER_KB", 0)
        self.prompt_bytes = metrics.Histogram(
            "plain_prompt_bytes",
            description="Bytes of each prompt received.",
            boundaries=[256, 1024, 4096, 16384, 65536],
        )

    @api.post("/generate")
    async def generate(self, body: dict) -> dict:
        prompt = str(body.get("prompt", ""))
        size = len(prompt.encode())
        self.prompt_bytes.observe(size)
        mb = self.alloc_mb + self.mb_per_kb * size / 1024 if self.mb_per_kb else None
        return {"prompt_chars": len(prompt), **await self.work(mb)}

    @api.get("/healthz")
    def healthz(self) -> dict:
        return {"ok": True}


@serve.deployment
class Worker(_Work):
    async def __call__(self, text: str) -> dict:
        return {"chars": len(text), **await self.work()}


@serve.deployment
class Front:
    def __init__(self, worker) -> None:
        self.worker = worker

    async def __call__(self, request: Request) -> dict:
        return await self.worker.remote(request.query_params.get("text", ""))


app = Plain.bind()
fastapi_app = PlainAPI.bind()
handle_app = Front.bind(Worker.bind())
