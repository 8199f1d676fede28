"""Validation of what an operator types about a cluster: one place for forms and serializers."""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ValidationError

from apps.clusters import network_policy
from apps.clusters.network_policy import NetworkPolicy

LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
LABEL_KEY_RULE = "lowercase letters, digits, '.', '_', '-', '/', at most 63 characters"
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$|^$")
MAX_LABELS = 32
# A bearer token travels in an HTTP header, which carries visible ASCII only.
TOKEN = re.compile(r"^[\x21-\x7e]*$")


def normalize_dashboard_url(raw: str) -> str:
    """Return the canonical form of a dashboard URL or raise ValidationError saying what is wrong."""
    url = (raw or "").strip()
    if not url:
        raise ValidationError("Enter the Ray dashboard URL, e.g. http://ray-head.example:8265.")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValidationError("The dashboard URL must start with http:// or https://.")
    if parts.username is not None or parts.password is not None:
        raise ValidationError(
            "Do not put credentials in the URL; give the dashboard token in the token field, "
            "where it is stored encrypted."
        )
    if not parts.hostname:
        raise ValidationError("The dashboard URL has no host name.")
    if parts.query or parts.fragment:
        raise ValidationError("The dashboard URL must not have a query string or fragment.")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValidationError("The dashboard URL has an invalid port.") from exc
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def normalize_optional_url(raw: str) -> str:
    """A metrics, Prometheus or Serve URL: empty stays empty, anything else is a dashboard-like URL."""
    return normalize_dashboard_url(raw) if (raw or "").strip() else ""


def validate_token(raw: str) -> str:
    token = (raw or "").strip()
    if not TOKEN.match(token):
        raise ValidationError("The token must be printable ASCII without spaces, as Ray issues it.")
    return token


def check_network_policy(url: str, policy: NetworkPolicy | None = None) -> None:
    """Refuse a URL whose host resolves to an address Fleetdeck may not call (network_policy.py).
    Connections are checked again, address by address, when they are made (egress.py)."""
    policy = policy or network_policy.for_team(None)
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except (socket.gaierror, UnicodeError) as exc:
        raise ValidationError(f"The host {parts.hostname!r} cannot be resolved.") from exc
    for info in infos:
        reason = policy.refusal(parts.hostname, info[4][0].split("%")[0])
        if reason:
            raise ValidationError(reason)


def checked_url(raw: str, team=None) -> str:
    """A URL Fleetdeck may call for `team`: well-formed and inside that team's network policy."""
    url = normalize_dashboard_url(raw)
    check_network_policy(url, network_policy.for_team(team))
    return url


def validate_labels(labels) -> dict[str, str]:
    if labels in (None, ""):
        return {}
    if not isinstance(labels, dict):
        raise ValidationError("Labels must be an object of key: value strings.")
    if len(labels) > MAX_LABELS:
        raise ValidationError(f"At most {MAX_LABELS} labels.")
    clean: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise ValidationError(f"Label key {key!r} is invalid: {LABEL_KEY_RULE}.")
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            raise ValidationError(
                f"Label value {value!r} for {key!r} is invalid: letters, digits, '.', '_', '-', at most 63 characters."
            )
        clean[key] = value
    return dict(sorted(clean.items()))


def parse_label_selector(text: str) -> tuple[str, str | None]:
    """A label filter, `key=value` or `key`, as (key, value) or (key, None). No stored label has a key
    outside the grammar, so such a key is a mistake to point out rather than a filter that matches
    nothing; either way it is looked up as one literal key (`apps.clusters.labels`), never as a lookup."""
    key, equals, value = text.partition("=")
    key = key.strip()
    if not LABEL_KEY.match(key):
        raise ValidationError(f"A label filter is key=value or key; {key!r} is not a label key: {LABEL_KEY_RULE}.")
    return key, value.strip() if equals else None


def parse_labels_text(text: str) -> dict[str, str]:
    """Parse 'env=prod, region=eu' (the form's text field) into a dict."""
    labels: dict[str, str] = {}
    for chunk in re.split(r"[,\n]", text or ""):
        chunk = chunk.strip()
        if not chunk:
            continue
        if "=" not in chunk:
            raise ValidationError(f"Label {chunk!r} needs the form key=value.")
        key, value = (part.strip() for part in chunk.split("=", 1))
        labels[key] = value
    return validate_labels(labels)


def labels_text(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in (labels or {}).items())
