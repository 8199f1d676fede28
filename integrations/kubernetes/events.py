"""Events (core v1), as the adapter reads them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from integrations.kubernetes.fields import (
    as_dict,
    as_int,
    as_str,
    meta_of,
    parse_time,
)


@dataclass(frozen=True)
class Event:
    namespace: str
    name: str
    type: str  # Normal | Warning
    reason: str
    message: str
    involved_kind: str
    involved_name: str
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    source: str


def parse_event(raw: dict[str, Any]) -> Event:
    meta, involved = meta_of(raw), as_dict(raw.get("involvedObject"))
    series = as_dict(raw.get("series"))
    first = parse_time(raw.get("firstTimestamp")) or parse_time(raw.get("eventTime"))
    last = parse_time(raw.get("lastTimestamp")) or parse_time(series.get("lastObservedTime")) or first
    source = as_dict(raw.get("source"))
    return Event(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        type=as_str(raw.get("type")),
        reason=as_str(raw.get("reason")),
        message=as_str(raw.get("message"))[:2000],
        involved_kind=as_str(involved.get("kind")),
        involved_name=as_str(involved.get("name")),
        count=as_int(raw.get("count")) or as_int(series.get("count")) or 1,
        first_seen=first,
        last_seen=last,
        source=as_str(source.get("component")) or as_str(raw.get("reportingComponent")),
    )
