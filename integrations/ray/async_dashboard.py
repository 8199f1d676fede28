"""The sync's reads over asyncio: one worker waits on many dashboards at once, so a hung one holds
a coroutine for its timeout, not a worker process.

The same headers, pinned egress, byte cap, deadline and error messages as `RayDashboard`, for
only what a sync reads, as raw bodies (`Observation`). It sends through the transport itself:
with a thousand dashboards in flight, httpx's client layers (and one client per dashboard, since
a shared connection pool scans all its connections for every request) cost more CPU than the reads."""

from __future__ import annotations

import importlib.util
import sys

import httpx

from integrations.egress import AsyncPinnedTransport, Policy
from integrations.ray.dashboard import (
    ACTORS_PATH,
    CLUSTER_STATUS_PATH,
    SERVE_PATH,
    USER_AGENT,
    VERSION_PATH,
    Body,
    QueryParams,
    checked,
    state_params,
    timed_out,
    tls_context,
    unreachable,
)
from integrations.ray.errors import RayError
from integrations.ray.observation import DEAD_ACTORS, Observation

# httpcore imports sniffio for every lock it makes, and a module that is not installed is searched
# for on disk every time (a third of the CPU of a read); None in sys.modules refuses it at once.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]  # None is the import system's "refuse"


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
        self._base_url = base_url.rstrip("/")
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = dict.fromkeys(("connect", "read", "write", "pool"), timeout_s)
        self._transport = transport or AsyncPinnedTransport(verify=tls_context(), policy=policy)
        self._deadline_s = max(3 * timeout_s, 10.0)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncRayDashboard:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def observe(self, *, resources: bool = False, expected_digest: str = "") -> Observation:
        """The Serve status and the dead actors, the version, and the nodes' resources when asked,
        one after the other on one connection. Only the Serve status and the version must answer
        for a sync to go on. When the first two match `expected_digest` (the last applied sync's),
        the version is not asked: nothing is new, and a restart would have changed the Serve status."""
        version = None if expected_digest else await self._get(VERSION_PATH)
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
        observed = Observation(version, serve, actors, usage)
        if version is None and observed.digest != expected_digest:
            observed = Observation(await self._get(VERSION_PATH), serve, actors, usage)
        return observed

    async def _get(self, path: str, params: QueryParams | None = None) -> bytes:
        """The body of a GET whose status Fleetdeck reads; the mapped error otherwise."""
        request = httpx.Request(
            "GET", self._base_url + path, params=params, headers=self._headers, extensions={"timeout": self._timeout}
        )
        body = Body(path, "", self._deadline_s)
        try:
            response = await self._transport.handle_async_request(request)
            try:
                async for chunk in response.aiter_bytes():
                    body.add(chunk)
            finally:
                await response.aclose()
        except httpx.TimeoutException as exc:
            raise timed_out(path, "", exc) from exc
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        response.request = request
        return checked(path, body.response(response)).content
