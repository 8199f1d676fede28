"""Client of outgoing incident webhooks: the only code that POSTs to teams' endpoints."""

from __future__ import annotations

import hashlib
import hmac
import json
from urllib.parse import urlsplit

import httpx

from integrations.egress import AnswerTooSlow, PinnedTransport
from integrations.errors import AdapterError

USER_AGENT = "fleetdeck-webhook/1"


class DeliveryError(AdapterError):
    """The endpoint did not take the webhook."""


def shown(url: str) -> str:
    """What of a webhook URL may be shown or logged: its scheme and host. Slack-style endpoints
    carry their secret in the path, others in the query, so everything after the host goes."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"


def post(
    url: str,
    payload: dict | list,
    *,
    secret: str = "",
    timeout_s: float = 5.0,
    transport: httpx.BaseTransport | None = None,
) -> int:
    body = json.dumps(payload, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if secret:
        headers["X-Fleetdeck-Signature"] = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # The worker logs the errors below and the API shows them with the webhook: they name it only as shown.
    endpoint = shown(url)
    try:
        with httpx.Client(
            timeout=timeout_s, follow_redirects=False, trust_env=False, transport=transport or PinnedTransport()
        ) as client:
            response = client.post(url, content=body, headers=headers)
    except AnswerTooSlow as exc:
        # Its own message names the deadline and the setting; "did not answer in time" would hide it.
        raise DeliveryError(str(exc), transient=True) from exc
    except httpx.TimeoutException as exc:
        raise DeliveryError(f"{endpoint} did not answer in time.", transient=True) from exc
    except httpx.TransportError as exc:
        raise DeliveryError(f"Cannot reach {endpoint}: {str(exc) or exc.__class__.__name__}.", transient=True) from exc
    if response.status_code >= 500 or response.status_code == 429:
        raise DeliveryError(
            f"{endpoint} answered HTTP {response.status_code}.", transient=True, status=response.status_code
        )
    if response.status_code >= 300:
        raise DeliveryError(
            f"{endpoint} answered HTTP {response.status_code}; not retried.",
            transient=False,
            status=response.status_code,
        )
    return response.status_code
