"""Where a change's config is written, by who owns a cluster's Serve config. The dashboard
writer PUTs through the Ray dashboard; the app that manages another owner registers its writer
here (the Kubernetes app, for a KubeRay RayService, which would silently revert a push through
the dashboard). A cluster whose owner has no registered writer is never pushed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from apps.changes.dashboard_writer import DashboardWriter
from apps.clusters.models import Cluster


class WriterUnavailable(Exception):
    pass


class ConfigWriter(Protocol):
    def push(self, config: dict) -> None: ...


class ReadBackWriter(ConfigWriter, Protocol):
    """A writer that raises AdapterError (the RayService writer): a push whose answer was lost may
    have landed, and `may_hold` reads back whether the cluster may hold `config`."""

    def may_hold(self, config: dict) -> bool: ...


@dataclass(frozen=True)
class _Registered:
    writer: Callable[..., ConfigWriter]
    waiting_for: Callable[[Cluster, list[str]], list[str]]


def _nothing_pending(cluster: Cluster, applications: list[str]) -> list[str]:
    return []


_writers: dict[str, _Registered] = {
    Cluster.ConfigOwner.DASHBOARD: _Registered(
        lambda cluster, planned_base=None: DashboardWriter(cluster), _nothing_pending
    )
}


def register(
    owner: str,
    writer: Callable[..., ConfigWriter],
    *,
    waiting_for: Callable[[Cluster, list[str]], list[str]] = _nothing_pending,
) -> None:
    """`writer(cluster, planned_base=...)` builds the writer for a cluster of this config owner,
    or raises WriterUnavailable; `waiting_for(cluster, applications)` says what the owner still
    reports as not done after a push."""
    _writers[owner] = _Registered(writer, waiting_for)


def writer_for(cluster: Cluster, *, planned_base: dict | None = None) -> ConfigWriter:
    """`planned_base`, for a forward push, is the config the change was planned against: the
    RayService writer checks serveConfigV2 still holds it (the dashboard writer relies on the
    protocol's drift check, since the dashboard is then the source of truth)."""
    return _registered(cluster).writer(cluster, planned_base=planned_base)


def owner_waiting_for(cluster: Cluster, applications: list[str]) -> list[str]:
    """What the config's owner still reports as not done, beyond the dashboard: for a RayService,
    KubeRay must have reconciled the new generation and report the applications healthy."""
    registered = _writers.get(cluster.serve_config_owner)
    return registered.waiting_for(cluster, applications) if registered else []


def _registered(cluster: Cluster) -> _Registered:
    registered = _writers.get(cluster.serve_config_owner)
    if registered is None:
        raise WriterUnavailable(f"{cluster.name}'s Serve config owner {cluster.serve_config_owner!r} has no writer.")
    return registered
