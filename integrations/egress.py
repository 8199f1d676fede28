"""Outbound connections that cannot be talked into the wrong address.

Every adapter's HTTP client connects through `PinnedTransport`: it resolves the request's host
once, refuses it when any resolved address is one Fleetdeck never calls (link-local, cloud
metadata) or the network allow-list does not cover, and then connects to the very address it checked.
Checking a name and letting the client resolve it again would leave a window for DNS rebinding:
a name that answers a public address to the check and 169.254.169.254 to the connection.

Which addresses are allowed is the clusters app's decision (apps/clusters/network_policy.py): it
registers where the policy in force comes from with `use_policy`, and a client may be given one."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Callable, Protocol

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


class PinnedTransport(httpx.BaseTransport):
    def __init__(self, *, verify=True, inner: httpx.BaseTransport | None = None, policy: Policy | None = None):
        self.inner = inner or httpx.HTTPTransport(verify=verify)
        # Read now, in the thread that builds the client: requests may come from worker threads.
        self.policy = policy or current_policy()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host, port = _host_port(request)
        addresses = allowed_addresses(host, port, self.policy)
        original, extensions = request.url, request.extensions
        for index, address in enumerate(addresses):
            _pin(request, original, extensions, host, address)
            try:
                return self.inner.handle_request(request)
            except httpx.ConnectError:
                # Like any client, try the next address of the name (::1 then 127.0.0.1); all were checked.
                if index == len(addresses) - 1:
                    raise
        raise httpx.ConnectError(f"the host {host!r} has no address")

    def close(self) -> None:
        self.inner.close()


class AsyncPinnedTransport(httpx.AsyncBaseTransport):
    """`PinnedTransport` for `httpx.AsyncClient`: the same checks, and names resolve off the event loop."""

    def __init__(self, *, verify=True, inner: httpx.AsyncBaseTransport | None = None, policy: Policy | None = None):
        self.inner = inner or httpx.AsyncHTTPTransport(verify=verify)
        self.policy = policy or current_policy()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host, port = _host_port(request)
        addresses = await async_allowed_addresses(host, port, self.policy)
        original, extensions = request.url, request.extensions
        for index, address in enumerate(addresses):
            _pin(request, original, extensions, host, address)
            try:
                return await self.inner.handle_async_request(request)
            except httpx.ConnectError:
                if index == len(addresses) - 1:
                    raise
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
