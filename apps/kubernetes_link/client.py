"""The one place a stored connection becomes a Kubernetes adapter."""

from __future__ import annotations

import yaml
from django.conf import settings

from apps.clusters import secrets
from apps.kube.adapter import KubeAdapter, KubeConfigInvalid
from apps.kubernetes_link.models import KubeConnection


def adapter_for(connection: KubeConnection) -> KubeAdapter:
    """An adapter with the connection's credentials and the configured timeout, page size and cap.
    Every failure to build one is a KubeConfigInvalid, so callers handle Kubernetes errors only."""
    options = {
        "timeout_s": settings.FLEETDECK_KUBE_TIMEOUT_S,
        "page_size": settings.FLEETDECK_KUBE_PAGE_SIZE,
        "max_items": settings.FLEETDECK_KUBE_MAX_ITEMS,
    }
    if connection.in_cluster:
        return KubeAdapter.in_cluster(**options)
    try:
        text = secrets.decrypt(connection.kubeconfig_ciphertext)
    except secrets.SecretUnreadable as exc:
        raise KubeConfigInvalid(
            "The stored kubeconfig cannot be decrypted: none of FLEETDECK_ENCRYPTION_KEYS (or the secret key) is the key it was stored with. "
            f"Enter the kubeconfig of connection {connection.name} again."
        ) from exc
    if not text:
        raise KubeConfigInvalid(f"Connection {connection.name} has no kubeconfig and does not use the in-cluster account.")
    # Stored kubeconfigs never run credential plugins: they would execute on every worker.
    return KubeAdapter.from_kubeconfig(yaml.safe_load(text), context=connection.context or None, **options)
