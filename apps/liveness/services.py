"""Heartbeats of the worker and beat, and the rule that calls them stale."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.liveness.models import Heartbeat

# Missing this many ticks in a row means the process is down, not merely busy or late.
STALE_AFTER_TICKS = 3


def record(process: Heartbeat.Process, at: datetime | None = None) -> None:
    """One upsert: the heartbeat is written every tick and must cost one statement."""
    Heartbeat.objects.bulk_create(
        [Heartbeat(process=process, at=at or timezone.now())],
        update_conflicts=True,
        unique_fields=["process"],
        update_fields=["at"],
    )


@dataclass(frozen=True)
class Liveness:
    worker_at: datetime | None
    beat_at: datetime | None
    now: datetime
    stale_after: timedelta

    def _stale(self, at: datetime | None) -> bool:
        return at is None or self.now - at > self.stale_after

    @property
    def worker_stale(self) -> bool:
        return self._stale(self.worker_at)

    @property
    def beat_stale(self) -> bool:
        return self._stale(self.beat_at)

    @property
    def stalled(self) -> str | None:
        """The process to name when no tick has run for too long, None while ticks run. Without
        ticks the worker's own state is unknown, so beat is named once its heartbeat is stale too;
        a beat that never recorded one is not blamed."""
        if not self.worker_stale:
            return None
        return "beat" if self.beat_at is not None and self.beat_stale else "worker"

    @property
    def stalled_since(self) -> datetime | None:
        return self.beat_at if self.stalled == "beat" else self.worker_at

    @property
    def since_label(self) -> str | None:
        """The time in the page's timezone; with the date when it is not today's."""
        if self.stalled_since is None:
            return None
        since = timezone.localtime(self.stalled_since)
        return f"{since:%H:%M}" if since.date() == timezone.localtime(self.now).date() else f"{since:%d %b %H:%M}"


def current(now: datetime | None = None) -> Liveness:
    beats = dict(Heartbeat.objects.values_list("process", "at"))
    return Liveness(
        worker_at=beats.get(Heartbeat.Process.WORKER),
        beat_at=beats.get(Heartbeat.Process.BEAT),
        now=now or timezone.now(),
        stale_after=timedelta(seconds=STALE_AFTER_TICKS * settings.FLEETDECK_TICK_INTERVAL_S),
    )
