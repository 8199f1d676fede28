"""DRF glue for team-scoped roles."""

from __future__ import annotations

from apps.accounts.models import Role
from apps.accounts.permissions import has_role


def require_role(request, team, needed: Role, what: str) -> None:
    from rest_framework.exceptions import PermissionDenied

    if not has_role(request.user, team, needed):
        raise PermissionDenied(f"You need the {needed.label.lower()} role in team {team} to {what}.")
