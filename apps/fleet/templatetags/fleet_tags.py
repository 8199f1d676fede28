import calendar
import json

from django import template

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
def num(value) -> str:
    """Numbers as an operator reads them: 4.0 → 4, None → —."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@register.filter
def percent(value) -> str:
    """A share as a percentage: 0.05 → 5 %, 0.1234 → 12.3 %, None → —."""
    if value is None or value == "":
        return "—"
    shown = f"{float(value) * 100:.1f}".removesuffix(".0")
    return f"{shown}\xa0%"


@register.filter
def weekdays(days) -> str:
    """Maintenance window days as names: 0 is Monday, as Python's weekday() counts."""
    return ", ".join(calendar.day_abbr[int(d)] for d in sorted(days or []) if str(d).isdigit() and 0 <= int(d) <= 6)
