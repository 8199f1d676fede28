"""The Kubernetes adapter: the only code in Fleetdeck that talks to a Kubernetes API server.

Built on the official `kubernetes` client, each adapter owns its ApiClient and Configuration
(never the process-wide default), so one worker can talk to many clusters with different
credentials. Responses are read raw (`_preload_content=False`) and parsed by `objects`, which
keeps CRDs and core objects on one code path and avoids the generated models' strictness.

Every call has a timeout and makes one attempt: retrying is the caller's decision (transient
errors say so), and a read that hangs must fail within the timeout, not after urllib3's retries.
Every list follows `continue` tokens up to a cap on items; a result that is not the whole truth
(the cap, a forbidden namespace, an expired token) says so with `partial` and `warnings`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, TypeVar
from urllib.parse import urlsplit, urlunsplit

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from apps.kube import objects

USER_AGENT = "fleetdeck-kube-adapter/1"
FIELD_MANAGER = "fleetdeck"
DEFAULT_TIMEOUT_S = 10.0
# kubectl's own chunk size; big enough to list a namespace in one or two round trips.
DEFAULT_PAGE_SIZE = 500
DEFAULT_MAX_ITEMS = 5000
MAX_RESPONSE_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


class KubeError(Exception):
    """Base of every adapter error. `transient` says whether a retry may help."""

    transient = False

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status


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


class KubeConflict(KubeError):
    """409: the object changed since it was read (resourceVersion precondition failed)."""


class KubeUnavailable(KubeError):
    """Timeout, refused connection, or an overloaded/unavailable API server (429, 5xx)."""

    transient = True


class KubeBadResponse(KubeError):
    """The server answered, but not like a Kubernetes API server would."""


@dataclass
class ListResult(Generic[T]):
    items: list[T] = field(default_factory=list)
    partial: bool = False
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Kind:
    """A resource type as the API names it, with what to say when it is not served."""

    group: str
    version: str
    plural: str
    kind: str
    missing: str = ""  # message when the CRD is not installed; empty for built-in types

    @property
    def label(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


KUBERAY_MISSING = "KubeRay CRDs are not installed on this cluster"
RAYCLUSTERS = _Kind("ray.io", "v1", "rayclusters", "RayCluster", KUBERAY_MISSING)
RAYSERVICES = _Kind("ray.io", "v1", "rayservices", "RayService", KUBERAY_MISSING)
SCALEDOBJECTS = _Kind("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", "KEDA is not installed on this cluster")
PODS = _Kind("", "v1", "pods", "Pod")
EVENTS = _Kind("", "v1", "events", "Event")
HPAS = _Kind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")

# The RBAC the adapter's calls need, by (API group, resource), and nothing more: deploy/k8s/rbac.yaml
# grants exactly READS cluster-wide, deploy/k8s/optional/rayservice-writer exactly WRITES per namespace.
READS = {
    (RAYCLUSTERS.group, RAYCLUSTERS.plural): ("list",),
    (RAYSERVICES.group, RAYSERVICES.plural): ("get", "list"),
    (PODS.group, PODS.plural): ("list",),
    (EVENTS.group, EVENTS.plural): ("list",),
    (HPAS.group, HPAS.plural): ("list",),
    (SCALEDOBJECTS.group, SCALEDOBJECTS.plural): ("list",),
}
WRITES = {(RAYSERVICES.group, RAYSERVICES.plural): ("patch",)}


def _pin(configuration: client.Configuration, pin: Callable[[str, int], str]) -> None:
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


class KubeAdapter:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_items: int = DEFAULT_MAX_ITEMS,
    ):
        """Prefer `from_kubeconfig` or `in_cluster`; this takes an ApiClient configured already."""
        if page_size < 1 or max_items < 1 or timeout_s <= 0:
            raise ValueError("page_size, max_items and timeout_s must be positive.")
        self._api = api_client
        self._api.user_agent = USER_AGENT
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.max_items = max_items
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._autoscaling = client.AutoscalingV2Api(api_client)

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | os.PathLike | dict[str, Any],
        *,
        context: str | None = None,
        allow_plugins: bool = False,
        pin: Callable[[str, int], str] | None = None,
        **options: Any,
    ) -> "KubeAdapter":
        """From a kubeconfig file path or an already-parsed kubeconfig dict; `context` defaults to
        the kubeconfig's current-context. The file is never written back (no token persistence).

        Credential plugins (`exec`, `auth-provider`) run a command or call an identity provider on
        the machine that loads the kubeconfig: a stored kubeconfig would run its command on every
        worker. File references (`tokenFile`, `certificate-authority`, `client-certificate`,
        `client-key`) would read the worker's own files, such as its service-account token, and
        send them. Both are refused unless `allow_plugins` says the kubeconfig is the operator's
        own. A `proxy-url` is always refused: the client would send the credentials to the proxy,
        an address nothing vetted.

        `pin(host, port)` returns the vetted address to connect to for the API server's name (or
        raises): the client then connects to that address and verifies TLS against the name, so
        a name that resolves elsewhere later cannot move the connection."""
        configuration = client.Configuration()
        try:
            _refuse_unsafe(kubeconfig, allow_plugins=allow_plugins)
            if isinstance(kubeconfig, dict):
                config.load_kube_config_from_dict(
                    kubeconfig, context=context, client_configuration=configuration, persist_config=False
                )
            else:
                config.load_kube_config(
                    config_file=os.fspath(kubeconfig),
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as exc:
            raise KubeConfigInvalid(f"The kubeconfig cannot be used: {exc}") from exc
        if pin is not None:
            _pin(configuration, pin)
        return cls._from_configuration(configuration, **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> "KubeAdapter":
        """From the pod's service account (token and CA mounted by Kubernetes)."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise KubeConfigInvalid(f"Not running in a Kubernetes pod with a service account: {exc}") from exc
        return cls._from_configuration(configuration, **options)

    @classmethod
    def _from_configuration(cls, configuration: client.Configuration, **options: Any) -> "KubeAdapter":
        # One attempt per call: urllib3 would otherwise retry reads and multiply the timeout.
        configuration.retries = False
        # The client picks up HTTP(S)_PROXY from the environment; the bearer token must reach only
        # the vetted API server address. Set last: changing the host re-reads the environment.
        configuration.proxy = None
        return cls(client.ApiClient(configuration=configuration), **options)

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> "KubeAdapter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- KubeRay -----------------------------------------------------------------------------

    def list_rayclusters(self, namespaces: str | Iterable[str]) -> ListResult[objects.RayCluster]:
        return self._list_custom(RAYCLUSTERS, namespaces, objects.parse_raycluster)

    def list_rayservices(self, namespaces: str | Iterable[str]) -> ListResult[objects.RayService]:
        return self._list_custom(RAYSERVICES, namespaces, objects.parse_rayservice)

    def get_rayservice(self, namespace: str, name: str) -> objects.RayService:
        body = self._call(
            lambda: self._custom.get_namespaced_custom_object(
                RAYSERVICES.group,
                RAYSERVICES.version,
                namespace,
                RAYSERVICES.plural,
                name,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
            verb="get",
            kind=RAYSERVICES,
            namespace=namespace,
            name=name,
        )
        return objects.parse_rayservice(body)

    def patch_rayservice_serve_config(
        self, namespace: str, name: str, serve_config_yaml: str, resource_version: str
    ) -> objects.RayService:
        """Replace spec.serveConfigV2 if, and only if, the RayService is still at `resource_version`.

        A JSON merge patch that carries metadata.resourceVersion makes the API server enforce it as
        a precondition: a RayService changed by anyone since it was read answers 409 (KubeConflict)
        instead of silently losing that change."""
        if not resource_version:
            raise ValueError("A resourceVersion is required: an unconditional patch could overwrite someone's change.")
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": {"serveConfigV2": serve_config_yaml}}
        body = self._call(
            lambda: self._custom.patch_namespaced_custom_object(
                RAYSERVICES.group,
                RAYSERVICES.version,
                namespace,
                RAYSERVICES.plural,
                name,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
            verb="patch",
            kind=RAYSERVICES,
            namespace=namespace,
            name=name,
        )
        return objects.parse_rayservice(body)

    # --- core and autoscaling ----------------------------------------------------------------

    def list_pods(self, namespaces: str | Iterable[str], label_selector: str | None = None) -> ListResult[objects.Pod]:
        def page(namespace: str, limit: int, token: str | None):
            return self._core.list_namespaced_pod(
                namespace,
                label_selector=label_selector,
                limit=limit,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )

        return self._paginate(PODS, namespaces, page, objects.parse_pod)

    def list_events(
        self,
        namespaces: str | Iterable[str],
        *,
        field_selector: str | None = None,
        reasons: Iterable[str] = (),
    ) -> ListResult[objects.Event]:
        """Events, optionally narrowed by a field selector (`involvedObject.kind=Pod`, `type=Warning`)
        and by reasons. The API cannot OR field selectors, so one reason is filtered by the server
        and several by us, after paging."""
        wanted = sorted(set(reasons))
        selector = field_selector
        if len(wanted) == 1:
            selector = ",".join(s for s in (field_selector, f"reason={wanted[0]}") if s)

        def page(namespace: str, limit: int, token: str | None):
            return self._core.list_namespaced_event(
                namespace,
                field_selector=selector,
                limit=limit,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )

        result = self._paginate(EVENTS, namespaces, page, objects.parse_event)
        if len(wanted) > 1:
            result.items = [event for event in result.items if event.reason in wanted]
        return result

    def list_hpas(self, namespaces: str | Iterable[str]) -> ListResult[objects.HorizontalPodAutoscaler]:
        def page(namespace: str, limit: int, token: str | None):
            return self._autoscaling.list_namespaced_horizontal_pod_autoscaler(
                namespace,
                limit=limit,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )

        return self._paginate(HPAS, namespaces, page, objects.parse_hpa)

    def list_scaled_objects(self, namespaces: str | Iterable[str]) -> ListResult[objects.ScaledObject]:
        """KEDA ScaledObjects. A cluster without KEDA has none: an empty result with a note, not an error."""
        try:
            return self._list_custom(SCALEDOBJECTS, namespaces, objects.parse_scaled_object)
        except KubeCRDNotInstalled as exc:
            return ListResult(items=[], partial=False, warnings=[exc.message])

    # --- plumbing ----------------------------------------------------------------------------

    def _list_custom(self, kind: _Kind, namespaces, parse: Callable[[dict], T]) -> ListResult[T]:
        def page(namespace: str, limit: int, token: str | None):
            return self._custom.list_namespaced_custom_object(
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                limit=limit,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )

        return self._paginate(kind, namespaces, page, parse)

    def _paginate(
        self, kind: _Kind, namespaces, fetch: Callable[..., Any], parse: Callable[[dict], T]
    ) -> ListResult[T]:
        namespaces = [namespaces] if isinstance(namespaces, str) else list(dict.fromkeys(namespaces))
        result: ListResult[T] = ListResult()
        for position, namespace in enumerate(namespaces):
            token: str | None = None
            while True:
                room = self.max_items - len(result.items)
                if room <= 0:
                    unlisted = namespaces[position + 1 :] if token else namespaces[position:]
                    result.partial = True
                    result.warnings.append(
                        f"Stopped at {self.max_items} {kind.plural} (the cap)"
                        + (f": {namespace} has more" if token else "")
                        + (f"; not listed: {', '.join(unlisted)}" if unlisted else "")
                        + "."
                    )
                    return result
                try:
                    body = self._call(
                        lambda: fetch(namespace, min(self.page_size, room), token),
                        verb="list",
                        kind=kind,
                        namespace=namespace,
                    )
                except KubeForbidden as exc:
                    result.partial = True
                    result.warnings.append(exc.message)
                    break
                except _ContinueExpired:
                    # The snapshot behind the token is gone (compacted); what was read is kept.
                    result.partial = True
                    result.warnings.append(
                        f"The listing of {kind.plural} in {namespace} changed too much while paging "
                        "(continue token expired); the result misses the rest of that namespace."
                    )
                    break
                items = body.get("items")
                if items is None:  # the API server marshals an empty Go slice as null
                    items = []
                if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
                    raise KubeBadResponse(f"The {kind.plural} list in {namespace} has no list of objects.")
                if len(items) > room:  # a server may ignore `limit`
                    result.items.extend(parse(item) for item in items[:room])
                    result.partial = True
                    result.warnings.append(f"Stopped at {self.max_items} {kind.plural} (the cap) in {namespace}.")
                    return result
                result.items.extend(parse(item) for item in items)
                following = _dict(body.get("metadata")).get("continue") or None
                if not following:
                    break
                if following == token:
                    raise KubeBadResponse(
                        f"The {kind.plural} list in {namespace} answered the same continue token twice."
                    )
                token = following
        return result

    def _call(
        self, request: Callable[[], Any], *, verb: str, kind: _Kind, namespace: str, name: str = ""
    ) -> dict[str, Any]:
        what = f"{verb} {kind.label}" + (f" {namespace}/{name}" if name else f" in {namespace}")
        try:
            response = request()
            try:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
            finally:
                response.release_conn()
        except ApiException as exc:
            raise _api_error(exc, verb=verb, kind=kind, namespace=namespace, name=name, what=what) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _transport_error(exc, what, self.timeout_s) from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            raise KubeBadResponse(f"{what}: the answer is larger than {MAX_RESPONSE_BYTES} bytes.")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KubeBadResponse(f"{what}: the answer is not JSON: {_excerpt(raw)}") from exc
        if not isinstance(body, dict):
            raise KubeBadResponse(f"{what}: the answer is not a JSON object.")
        return body


# Kubeconfig keys whose value is a path the client opens, with the key that carries the same inline.
_CLUSTER_FILES = {"certificate-authority": "certificate-authority-data"}
_USER_FILES = {"tokenFile": "token", "client-certificate": "client-certificate-data", "client-key": "client-key-data"}


def _refuse_unsafe(kubeconfig: str | os.PathLike | dict[str, Any], *, allow_plugins: bool) -> None:
    if not isinstance(kubeconfig, dict):
        with open(kubeconfig, encoding="utf-8") as handle:
            kubeconfig = yaml.safe_load(handle) or {}
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


class _ContinueExpired(KubeError):
    """410 Gone on a continued list; handled inside pagination only."""


def _api_error(exc: ApiException, *, verb: str, kind: _Kind, namespace: str, name: str, what: str) -> KubeError:
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
        return _ContinueExpired(said or "continue token expired", status=status)
    if status == 429 or status >= 500:
        return KubeUnavailable(f"The API server could not {what} (HTTP {status}).{said_part}", status=status)
    return KubeBadResponse(f"Cannot {what}: HTTP {status}.{said_part}", status=status)


def _transport_error(exc: Exception, what: str, timeout_s: float) -> KubeUnavailable:
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
