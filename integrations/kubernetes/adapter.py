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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from integrations.kubernetes import autoscalers, events, kuberay, pods
from integrations.kubernetes.errors import KubeBadResponse, KubeConfigInvalid, KubeCRDNotInstalled, KubeForbidden
from integrations.kubernetes.kinds import EVENTS, HPAS, PODS, RAYCLUSTERS, RAYSERVICES, SCALEDOBJECTS, Kind
from integrations.kubernetes.kubeconfig import pin_address, refuse_unsafe
from integrations.kubernetes.responses import ContinueExpired, api_error, transport_error

USER_AGENT = "fleetdeck-kube-adapter/1"
FIELD_MANAGER = "fleetdeck"
DEFAULT_TIMEOUT_S = 10.0
# kubectl's own chunk size; big enough to list a namespace in one or two round trips.
DEFAULT_PAGE_SIZE = 500
DEFAULT_MAX_ITEMS = 5000
MAX_RESPONSE_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


@dataclass
class ListResult(Generic[T]):
    items: list[T] = field(default_factory=list)
    partial: bool = False
    warnings: list[str] = field(default_factory=list)


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
    ) -> KubeAdapter:
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
            refuse_unsafe(kubeconfig, allow_plugins=allow_plugins)
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
            pin_address(configuration, pin)
        return cls._from_configuration(configuration, **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> KubeAdapter:
        """From the pod's service account (token and CA mounted by Kubernetes)."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise KubeConfigInvalid(f"Not running in a Kubernetes pod with a service account: {exc}") from exc
        return cls._from_configuration(configuration, **options)

    @classmethod
    def _from_configuration(cls, configuration: client.Configuration, **options: Any) -> KubeAdapter:
        # One attempt per call: urllib3 would otherwise retry reads and multiply the timeout.
        configuration.retries = False
        # The client picks up HTTP(S)_PROXY from the environment; the bearer token must reach only
        # the vetted API server address. Set last: changing the host re-reads the environment.
        configuration.proxy = None
        return cls(client.ApiClient(configuration=configuration), **options)

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> KubeAdapter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- KubeRay -----------------------------------------------------------------------------

    def list_rayclusters(self, namespaces: str | Iterable[str]) -> ListResult[kuberay.RayCluster]:
        return self._list_custom(RAYCLUSTERS, namespaces, kuberay.parse_raycluster)

    def list_rayservices(self, namespaces: str | Iterable[str]) -> ListResult[kuberay.RayService]:
        return self._list_custom(RAYSERVICES, namespaces, kuberay.parse_rayservice)

    def get_rayservice(self, namespace: str, name: str) -> kuberay.RayService:
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
        return kuberay.parse_rayservice(body)

    def patch_rayservice_serve_config(
        self, namespace: str, name: str, serve_config_yaml: str, resource_version: str
    ) -> kuberay.RayService:
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
        return kuberay.parse_rayservice(body)

    # --- core and autoscaling ----------------------------------------------------------------

    def list_pods(self, namespaces: str | Iterable[str], label_selector: str | None = None) -> ListResult[pods.Pod]:
        def page(namespace: str, limit: int, token: str | None):
            return self._core.list_namespaced_pod(
                namespace,
                label_selector=label_selector,
                limit=limit,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )

        return self._paginate(PODS, namespaces, page, pods.parse_pod)

    def list_events(
        self,
        namespaces: str | Iterable[str],
        *,
        field_selector: str | None = None,
        reasons: Iterable[str] = (),
    ) -> ListResult[events.Event]:
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

        result = self._paginate(EVENTS, namespaces, page, events.parse_event)
        if len(wanted) > 1:
            result.items = [event for event in result.items if event.reason in wanted]
        return result

    def list_hpas(self, namespaces: str | Iterable[str]) -> ListResult[autoscalers.HorizontalPodAutoscaler]:
        def page(namespace: str, limit: int, token: str | None):
            return self._autoscaling.list_namespaced_horizontal_pod_autoscaler(
                namespace,
                limit=limit,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )

        return self._paginate(HPAS, namespaces, page, autoscalers.parse_hpa)

    def list_scaled_objects(self, namespaces: str | Iterable[str]) -> ListResult[autoscalers.ScaledObject]:
        """KEDA ScaledObjects. A cluster without KEDA has none: an empty result with a note, not an error."""
        try:
            return self._list_custom(SCALEDOBJECTS, namespaces, autoscalers.parse_scaled_object)
        except KubeCRDNotInstalled as exc:
            return ListResult(items=[], partial=False, warnings=[exc.message])

    # --- plumbing ----------------------------------------------------------------------------

    def _list_custom(self, kind: Kind, namespaces, parse: Callable[[dict], T]) -> ListResult[T]:
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

    def _paginate(self, kind: Kind, namespaces, fetch: Callable[..., Any], parse: Callable[[dict], T]) -> ListResult[T]:
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
                        lambda: fetch(namespace, min(self.page_size, room), token),  # noqa: B023 (called before the loop moves on)
                        verb="list",
                        kind=kind,
                        namespace=namespace,
                    )
                except KubeForbidden as exc:
                    result.partial = True
                    result.warnings.append(exc.message)
                    break
                except ContinueExpired:
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
        self, request: Callable[[], Any], *, verb: str, kind: Kind, namespace: str, name: str = ""
    ) -> dict[str, Any]:
        what = f"{verb} {kind.label}" + (f" {namespace}/{name}" if name else f" in {namespace}")
        try:
            response = request()
            try:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
            finally:
                response.release_conn()
        except ApiException as exc:
            raise api_error(exc, verb=verb, kind=kind, namespace=namespace, name=name, what=what) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise transport_error(exc, what, self.timeout_s) from exc
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


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _excerpt(text: str | bytes, limit: int = 300) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[:limit] + "…"
