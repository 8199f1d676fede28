"""The sync's reads over asyncio: one worker waits on many dashboards at once, so a hung one holds
a coroutine for its timeout, not a worker process.

Same headers, pinned egress, byte cap, deadline and error messages as `RayDashboard`; it reads
only what a sync reads, as raw bodies (`Observation`)."""

from __future__ import annotations

import httpx

from integrations.egress import AsyncPinnedTransport, Policy
from integrations.ray.dashboard import (
    ACTORS_PATH,
    CLUSTER_STATUS_PATH,
    SERVE_PATH,
    USER_AGENT,
    VERSION_PATH,
    Body,
    checked,
    state_params,
    timed_out,
    tls_context,
    unreachable,
)
from integrations.ray.errors import RayError
from integrations.ray.observation import DEAD_ACTORS, Observation


class AsyncRayDashboard:
    def __init__(
        self,
        base_url: str,
        *,
        token: str = "",
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        policy: Policy | None = None,
    ):
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
            transport=transport or AsyncPinnedTransport(verify=tls_context(), policy=policy),
        )
        self._deadline_s = max(3 * timeout_s, 10.0)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> "AsyncRayDashboard":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _get(self, path: str, params: list[tuple[str, str]] | None = None) -> bytes:
        """The body of a GET whose status Fleetdeck reads; the mapped error otherwise."""
        body = Body(path, "", self._deadline_s)
        try:
            async with self._client.stream("GET", path, params=params) as response:
                async for chunk in response.aiter_bytes():
                    body.add(chunk)
        except httpx.TimeoutException as exc:
            raise timed_out(path, "", exc) from exc
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        return checked(path, body.response(response)).content

    async def observe(self, *, resources: bool = False) -> Observation:
        """Version, Serve status and the dead actors, one after the other on one connection; the
        nodes' resources too when asked. Only the first two must answer for a sync to go on."""
        version = await self._get(VERSION_PATH)
        serve = await self._get(SERVE_PATH)
        try:
            actors = await self._get(ACTORS_PATH, state_params(**DEAD_ACTORS))
        except RayError:
            actors = None
        usage: bytes | RayError | None = None
        if resources:
            try:
                usage = await self._get(CLUSTER_STATUS_PATH)
            except RayError as exc:
                usage = exc
        return Observation(version, serve, actors, usage)
