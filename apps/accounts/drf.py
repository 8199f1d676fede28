"""DRF glue: team-scoped roles and related fields, and Django validation errors as API errors."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from apps.accounts import access
from apps.accounts.models import Role


def require_role(request, team, needed: Role, what: str) -> None:
    access.require(request.user, team, needed, what)


class VisibleRelatedField:
    """A related field that finds only what the requesting user may see: naming another team's
    object is refused exactly like naming one that does not exist. Needs the request in the
    serializer's context."""

    def get_queryset(self):
        request = self.context.get("request")
        return access.visible(getattr(request, "user", None), super().get_queryset())


class VisiblePrimaryKeyRelatedField(VisibleRelatedField, serializers.PrimaryKeyRelatedField):
    pass


class VisibleSlugRelatedField(VisibleRelatedField, serializers.SlugRelatedField):
    pass


def as_api_error(exc: DjangoValidationError) -> serializers.ValidationError:
    """A service's refusal, with every message, as a 400 the API client can read."""
    return serializers.ValidationError({"detail": exc.messages})
