"""When maintenance is due: windows, cron and every-N-hours slots. Pure functions."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.core.exceptions import ValidationError

MAX_STEPS = 24 * 8  # hours to look ahead for an open window: a week and a day


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(f"Unknown time zone {name!r}; use an IANA name such as Europe/Paris.") from exc


def validate_window(days: list, start_hour: int, end_hour: int, tz: str) -> None:
    zone(tz)
    if not isinstance(days, list) or any(not isinstance(d, int) or not 0 <= d <= 6 for d in days):
        raise ValidationError("Window days are weekday numbers 0–6 (Monday = 0).")
    if len(set(days)) != len(days):
        raise ValidationError("A weekday appears twice in the window.")
    if not (0 <= start_hour <= 23 and 1 <= end_hour <= 24):
        raise ValidationError("Window hours: start 0–23, end 1–24.")
    if start_hour == end_hour:
        raise ValidationError("The window is empty: its start and end hours are the same.")


def validate_timing(every_hours: int | None, cron: str) -> None:
    if bool(every_hours) == bool(cron):
        raise ValidationError("Give either every_hours or a cron expression, exactly one.")
    if every_hours is not None and not 1 <= every_hours <= 24 * 30:
        raise ValidationError("every_hours must be between 1 and 720.")
    if cron and not croniter.is_valid(cron):
        raise ValidationError(f"{cron!r} is not a valid 5-field cron expression (minute hour day month weekday).")


def in_window(moment: datetime, days: list, start_hour: int, end_hour: int, tz: str) -> bool:
    local = moment.astimezone(zone(tz))
    if start_hour < end_hour:
        day, inside = local.weekday(), start_hour <= local.hour < end_hour
    else:  # wraps past midnight: the early hours belong to the previous day's window
        inside = local.hour >= start_hour or local.hour < end_hour
        day = local.weekday() if local.hour >= start_hour else (local.weekday() - 1) % 7
    return inside and (not days or day in days)


def next_opening(moment: datetime, days: list, start_hour: int, end_hour: int, tz: str) -> datetime | None:
    """`moment` if inside the window, else the start of the next hour that is."""
    if in_window(moment, days, start_hour, end_hour, tz):
        return moment
    hour = moment.replace(minute=0, second=0, microsecond=0)
    for _ in range(MAX_STEPS):
        hour += timedelta(hours=1)
        if in_window(hour, days, start_hour, end_hour, tz):
            return hour
    return None


def next_slot(
    *, after: datetime, every_hours: int | None, cron: str, days: list, start_hour: int, end_hour: int, tz: str
) -> datetime | None:
    """The next moment after `after` the schedule runs. Missed slots are not replayed: after
    downtime the next run is the first slot after now."""
    window = (days, start_hour, end_hour, tz)
    if cron:
        it = croniter(cron, after.astimezone(zone(tz)))
        for _ in range(2000):
            candidate = it.get_next(datetime)
            if in_window(candidate, *window):
                return candidate
        return None
    return next_opening(after + timedelta(hours=every_hours), *window)
