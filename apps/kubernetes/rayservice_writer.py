"""The push protocol's writer for clusters whose Serve config a KubeRay RayService owns.

A change is planned against the dashboard's live config (every application as submitted), but
serveConfigV2 may hold more than applications (http_options, proxy_location, logging): the
writer replaces the applications and keeps the rest. And the planned base is checked against
serveConfigV2 itself, not only against the dashboard: an edit applied to the RayService that
KubeRay has not submitted yet is invisible to the dashboard, and must not be overwritten."""

from __future__ import annotations

from typing import Any

from apps.changes.config_writers import WriterUnavailable
from apps.clusters.models import Cluster
from apps.kubernetes import rayservice
from apps.kubernetes.adapters import adapter_for
from apps.kubernetes.models import KubeLink
from apps.kubernetes.rayservice import RayServiceDrift, RayServiceWriter
from integrations.kubernetes.errors import KubeError
from integrations.kubernetes.kuberay import ServeConfigError


class LinkedRayServiceWriter:
    def __init__(self, link: KubeLink, *, planned_base: dict[str, Any] | None = None):
        self.link = link
        self.planned_base = planned_base

    def push(self, config: dict[str, Any]) -> None:
        namespace, name = self.link.namespace, self.link.name
        with adapter_for(self.link.connection) as kube:
            live = kube.get_rayservice(namespace, name)
            if live.serve_config is None:
                raise ServeConfigError(f"RayService {namespace}/{name}: {live.serve_config_error}")
            if self.planned_base is not None and _applications(live.serve_config) != _applications(self.planned_base):
                raise RayServiceDrift(
                    f"RayService {namespace}/{name}'s serveConfigV2 does not hold the config this change was planned "
                    "against (an edit KubeRay has not applied yet, or one made since the plan); nothing was written.",
                    status=409,
                )
            # `expected_base` is what was just read: a write in between is drift, not something to overwrite.
            RayServiceWriter(kube, namespace, name, expected_base=live.serve_config).push(
                with_applications(live.serve_config, config)
            )

    def may_hold(self, config: dict[str, Any]) -> bool:
        """After a failed patch: False only when serveConfigV2 is known not to hold `config`'s
        applications (so nothing changed); True when it does, or when it cannot be read."""
        try:
            with adapter_for(self.link.connection) as kube:
                live = kube.get_rayservice(self.link.namespace, self.link.name)
        except KubeError:
            return True
        return live.serve_config is not None and _applications(live.serve_config) == _applications(config)


def rayservice_writer(cluster: Cluster, *, planned_base: dict[str, Any] | None = None) -> LinkedRayServiceWriter:
    """The writer for a RayService-owned cluster, or WriterUnavailable saying why there is none."""
    link = KubeLink.objects.select_related("connection").filter(cluster=cluster).first()
    if link is None:
        why = (
            "a push through the dashboard would be reverted by KubeRay, and the cluster is not linked to its "
            "RayService. Link it under Kubernetes with a connection that allows writes."
        )
    elif link.kind != KubeLink.Kind.RAYSERVICE:
        why = f"it is linked to {link.resource}, not to a RayService."
    elif link.connection.read_only:
        why = (
            f"its Kubernetes connection {link.connection.name} is read-only: allow writes on it (and grant Fleetdeck "
            "the fleetdeck-rayservice-writer role in that namespace) to change this cluster."
        )
    else:
        return LinkedRayServiceWriter(link, planned_base=planned_base)
    raise WriterUnavailable(f"{cluster.name}'s Serve config is owned by a KubeRay RayService; {why}")


def waiting_for(cluster: Cluster, applications: list[str]) -> list[str]:
    """What KubeRay still reports as not done for these applications; empty once it agrees."""
    link = KubeLink.objects.select_related("connection").filter(cluster=cluster, kind=KubeLink.Kind.RAYSERVICE).first()
    if link is None:
        return []
    try:
        with adapter_for(link.connection) as kube:
            return rayservice.status(kube, link.namespace, link.name).waiting_for(applications)
    except KubeError as exc:
        return [f"Kubernetes not answering: {exc.message}"]


def with_applications(serve_config: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """`serve_config` with `config`'s applications (and other planned top-level keys), keeping
    its own order of applications so the diff of the custom resource stays readable."""
    new = {app["name"]: app for app in config.get("applications", [])}
    order = [app["name"] for app in serve_config.get("applications", []) if app["name"] in new]
    order += [name for name in new if name not in order]
    merged = {**serve_config, **{k: v for k, v in config.items() if k != "applications"}}
    merged["applications"] = [new[name] for name in order]
    return merged


def _applications(config: dict[str, Any]) -> dict[str, Any]:
    return {app["name"]: app for app in config.get("applications", [])}
