"""Heartbeats of the worker and beat, and the rule that calls them stale."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from apps.core import ticks
from apps.core.jobs import Job
from apps.liveness.models import Heartbeat, TickFailure

logger = logging.getLogger(__name__)

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


def run_tick(send: Callable[[Job], None]) -> list[str]:
    """Run every tick handler, each on its own, sending the jobs it yields. One that raises is
    logged with its name and counted, and the others run: a bug or a bad row behind one app's
    periodic work must not stop every team's syncs. Returns the names of those that raised."""
    failing = set(TickFailure.objects.filter(consecutive__gt=0).values_list("handler", flat=True))
    failed = []
    for name, handler in ticks.named_handlers():
        try:
            # No transaction around it: a handler commits what it claims before the job it sends
            # reads it, as it always did (those that need one open their own).
            result = handler()
            # A handler may return how many rows it handled (the prunes): only jobs are sent.
            for job in result if isinstance(result, Iterable) else ():
                send(job)
        except Exception as exc:
            logger.exception("Tick handler %s failed; the other handlers ran.", name)
            _record_failure(name, exc)
            failed.append(name)
        else:
            if name in failing:
                TickFailure.objects.filter(handler=name).update(consecutive=0)
    return failed


def _record_failure(name: str, exc: Exception) -> None:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    now = timezone.now()
    updated = TickFailure.objects.filter(handler=name).update(
        failures=F("failures") + 1, consecutive=F("consecutive") + 1, last_error=error, last_failed_at=now
    )
    if not updated:
        TickFailure.objects.get_or_create(
            handler=name, defaults={"failures": 1, "consecutive": 1, "last_error": error, "last_failed_at": now}
        )


@dataclass(frozen=True)
class Liveness:
    worker_at: datetime | None
    beat_at: datetime | None
    now: datetime
    stale_after: timedelta
    # Tick handlers that raised on their last run: (name, ticks in a row, since when).
    failing_handlers: tuple[tuple[str, int, datetime], ...] = field(default=())

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
    failing = TickFailure.objects.filter(consecutive__gt=0).order_by("handler")
    return Liveness(
        worker_at=beats.get(Heartbeat.Process.WORKER),
        beat_at=beats.get(Heartbeat.Process.BEAT),
        failing_handlers=tuple(failing.values_list("handler", "consecutive", "last_failed_at")),
        now=now or timezone.now(),
        stale_after=timedelta(seconds=STALE_AFTER_TICKS * settings.FLEETDECK_TICK_INTERVAL_S),
    )
