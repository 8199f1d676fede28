"""The one place a stored connection becomes a Kubernetes adapter."""

from __future__ import annotations

import yaml
from django.conf import settings

from apps.clusters import network_policy
from apps.core import secrets, yamltext
from apps.kubernetes.models import KubeConnection
from integrations.kubernetes.adapter import KubeAdapter
from integrations.kubernetes.errors import KubeConfigInvalid
from integrations.kubernetes.kubeconfig import vetted_pin


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
            "The stored kubeconfig cannot be decrypted: none of FLEETDECK_ENCRYPTION_KEYS (or the secret key) is the "
            f"key it was stored with. Enter the kubeconfig of connection {connection.name} again."
        ) from exc
    if not text:
        raise KubeConfigInvalid(
            f"Connection {connection.name} has no kubeconfig and does not use the in-cluster account."
        )
    # Loaded as untrusted (no allow_plugins): a row stored before a check existed is refused here, not used.
    # Plugins would run on every worker, file references read its files, a proxy-url bypass the pinned address.
    return KubeAdapter.from_kubeconfig(
        _parsed(connection, text),
        context=connection.context or None,
        pin=vetted_pin(network_policy.current(), f"Connection {connection.name}"),
        **options,
    )


def _parsed(connection: KubeConnection, text: str) -> dict:
    """The stored text as a mapping: anything else would be taken for a path to a file on this machine."""
    try:
        config = yamltext.load(text)
    except yaml.YAMLError as exc:
        problem = str(getattr(exc, "problem", None) or exc).rstrip(".")
        raise KubeConfigInvalid(
            f"Connection {connection.name}: the stored kubeconfig cannot be read: {problem}. Enter it again."
        ) from exc
    if not isinstance(config, dict):
        raise KubeConfigInvalid(
            f"Connection {connection.name}: the stored kubeconfig is not a mapping. Enter it again."
        )
    return config


def _require_superuser_grant(connection: KubeConnection) -> None:
    """Fleetdeck's own service account reads every team's namespaces: used only for a connection a
    superuser added. One a team admin added before that rule existed is refused here, not used."""
    owner = connection.created_by
    if owner is None or not owner.is_superuser:
        raise KubeConfigInvalid(
            f"Connection {connection.name} uses Fleetdeck's own service account, which reads every team's namespaces, "
            "but was not added by a superuser. Ask a superuser to add it again, or give this connection a kubeconfig."
        )
