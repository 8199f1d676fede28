"""What an API server's failure means: ApiException and transport errors as adapter errors."""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from integrations.kubernetes.errors import (
    KubeBadResponse,
    KubeConflict,
    KubeCRDNotInstalled,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeUnauthorized,
    KubeUnavailable,
)
from integrations.kubernetes.kinds import Kind


class ContinueExpired(KubeError):
    """410 Gone on a continued list; handled inside pagination only."""


def api_error(exc: ApiException, *, verb: str, kind: Kind, namespace: str, name: str, what: str) -> KubeError:
    status = exc.status or 0
    body = _status_body(exc.body)
    said = str(body.get("message") or exc.reason or "").strip()
    said_part = f" The API server said: {said}" if said else ""
    if status == 0:
        # The client reports TLS failures this way: a wrong CA or server name, which a retry cannot fix.
        return KubeBadResponse(
            f"Cannot {what}: TLS failed ({_excerpt(exc.reason or '')}). Check the cluster CA in the kubeconfig."
        )
    if status == 401:
        return KubeUnauthorized(
            f"Kubernetes refused the credentials (HTTP 401) to {what}: the token or client certificate is "
            "missing, expired or revoked.",
            status=status,
        )
    if status == 403:
        return KubeForbidden(
            f"Forbidden to {verb} {kind.label} in namespace {namespace} (HTTP 403): grant Fleetdeck's "
            f"account '{verb}' on '{kind.label}' there.{said_part}",
            verb=verb,
            resource=kind.label,
            namespace=namespace,
            status=status,
        )
    if status == 404:
        if body.get("kind") != "Status":
            return KubeBadResponse(
                f"Cannot {what}: HTTP 404 without a Kubernetes Status; is the kubeconfig's server the API server?",
                status=status,
            )
        details = _dict(body.get("details"))
        if kind.missing and not details.get("name"):
            # A missing object names itself in details; an unserved resource type does not.
            return KubeCRDNotInstalled(
                f"{kind.missing} (the API server does not serve {kind.label}/{kind.version}).", status=status
            )
        if name:
            return KubeNotFound(f"{kind.kind} {namespace}/{name} does not exist.", status=status)
        return KubeNotFound(
            f"The API server does not serve {kind.label}/{kind.version} (HTTP 404).{said_part}", status=status
        )
    if status == 409:
        return KubeConflict(
            f"{kind.kind} {namespace}/{name} changed since it was read (HTTP 409 Conflict); re-read it and try again.",
            status=status,
        )
    if status == 410 and verb == "list":
        return ContinueExpired(said or "continue token expired", status=status)
    if status == 429 or status >= 500:
        return KubeUnavailable(f"The API server could not {what} (HTTP {status}).{said_part}", status=status)
    return KubeBadResponse(f"Cannot {what}: HTTP {status}.{said_part}", status=status)


def transport_error(exc: Exception, what: str, timeout_s: float) -> KubeUnavailable:
    cause = getattr(exc, "reason", None) or exc
    # urllib3 files a refused connection under its TimeoutError; tell the two apart first.
    refused = isinstance(cause, (urllib3.exceptions.NewConnectionError, ConnectionError))
    if not refused and isinstance(cause, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return KubeUnavailable(f"The API server did not answer ({what}) within {timeout_s:g} s.")
    return KubeUnavailable(
        f"Cannot reach the API server to {what}: {_excerpt(str(cause)) or cause.__class__.__name__}."
    )


def _status_body(text: Any) -> dict[str, Any]:
    try:
        body = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _excerpt(text: str | bytes, limit: int = 300) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[:limit] + "…"
