"""Outbound connections that cannot be talked into the wrong address.

Every adapter's HTTP client connects through `PinnedTransport`: it resolves the request's host
once, refuses it when any resolved address is one Fleetdeck never calls (link-local, cloud
metadata) or the network allow-list does not cover, and then connects to the very address it checked.
Checking a name and letting the client resolve it again would leave a window for DNS rebinding:
a name that answers a public address to the check and 169.254.169.254 to the connection.

Which addresses are allowed is the clusters app's decision (apps/clusters/network_policy.py): it
registers where the policy in force comes from with `use_policy`, and a client may be given one.

Every answer is also read under a byte cap and a total deadline (`use_limits`): httpx's timeouts
bound each read, not the whole answer, so a server that sends a byte every few seconds, or never
stops sending, would otherwise hold the worker that every team's syncs share."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import httpx


class Policy(Protocol):
    def refusal(self, host: str, raw_address: str) -> str | None:
        """Why `host`, resolved to `raw_address`, may not be called; None when it may."""


_current_policy: Callable[[], Policy] | None = None


def use_policy(current: Callable[[], Policy]) -> None:
    """Where a transport built without a policy reads the one in force."""
    global _current_policy
    _current_policy = current


def current_policy() -> Policy:
    if _current_policy is None:
        # Fail closed: without a policy no destination has been vetted.
        raise RuntimeError("No network policy is registered: nothing may be called.")
    return _current_policy()


class EgressRefused(httpx.TransportError):
    """The network policy forbids this destination; nothing was sent."""


@dataclass(frozen=True)
class Limits:
    """How much of one answer is read, and for how long, from the request's start to its last byte."""

    max_bytes: int = 64 * 2**20
    deadline_s: float = 60.0


_limits = Limits()


def use_limits(limits: Limits) -> None:
    """The limits every transport built afterwards reads answers under (the settings' ones)."""
    global _limits
    _limits = limits


def current_limits() -> Limits:
    return _limits


class AnswerTooLarge(httpx.RemoteProtocolError):
    """The answer passed the byte cap: what was read is dropped, the connection closed."""


class AnswerTooSlow(httpx.ReadTimeout):
    """The answer was still arriving at the deadline, however steadily its bytes came."""


class _Bounded:
    """An answer's body, read under `limits` from `started` (monotonic seconds)."""

    def __init__(self, stream, host: str, limits: Limits, started: float):
        self.stream, self.host, self.limits = stream, host, limits
        self.deadline_at = started + limits.deadline_s
        self.seen = 0

    def check(self, chunk: bytes) -> bytes:
        self.seen += len(chunk)
        if self.seen > self.limits.max_bytes:
            raise AnswerTooLarge(
                f"{self.host} answered more than {_size(self.limits.max_bytes)}, the most Fleetdeck reads of one "
                "answer (FLEETDECK_OUTBOUND_MAX_BYTES)"
            )
        if time.monotonic() > self.deadline_at:
            raise AnswerTooSlow(
                f"{self.host} was still answering after {self.limits.deadline_s:g} s, the longest Fleetdeck waits "
                "for one answer (FLEETDECK_OUTBOUND_DEADLINE_S)"
            )
        return chunk


