"""Domain errors every layer may raise and every interface answers the same way."""

from django.core.exceptions import ValidationError


class Conflict(ValidationError):
    """Refused because the object moved on meanwhile, or another operation holds it; nothing was
    changed. Pages show it like any refusal; the API answers 409 (apps.accounts.drf)."""
