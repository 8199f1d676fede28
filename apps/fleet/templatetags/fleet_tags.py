import json

from django import template

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
def num(value) -> str:
    """Numbers as an operator reads them: 4.0 → 4, None → —."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
