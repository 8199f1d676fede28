from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.audit import Actor
from apps.accounts.services import rotate_token


class Command(BaseCommand):
    help = "Create (or replace) a user's API token and print it. The previous token stops working."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"No user named {username!r}.") from exc
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive; activate it before issuing a token.")
        self.stdout.write(rotate_token(Actor.system(via="cli"), user))
