"""The one place a stored connection becomes a Kubernetes adapter."""

from __future__ import annotations

import httpx
import yaml
from django.conf import settings

from apps.clusters import egress, network_policy, secrets
from apps.kube.adapter import KubeAdapter, KubeConfigInvalid, KubeUnavailable
from apps.kubernetes_link.models import KubeConnection


def adapter_for(connection: KubeConnection) -> KubeAdapter:
    """An adapter with the connection's credentials and the configured timeout, page size and cap,
    connecting to the API server address the network allow-list vetted. Every failure to build one
    is a KubeError, so callers handle Kubernetes errors only."""
    options = {
        "timeout_s": settings.FLEETDECK_KUBE_TIMEOUT_S,
        "page_size": settings.FLEETDECK_KUBE_PAGE_SIZE,
        "max_items": settings.FLEETDECK_KUBE_MAX_ITEMS,
    }
    if connection.in_cluster:
        _require_superuser_grant(connection)
        return KubeAdapter.in_cluster(**options)
    try:
        text = secrets.decrypt(connection.kubeconfig_ciphertext)
    except secrets.SecretUnreadable as exc:
        raise KubeConfigInvalid(
            "The stored kubeconfig cannot be decrypted: none of FLEETDECK_ENCRYPTION_KEYS (or the secret key) is the key it was stored with. "
            f"Enter the kubeconfig of connection {connection.name} again."
        ) from exc
    if not text:
        raise KubeConfigInvalid(
            f"Connection {connection.name} has no kubeconfig and does not use the in-cluster account."
        )
    # Loaded as untrusted (no allow_plugins): a row stored before a check existed is refused here, not used.
    # Plugins would run on every worker, file references read its files, a proxy-url bypass the pinned address.
    return KubeAdapter.from_kubeconfig(
        yaml.safe_load(text), context=connection.context or None, pin=_vetted(connection), **options
    )


def _require_superuser_grant(connection: KubeConnection) -> None:
    """Fleetdeck's own service account reads every team's namespaces: used only for a connection a
    superuser added. One a team admin added before that rule existed is refused here, not used."""
    owner = connection.created_by
    if owner is None or not owner.is_superuser:
        raise KubeConfigInvalid(
            f"Connection {connection.name} uses Fleetdeck's own service account, which reads every team's namespaces, but was "
            "not added by a superuser. Ask a superuser to add it again, or give this connection a kubeconfig."
        )


def _vetted(connection: KubeConnection):
    policy = network_policy.current()

    def address(host: str, port: int) -> str:
        try:
            addresses = egress.allowed_addresses(host, port, policy)
        except egress.EgressRefused as exc:
            raise KubeConfigInvalid(f"Connection {connection.name}: {exc}") from exc
        except httpx.ConnectError as exc:
            raise KubeUnavailable(f"Connection {connection.name}: {exc}") from exc
        # One address is pinned: IPv4 first, the family every API server listens on.
        return next((a for a in addresses if ":" not in a), addresses[0])

    return address
