"""A kmock Kubernetes API server for tests that also use the database.

`tests/unit/integrations/test_kube_adapter.py` runs kmock on the test's own event loop and calls the adapter in
a thread. Code that touches the ORM must run on the test's thread (the test transaction lives
there, and Django refuses ORM calls from a running event loop), so here the server runs on its
own loop in a background thread, and the test stays synchronous. The API server's behaviour is
`FakeKube`'s: bearer-token auth, `limit`/`continue` paging, resourceVersion-guarded patches."""

from __future__ import annotations

import asyncio
import copy
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml
from kmock import KubernetesScaffold, Server

from apps.core import secrets
from apps.kubernetes.models import KubeConnection
from tests.unit.integrations.test_kube_adapter import TOKEN, FakeKube, fixture, kubeconfig

ML = "/apis/ray.io/v1/namespaces/ml"
SET_SELECTOR = re.compile(r"^ray\.io/cluster in \(([^)]*)\)$")


@contextmanager
def serving() -> Iterator[KubernetesScaffold]:
    loop = asyncio.new_event_loop()
    ready, box = threading.Event(), {}

    async def main():
        box["stop"] = asyncio.Event()
        async with KubernetesScaffold() as handler, Server(handler):
            box["handler"] = handler
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("kmock did not start")
    try:
        yield box["handler"]
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        loop.close()


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with serving() as handler:
        yield FakeKube(handler)


def connection(
    kube: FakeKube, team, *, name: str = "prod", namespaces=("ml",), read_only: bool = True, token: str = TOKEN
) -> KubeConnection:
    text = yaml.safe_dump(kubeconfig(kube.url, token))
    return KubeConnection.objects.create(
        team=team,
        name=name,
        kubeconfig_ciphertext=secrets.encrypt(text),
        context="ml",
        namespaces=list(namespaces),
        read_only=read_only,
    )


def serve_pods(kube: FakeKube, pods: list[dict], namespace: str = "ml") -> None:
    """Pods filtered by the `ray.io/cluster in (...)` selector, as the API server would."""

    def answer(request):
        selector = SET_SELECTOR.match(request.params.get("labelSelector") or "")
        wanted = {name.strip() for name in selector.group(1).split(",")} if selector else None
        items = [p for p in pods if wanted is None or p["metadata"]["labels"].get("ray.io/cluster") in wanted]
        return {
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": "1"},
            "items": copy.deepcopy(items),
        }

    kube.kmock[f"get /api/v1/namespaces/{namespace}/pods"] << answer


def serve_events(kube: FakeKube, events: list[dict], namespace: str = "ml") -> None:
    """Events filtered by the `type=` part of the field selector, as the API server would."""

    def answer(request):
        wanted = dict(
            part.split("=", 1) for part in (request.params.get("fieldSelector") or "").split(",") if "=" in part
        )
        items = [e for e in events if e.get("type") == wanted.get("type", e.get("type"))]
        return {
            "apiVersion": "v1",
            "kind": "EventList",
            "metadata": {"resourceVersion": "1"},
            "items": copy.deepcopy(items),
        }

    kube.kmock[f"get /api/v1/namespaces/{namespace}/events"] << answer


def serve_namespace(
    kube: FakeKube, *, rayservices=(), rayclusters=(), pods=None, events=None, hpas=(), scaled_objects=None
) -> None:
    """Everything an inspection of namespace ml reads; `scaled_objects=None` means KEDA is absent."""
    from tests.unit.integrations.test_kube_adapter import failure

    kube.serve_list(f"{ML}/rayclusters", "RayCluster", list(rayclusters))
    kube.serve_list(f"{ML}/rayservices", "RayService", list(rayservices))
    for service in rayservices:
        kube.serve_rayservice(service)
    serve_pods(kube, fixture("pods_ml.json")["items"] if pods is None else pods)
    serve_events(kube, fixture("events_ml.json")["items"] if events is None else events)
    kube.serve_list(
        "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers", "HorizontalPodAutoscaler", list(hpas)
    )
    if scaled_objects is None:
        kube.kmock["get /apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects"] << failure(
            404, "NotFound", "the server could not find the requested resource"
        )
    else:
        kube.serve_list("/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects", "ScaledObject", list(scaled_objects))
