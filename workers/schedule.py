"""The beat schedule, built in one place. Each entry expires before its next run is due."""

from django.conf import settings


def beat_schedule() -> dict:
    interval = settings.FLEETDECK_TICK_INTERVAL_S
    return {
        "fleetdeck-tick": {
            "task": "fleet.tick",
            "schedule": float(interval),
            "options": {"expires": max(interval - 1, 1)},
        }
    }
