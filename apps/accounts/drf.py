"""DRF glue: team-scoped roles, and Django validation errors as API errors."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from apps.accounts.models import Role
from apps.accounts.permissions import has_role


def require_role(request, team, needed: Role, what: str) -> None:
    from rest_framework.exceptions import PermissionDenied

    if not has_role(request.user, team, needed):
        raise PermissionDenied(f"You need the {needed.label.lower()} role in team {team} to {what}.")


def as_api_error(exc: DjangoValidationError) -> serializers.ValidationError:
    """A service's refusal, with every message, as a 400 the API client can read."""
    return serializers.ValidationError({"detail": exc.messages})
