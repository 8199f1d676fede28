"""Kubeconfigs Fleetdeck may load, and the vetted API server address a client is pinned to."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from kubernetes import client

from integrations import egress, plainyaml
from integrations.kubernetes.errors import KubeConfigInvalid, KubeUnavailable


def pin_address(configuration: client.Configuration, pin: Callable[[str, int], str]) -> None:
    url = urlsplit(configuration.host)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    address = pin(host, port)
    if address == host:
        return
    configuration.host = urlunsplit(
        url._replace(netloc=f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
    )
    if url.scheme == "https":
        configuration.tls_server_name = host


_CLUSTER_FILES = {"certificate-authority": "certificate-authority-data"}
_USER_FILES = {"tokenFile": "token", "client-certificate": "client-certificate-data", "client-key": "client-key-data"}


def refuse_unsafe(kubeconfig: str | os.PathLike | dict[str, Any], *, allow_plugins: bool) -> None:
    if not isinstance(kubeconfig, dict):
        with open(kubeconfig, encoding="utf-8") as handle:
            kubeconfig = plainyaml.load(handle) or {}
    if not isinstance(kubeconfig, dict):
        return
    clusters = [_dict(entry) for entry in _list(kubeconfig.get("clusters"))]
    users = [_dict(entry) for entry in _list(kubeconfig.get("users"))]
    for entry in clusters:
        if _dict(entry.get("cluster")).get("proxy-url"):
            raise KubeConfigInvalid(
                "Fleetdeck connects to the API server directly; remove proxy-url from the kubeconfig's cluster "
                f"{entry.get('name')!r}."
            )
    if allow_plugins:
        return
    for entry in users:
        user = _dict(entry.get("user"))
        plugin = next((key for key in ("exec", "auth-provider") if user.get(key)), None)
        if plugin:
            raise KubeConfigInvalid(
                f"The kubeconfig's user {entry.get('name')!r} uses an {plugin} credential plugin, which would "
                "run on Fleetdeck's workers; give it a token or client certificate instead."
            )
    for kind, entries, files in (("cluster", clusters, _CLUSTER_FILES), ("user", users, _USER_FILES)):
        for entry in entries:
            section = _dict(entry.get(kind))
            for key, inline in files.items():
                if section.get(key):
                    what = "the token itself" if key == "tokenFile" else "the file's contents, base64-encoded,"
                    raise KubeConfigInvalid(
                        f"The kubeconfig's {kind} {entry.get('name')!r} names a local file in {key}, which Fleetdeck "
                        f"would read on its own machines; put {what} in {inline} instead."
                    )


def vetted_pin(policy: egress.Policy, label: str) -> Callable[[str, int], str]:
    """A `pin` for `KubeAdapter.from_kubeconfig`: the API server address the network policy allows,
    errors naming `label` (the stored connection)."""

    def address(host: str, port: int) -> str:
        try:
            addresses = egress.allowed_addresses(host, port, policy)
        except egress.EgressRefused as exc:
            raise KubeConfigInvalid(f"{label}: {exc}") from exc
        except httpx.ConnectError as exc:
            raise KubeUnavailable(f"{label}: {exc}") from exc
        # One address is pinned: IPv4 first, the family every API server listens on.
        return next((a for a in addresses if ":" not in a), addresses[0])

    return address


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
