"""What an admin types about a Kubernetes connection, checked in one place for forms and
serializers. Nothing here calls the API server: a kubeconfig is loaded offline to prove the
context exists and carries no credential plugin, local file reference or proxy."""

from __future__ import annotations

import re
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from apps.clusters import network_policy
from apps.clusters import validation as cluster_validation
from apps.clusters.models import Cluster
from apps.core import yamltext
from integrations.kubernetes.adapter import KubeAdapter
from integrations.kubernetes.errors import KubeConfigInvalid

NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_NAMESPACES = 50
MAX_KUBECONFIG_BYTES = 256 * 1024


def parse_kubeconfig(text: str) -> dict[str, Any]:
    if not (text or "").strip():
        raise ValidationError(
            "Paste the kubeconfig (YAML); only a superuser can use the in-cluster service account instead."
        )
    if len(text.encode()) > MAX_KUBECONFIG_BYTES:
        raise ValidationError(f"The kubeconfig is larger than {MAX_KUBECONFIG_BYTES // 1024} KiB.")
    try:
        config = yamltext.load(text)
    except yaml.YAMLError as exc:
        raise ValidationError(f"The kubeconfig is not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(config, dict) or not config.get("contexts") or not config.get("clusters"):
        raise ValidationError("This is not a kubeconfig: it needs clusters, users and contexts.")
    return config


def check_kubeconfig(config: dict[str, Any], context: str, team=None) -> None:
    """Load it as the adapter will (no network; the adapter refuses plugins, files and proxies),
    then apply `team`'s URL policy to its API server."""
    try:
        KubeAdapter.from_kubeconfig(config, context=context or None).close()
    except KubeConfigInvalid as exc:
        raise ValidationError(exc.message) from exc
    server = _server_of(config, context)
    if server:
        cluster_validation.check_network_policy(server, network_policy.for_team(team))


def _server_of(config: dict[str, Any], context: str) -> str:
    name = context or config.get("current-context") or ""
    entry = next((c for c in config.get("contexts") or [] if isinstance(c, dict) and c.get("name") == name), {})
    cluster_name = (entry.get("context") or {}).get("cluster")
    cluster = next(
        (c for c in config.get("clusters") or [] if isinstance(c, dict) and c.get("name") == cluster_name), {}
    )
    return str((cluster.get("cluster") or {}).get("server") or "")


def validate_namespaces(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [part.strip() for part in re.split(r"[,\s]+", value) if part.strip()]
    if not isinstance(value, list) or not value:
        raise ValidationError("Name at least one namespace: Fleetdeck looks only where it is told to.")
    if len(value) > MAX_NAMESPACES:
        raise ValidationError(f"At most {MAX_NAMESPACES} namespaces per connection.")
    for namespace in value:
        if not isinstance(namespace, str) or not NAMESPACE.match(namespace):
            raise ValidationError(f"{namespace!r} is not a namespace name (lowercase letters, digits and dashes).")
    return sorted(set(value))


def validate_cluster_name(name: str) -> str:
    Cluster._meta.get_field("name").run_validators(name)
    if Cluster.objects.filter(name=name).exists():
        raise ValidationError(f"A cluster named {name} is already registered.")
    return name


def suggested_cluster_name(resource_name: str) -> str:
    """A Fleetdeck cluster name from a resource name (Kubernetes allows dots, Fleetdeck does not)."""
    return re.sub(r"[^a-z0-9-]+", "-", resource_name.lower()).strip("-")[:63].strip("-")
