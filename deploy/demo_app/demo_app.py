"""A small Serve application for the local demo cluster and the integration tests.

`Echo` is a light ingress; `Model` stands in for a model server: it holds a configurable amount of
memory per request for a configurable time (via user_config), which is how later features
reproduce memory pressure without a GPU.
"""

from __future__ import annotations

import asyncio
import os
import time

from ray import serve
from starlette.requests import Request


@serve.deployment
class Model:
    def __init__(self) -> None:
        self.alloc_mb = 0
        self.hold_s = 0.0
        self.started_at = time.time()

    def reconfigure(self, config: dict) -> None:
        self.alloc_mb = int(config.get("alloc_mb", 0))
        self.hold_s = float(config.get("hold_s", 0.0))

    async def __call__(self, text: str) -> dict:
        # Filled, not just reserved: untouched pages would never count against the node's memory.
        scratch = bytearray(b"\x01") * (self.alloc_mb * 1024 * 1024) if self.alloc_mb else b""
        if self.hold_s:
            await asyncio.sleep(self.hold_s)
        return {"length": len(text), "scratch_mb": len(scratch) // (1024 * 1024), "pid": os.getpid()}


@serve.deployment
class Echo:
    def __init__(self, model=None) -> None:
        self.model = model
        self.greeting = "hello"

    def reconfigure(self, config: dict) -> None:
        self.greeting = str(config.get("greeting", "hello"))

    async def __call__(self, request: Request) -> dict:
        if request.query_params.get("fail"):
            # Lets warmup tests see a route that answers 500.
            raise ValueError("failure requested with ?fail=1")
        text = request.query_params.get("text", "")
        answer = {"greeting": self.greeting, "echo": text}
        if self.model is not None:
            answer["model"] = await self.model.remote(text)
        return answer


app = Echo.bind(Model.bind())
echo_only = Echo.bind()
