"""The pages' shared filters. Every time, duration, size and share on a page goes through one of
these, so the same quantity reads the same everywhere: 24-hour times in FLEETDECK_TIME_ZONE
(`when`, `clock`; the charts format theirs the same way, static/js/clock.js), durations by one rule
(`duration`, `ms`), memory in 1024-based units (`mib`, `mebibytes`), shares as percentages."""

import calendar
import json

from django import template
from django.utils import timezone

from apps.core import redaction, yamltext

register = template.Library()

GOOD = {"RUNNING", "HEALTHY", "ok", "ALIVE"}
BUSY = {"DEPLOYING", "UPDATING", "UPSCALING", "DOWNSCALING", "STARTING", "RECOVERING", "STOPPING", "unknown"}
BAD = {"DEPLOY_FAILED", "UNHEALTHY", "unreachable", "error", "DEAD"}


@register.filter
def status_class(status: str) -> str:
    if status in GOOD:
        return "good"
    if status in BUSY:
        return "busy"
    if status in BAD:
        return "bad"
    return "muted"


@register.filter
def redacted(config):
    """A stored Serve config or options as a page shows them: secrets replaced by placeholders."""
    return redaction.redact_config(config)


@register.filter
def redacted_patch(operations):
    return redaction.redact_patch(operations)


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "diff-file"
    if line.startswith("@@"):
        return "diff-hunk"
    if line.startswith("+"):
        return "diff-add"
    if line.startswith("-"):
        return "diff-del"
    return ""


@register.filter
def human(value, style: str = "words") -> str:
    """Any config value as an operator reads it, never a Python repr. In words for what is observed
    (None → not set, False → no): {'min_replicas': None} → min_replicas: not set. As flow YAML with
    style "yaml", for patches, where a null is sent as null and is no removal:
    {'num_replicas': 1, 'autoscaling_config': None} → {num_replicas: 1, autoscaling_config: null}."""
    if style == "yaml":
        text = yamltext.dump(
            value, default_flow_style=True, sort_keys=False, width=yamltext.NO_FOLDING, allow_unicode=True
        )
        return text.strip().removesuffix("...").strip()
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_nested(item)}" for key, item in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_nested(item) for item in value) or "none"
    return _scalar(value)


def _nested(value) -> str:
    if isinstance(value, dict):
        return "{" + human(value) + "}" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + human(value) + "]" if value else "[]"
    return _scalar(value)


def _scalar(value) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


BINARY_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"]


@register.filter
def mib(value) -> str:
    """Bytes in the units Ray's memory monitor prints (1024-based): 1.4 GiB, 512 MiB; None → —."""
    if value is None or value == "":
        return "—"
    size = float(value)
    unit = 0
    while abs(size) >= 1024 and unit < len(BINARY_UNITS) - 1:
        size /= 1024
        unit += 1
    # A no-break space, so a table cell never wraps a number away from its unit.
    if unit == 0:
        return f"{size:.0f}\xa0B"
    shown = f"{size:.1f}" if abs(size) < 100 else f"{size:.0f}"
    return f"{shown.removesuffix('.0')}\xa0{BINARY_UNITS[unit]}"


@register.filter
def mebibytes(value) -> str:
    """A figure already in MiB, shown as `mib` shows bytes: 318.4 → 318 MiB, 4404 → 4.3 GiB."""
    if value is None or value == "":
        return "—"
    return mib(float(value) * 1024 * 1024)


@register.filter
def when(value, zone: str = "") -> str:
    """A moment as every page shows one: 2026-12-06 15:04:05 in the server's time zone; with
    "tz", its abbreviation after it (where a schedule's zone matters). None → —."""
    if not value:
        return "—"
    local = timezone.localtime(value)
    shown = f"{local:%Y-%m-%d %H:%M:%S}"
    return f"{shown} {local:%Z}" if zone == "tz" else shown


@register.filter
def clock(value, precision: str = "") -> str:
    """The time of day alone, beside a date the reader already has: 15:04:05 (15:04:05.123 with
    "ms", for a step log whose steps come within a second). None → —."""
    if not value:
        return "—"
    local = timezone.localtime(value)
    return f"{local:%H:%M:%S}.{local.microsecond // 1000:03d}" if precision == "ms" else f"{local:%H:%M:%S}"


@register.filter
def duration(seconds) -> str:
    """A duration or latency given in seconds, by one rule: under a second in whole ms (230 ms),
    under 10 minutes in seconds to a tenth (2.4 s, 31 s), above in whole minutes (14 min). None → —."""
    if seconds is None or seconds == "":
        return "—"
    value = float(seconds)
    if abs(value) < 0.9995:  # what would round to 1000 ms reads as 1 s
        return f"{value * 1000:.0f}\xa0ms"
    if abs(value) < 600:
        return f"{value:.1f}".removesuffix(".0") + "\xa0s"
    return f"{value / 60:.0f}\xa0min"


@register.filter
def ms(milliseconds) -> str:
    """A duration given in milliseconds, shown as `duration` shows seconds."""
    if milliseconds is None or milliseconds == "":
        return "—"
    return duration(float(milliseconds) / 1000)


@register.filter
def whole(value) -> str:
    """A quantity read as a whole number, grouped: 12345.6 → 12,346; None → —."""
    if value is None or value == "":
        return "—"
    return f"{round(float(value)):,}"


@register.filter
def num(value) -> str:
    """Numbers as an operator reads them: 4.0 → 4, None → —."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@register.filter
def percent(value, scale: str = "") -> str:
    """A share as a percentage: 0.05 → 5 %, 0.1234 → 12.3 %, None → —; with "100", a figure
    already in percent (a mix's shares): 33.333 → 33.3 %."""
    if value is None or value == "":
        return "—"
    shown = f"{float(value) * (1 if scale == '100' else 100):.1f}".removesuffix(".0")
    return f"{shown}\xa0%"


@register.filter
def weekdays(days) -> str:
    """Maintenance window days as names: 0 is Monday, as Python's weekday() counts."""
    return ", ".join(calendar.day_abbr[int(d)] for d in sorted(days or []) if str(d).isdigit() and 0 <= int(d) <= 6)
