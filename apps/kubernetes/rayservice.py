"""Serve configs owned by a KubeRay RayService: read them, write them, watch them converge.

KubeRay owns what a RayService's cluster serves: it re-submits `spec.serveConfigV2` whenever that
string changes, and would revert a push made through the dashboard. So for such a cluster the
push protocol writes the custom resource instead, with optimistic concurrency: the patch carries
the resourceVersion it read, and the API server refuses it (409) if anyone wrote in between.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from integrations.kubernetes.adapter import KubeAdapter
from integrations.kubernetes.errors import KubeConflict
from integrations.kubernetes.kuberay import ServeAppStatus, ServeConfigError, parse_serve_config_v2

# KubeRay writes the status several times a minute, and each write bumps the resourceVersion: a
# 409 caused by that alone is retried, a few times, as long as serveConfigV2 itself is unchanged.
PATCH_ATTEMPTS = 3


class RayServiceDrift(KubeConflict):
    """serveConfigV2 changed outside this change: nothing was written; re-plan."""


def read_serve_config(adapter: KubeAdapter, namespace: str, name: str) -> tuple[dict[str, Any], str]:
    """The RayService's Serve config and the resourceVersion it was read at."""
    service = adapter.get_rayservice(namespace, name)
    if service.serve_config is None:
        raise ServeConfigError(f"RayService {namespace}/{name}: {service.serve_config_error}")
    return service.serve_config, service.resource_version


def dump_serve_config(config: dict[str, Any]) -> str:
    """A Serve config as the YAML string serveConfigV2 holds. Keys keep their order, so a diff of
    the custom resource reads like the change that was planned."""
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, allow_unicode=True)
    # The round trip is the validation: what cannot be read back must not be written.
    if parse_serve_config_v2(text) != config:
        raise ServeConfigError("The Serve config does not survive a YAML round trip; refusing to write it.")
    return text


class RayServiceWriter:
    """The push protocol's ConfigWriter for a cluster whose Serve config a RayService owns.

    `expected_base`, when given, is the config the change was planned against: if serveConfigV2
    no longer holds it, the push stops with RayServiceDrift before writing anything."""

    def __init__(self, adapter: KubeAdapter, namespace: str, name: str, *, expected_base: dict[str, Any] | None = None):
        self.adapter = adapter
        self.namespace = namespace
        self.name = name
        self.expected_base = expected_base

    def push(self, config: dict[str, Any]) -> None:
        text = dump_serve_config(config)
        read_at = None
        for _ in range(PATCH_ATTEMPTS):
            live = self.adapter.get_rayservice(self.namespace, self.name)
            if read_at is None:
                read_at = live.serve_config_yaml
                if self.expected_base is not None and live.serve_config != self.expected_base:
                    raise RayServiceDrift(
                        f"RayService {self.namespace}/{self.name}'s serveConfigV2 is no longer the config this change "
                        "was planned against; nothing was written. Re-plan."
                    )
            elif live.serve_config_yaml != read_at:
                raise RayServiceDrift(
                    f"RayService {self.namespace}/{self.name}'s serveConfigV2 was changed by someone else while "
                    "Fleetdeck was writing it; nothing was written. Re-plan.",
                    status=409,
                )
            if live.serve_config == config:
                return
            try:
                self.adapter.patch_rayservice_serve_config(self.namespace, self.name, text, live.resource_version)
                return
            except KubeConflict:
                continue
        raise RayServiceDrift(
            f"RayService {self.namespace}/{self.name} kept changing during {PATCH_ATTEMPTS} attempts to write it; "
            "nothing was written. Re-plan when it is quiet.",
            status=409,
        )


@dataclass(frozen=True)
class RayServiceHealth:
    """What verification needs from a RayService after a push."""

    namespace: str
    name: str
    generation: int | None
    observed: bool  # KubeRay has reconciled this generation; before that the statuses are old news
    ready: bool
    upgrading: bool  # a new RayCluster is being prepared: the apps below are the old cluster's
    service_status: str
    cluster_name: str
    pending_cluster_name: str
    applications: dict[str, ServeAppStatus]

    def waiting_for(self, applications: Iterable[str]) -> list[str]:
        """Why the named applications are not yet verified; empty when they all run healthy."""
        if not self.observed:
            return [f"KubeRay has not reconciled generation {self.generation} of {self.namespace}/{self.name} yet"]
        if self.upgrading:
            return [
                f"KubeRay is upgrading {self.namespace}/{self.name} to a new RayCluster "
                f"({self.pending_cluster_name or 'pending'}); the active cluster's statuses are not the new config's"
            ]
        reasons = []
        for name in applications:
            app = self.applications.get(name)
            if app is None:
                reasons.append(f"{name}: not reported by KubeRay")
            elif app.status != "RUNNING":
                reasons.append(f"{name}: {app.status}" + (f" ({app.message})" if app.message else ""))
            else:
                reasons += [
                    f"{name}/{dep.name}: {dep.status}" for dep in app.deployments.values() if dep.status != "HEALTHY"
                ]
        return reasons


def status(adapter: KubeAdapter, namespace: str, name: str) -> RayServiceHealth:
    service = adapter.get_rayservice(namespace, name)
    return RayServiceHealth(
        namespace=namespace,
        name=name,
        generation=service.generation,
        observed=service.observed,
        ready=service.status.ready,
        upgrading=service.status.upgrading,
        service_status=service.status.service_status,
        cluster_name=service.status.active.cluster_name,
        pending_cluster_name=service.status.pending.cluster_name,
        applications=service.status.active.applications,
    )
