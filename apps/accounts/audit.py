"""The audit log: every write goes through `record`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models

from apps.accounts.models import AuditEvent, Team
from apps.core.redaction import redact_anywhere


def client_ip(request) -> str | None:
    """The address that connected to us, or behind FLEETDECK_BEHIND_TLS_PROXY the one our proxy
    saw: the last X-Forwarded-For entry, which that proxy appended. The entries before it are
    whatever the client sent."""
    remote = request.META.get("REMOTE_ADDR") or None
    if not settings.FLEETDECK_PROXY_COUNT:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    return hops[-settings.FLEETDECK_PROXY_COUNT] if len(hops) >= settings.FLEETDECK_PROXY_COUNT else remote


@dataclass(frozen=True)
class Actor:
    """Who performs a write, and from where. Built once per request, task or command."""

    user: Any = None
    source_ip: str | None = None
    user_agent: str = ""
    via: str = "ui"

    @classmethod
    def from_request(cls, request, via: str | None = None) -> Actor:
        ip = client_ip(request)
        user = request.user if getattr(request, "user", None) and request.user.is_authenticated else None
        return cls(
            user=user,
            source_ip=ip,
            user_agent=request.META.get("HTTP_USER_AGENT", "")[:300],
            via=via or ("api" if request.path.startswith("/api/") else "ui"),
        )

    @classmethod
    def system(cls, via: str = "worker") -> Actor:
        return cls(via=via)

    @property
    def name(self) -> str:
        return self.user.get_username() if self.user else f"system:{self.via}"


def record(
    actor: Actor,
    action: str,
    obj: models.Model | None = None,
    *,
    team: Team | None = None,
    changes: dict | None = None,
    object_repr: str = "",
) -> AuditEvent:
    """One audit entry. Its `changes` are kept without the secrets Fleetdeck knows of (env vars,
    request headers, engine credentials), wherever in them a caller put a config or a request."""
    return AuditEvent.objects.create(
        actor=actor.user,
        actor_name=actor.name,
        action=action,
        team=team,
        object_type=obj._meta.label_lower if obj is not None else "",
        object_id=str(obj.pk) if obj is not None and obj.pk is not None else "",
        object_repr=(object_repr or (str(obj) if obj is not None else ""))[:200],
        changes=redact_anywhere(changes or {}),
        source_ip=actor.source_ip,
        user_agent=actor.user_agent,
        via=actor.via,
    )
