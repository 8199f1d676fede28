"""What apps above the fleet did on a cluster, for the pages that tell what happened around a
moment (an incident's timeline). Each app registers a source in its `AppConfig.ready()`, so the
pages read every app's work without importing the apps that did it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Activity:
    cluster_id: int
    deployment_id: int | None
    created_at: datetime  # when it was recorded: what a look back filters on
    at: datetime  # when it happened, as shown
    kind: str
    id: int
    text: str


# Everything a source recorded on any of `clusters` since `since`, in the order it was recorded;
# one query per source whatever the number of clusters.
Source = Callable[[set[int], datetime], list[Activity]]

_sources: dict[str, Source] = {}


def register(name: str, source: Source) -> None:
    """Registered again under the same name, `source` replaces the earlier one."""
    _sources[name] = source


def since(clusters: set[int], moment: datetime) -> list[Activity]:
    return [item for source in _sources.values() for item in source(clusters, moment)]
