"""The beat schedule, built in one place. Each entry expires before its next run is due."""

from django.conf import settings

from apps.core import jobs


def beat_schedule() -> dict:
    interval = settings.FLEETDECK_TICK_INTERVAL_S
    return {
        "fleetdeck-tick": {
            "task": jobs.TICK,
            "schedule": float(interval),
            "options": {"expires": max(interval - 1, 1)},
        }
    }
