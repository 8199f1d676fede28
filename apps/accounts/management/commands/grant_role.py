from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.audit import Actor
from apps.accounts.models import Role
from apps.accounts.services import ensure_team, grant


class Command(BaseCommand):
    help = "Give a user a role (viewer, operator, admin) in a team, creating the team if needed."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("team")
        parser.add_argument("role", choices=[role.value for role in Role])

    def handle(self, *args, username: str, team: str, role: str, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"No user named {username!r}.") from exc
        membership = grant(Actor.system(via="cli"), user, ensure_team(team), Role(role))
        self.stdout.write(f"{user.get_username()} is now {membership.role} of {membership.team.name}")