class _BoundedStream(_Bounded, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.stream:
            yield self.check(chunk)

    def close(self) -> None:
        self.stream.close()


class _AsyncBoundedStream(_Bounded, httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            yield self.check(chunk)

    async def aclose(self) -> None:
        await self.stream.aclose()


def _size(count: int) -> str:
    return f"{count // 2**20} MiB" if count >= 2**20 else f"{count} bytes"


def _too_large(response: httpx.Response, host: str, limits: Limits) -> AnswerTooLarge | None:
    """The refusal of an answer whose announced length is past the cap, before a byte of it is read."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        return AnswerTooLarge(
            f"{host} announced {_size(int(declared))}, more than the {_size(limits.max_bytes)} Fleetdeck reads of "
            "one answer (FLEETDECK_OUTBOUND_MAX_BYTES)"
        )
    return None


class PinnedTransport(httpx.BaseTransport):
    def __init__(
        self,
        *,
        verify=True,
        inner: httpx.BaseTransport | None = None,
        policy: Policy | None = None,
        limits: Limits | None = None,
    ):
        self.inner = inner or httpx.HTTPTransport(verify=verify)
        # Read now, in the thread that builds the client: requests may come from worker threads.
        self.policy = policy or current_policy()
        self.limits = limits or current_limits()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.monotonic()
        host, port = _host_port(request)
        addresses = allowed_addresses(host, port, self.policy)
        original, extensions = request.url, request.extensions
        for index, address in enumerate(addresses):
            _pin(request, original, extensions, host, address)
            try:
                response = self.inner.handle_request(request)
            except httpx.ConnectError:
                # Like any client, try the next address of the name (::1 then 127.0.0.1); all were checked.
                if index == len(addresses) - 1:
                    raise
                continue
            refusal = _too_large(response, host, self.limits)
            if refusal is not None:
                response.close()
                raise refusal
            response.stream = _BoundedStream(response.stream, host, self.limits, started)
            return response
        raise httpx.ConnectError(f"the host {host!r} has no address")

    def close(self) -> None:
        self.inner.close()


class AsyncPinnedTransport(httpx.AsyncBaseTransport):
    """`PinnedTransport` for `httpx.AsyncClient`: the same checks, and names resolve off the event loop."""

    def __init__(
        self,
        *,
        verify=True,
        inner: httpx.AsyncBaseTransport | None = None,
        policy: Policy | None = None,
        limits: Limits | None = None,
    ):
        self.inner = inner or httpx.AsyncHTTPTransport(verify=verify)
        self.policy = policy or current_policy()
        self.limits = limits or current_limits()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.monotonic()
        host, port = _host_port(request)
        addresses = await async_allowed_addresses(host, port, self.policy)
        original, extensions = request.url, request.extensions
        for index, address in enumerate(addresses):
            _pin(request, original, extensions, host, address)
            try:
                response = await self.inner.handle_async_request(request)
            except httpx.ConnectError:
                if index == len(addresses) - 1:
                    raise
                continue
            refusal = _too_large(response, host, self.limits)
            if refusal is not None:
                await response.aclose()
                raise refusal
            response.stream = _AsyncBoundedStream(response.stream, host, self.limits, started)
            return response
        raise httpx.ConnectError(f"the host {host!r} has no address")

    async def aclose(self) -> None:
        await self.inner.aclose()


def _host_port(request: httpx.Request) -> tuple[str, int]:
    return request.url.host, request.url.port or (443 if request.url.scheme == "https" else 80)


def _pin(request: httpx.Request, original: httpx.URL, extensions: dict, host: str, address: str) -> None:
    if address != host:
        # The Host header already names the host; TLS verifies the certificate against it too.
        request.url = original.copy_with(host=address)
        request.extensions = {**extensions, "sni_hostname": host}


def allowed_addresses(host: str, port: int, policy: Policy) -> list[str]:
    """The addresses to connect to for `host`: every address it resolves to must be allowed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise httpx.ConnectError(f"the host {host!r} cannot be resolved") from exc
    return _vetted(host, infos, policy)


async def async_allowed_addresses(host: str, port: int, policy: Policy) -> list[str]:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return allowed_addresses(host, port, policy)  # a literal resolves without a lookup
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise httpx.ConnectError(f"the host {host!r} cannot be resolved") from exc
    return _vetted(host, infos, policy)


def _vetted(host: str, infos, policy: Policy) -> list[str]:
    addresses = list(dict.fromkeys(info[4][0].split("%")[0] for info in infos))
    for address in addresses:
        reason = policy.refusal(host, address)
        if reason:
            raise EgressRefused(reason)
    return addresses
