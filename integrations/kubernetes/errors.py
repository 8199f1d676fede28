"""The Kubernetes adapter's errors, by what the API server answered."""

from __future__ import annotations

from integrations.errors import AdapterConflict, AdapterError


class KubeError(AdapterError):
    """Any error of the Kubernetes adapter."""


class KubeConfigInvalid(KubeError):
    """The kubeconfig or the in-cluster service account cannot be used (missing, no such context)."""


class KubeUnauthorized(KubeError):
    """401: the credentials are missing, expired or revoked."""


class KubeForbidden(KubeError):
    """403: authenticated, but RBAC does not allow this verb on this resource in this namespace."""

    def __init__(self, message: str, *, verb: str, resource: str, namespace: str, status: int | None = 403):
        super().__init__(message, status=status)
        self.verb = verb
        self.resource = resource
        self.namespace = namespace


class KubeNotFound(KubeError):
    """404: the object does not exist."""


class KubeCRDNotInstalled(KubeNotFound):
    """404 on a custom resource type: the API server does not serve it (the CRD is not installed)."""


class KubeConflict(KubeError, AdapterConflict):
    """409: the object changed since it was read (resourceVersion precondition failed)."""


class KubeUnavailable(KubeError):
    """Timeout, refused connection, or an overloaded/unavailable API server (429, 5xx)."""

    transient = True


class KubeBadResponse(KubeError):
    """The server answered, but not like a Kubernetes API server would."""
