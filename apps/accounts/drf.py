"""DRF glue for team-scoped roles and Django validation errors."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from apps.accounts.models import Role
from apps.accounts.permissions import has_role


def require_role(request, team, needed: Role, what: str) -> None:
    from rest_framework.exceptions import PermissionDenied

    if not has_role(request.user, team, needed):
        raise PermissionDenied(f"You need the {needed.label.lower()} role in team {team} to {what}.")


def as_drf_error(exc: DjangoValidationError, field: str | None = None) -> serializers.ValidationError:
    messages = exc.messages
    return serializers.ValidationError({field: messages} if field else messages)
