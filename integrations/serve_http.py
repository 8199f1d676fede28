"""Client of a cluster's Serve HTTP proxy: the only code that sends traffic to applications."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from integrations.egress import Limits, PinnedTransport, current_limits

USER_AGENT = "fleetdeck-warmup/1"


@dataclass(frozen=True)
class Sample:
    index: int
    status: int | None  # None: no response (timeout, refused)
    latency_ms: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def send(
    base_url: str, *, method: str, path: str, headers: dict, body, requests: int, concurrency: int, timeout_s: float
) -> list[Sample]:
    """The first request alone (the cold one), then the rest `concurrency` at a time."""
    with httpx.Client(
        base_url=base_url,
        timeout=timeout_s,
        follow_redirects=False,
        trust_env=False,
        # A generation may stream for as long as the operator's timeout allows, not the default deadline.
        transport=PinnedTransport(
            limits=Limits(current_limits().max_bytes, max(timeout_s, current_limits().deadline_s))
        ),
        headers={"User-Agent": USER_AGENT, **headers},
    ) as client:

        def one(index: int) -> Sample:
            started = time.perf_counter()
            try:
                response = client.request(method, path, json=body) if body is not None else client.request(method, path)
                return Sample(index, response.status_code, (time.perf_counter() - started) * 1000)
            except httpx.TimeoutException:
                return Sample(index, None, (time.perf_counter() - started) * 1000, "timeout")
            except httpx.TransportError as exc:
                return Sample(index, None, (time.perf_counter() - started) * 1000, str(exc) or exc.__class__.__name__)

        samples = [one(0)]
        if requests > 1:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                samples += list(pool.map(one, range(1, requests)))
    return samples
