"""Account writes shared by management commands, the admin and the local runner."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils.text import slugify
from rest_framework.authtoken.models import Token

from apps.accounts.audit import Actor, record
from apps.accounts.models import Membership, Role, Team


def ensure_team(name: str) -> Team:
    team, _ = Team.objects.get_or_create(slug=slugify(name), defaults={"name": name})
    return team


def grant(actor: Actor, user, team: Team, role: Role) -> Membership:
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    record(actor, "team.grant", membership, team=team, changes={"user": user.get_username(), "role": role})
    return membership


def rotate_token(actor: Actor, user) -> str:
    """Replace the user's API token with a new one and return it; the old one stops working."""
    Token.objects.filter(user=user).delete()
    token = Token.objects.create(user=user)
    record(actor, "token.rotate", user, object_repr=user.get_username())
    return token.key


def token_expires_at(token: Token) -> datetime:
    return token.created + timedelta(days=settings.FLEETDECK_API_TOKEN_TTL_DAYS)
