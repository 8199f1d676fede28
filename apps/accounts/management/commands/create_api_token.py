from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from rest_framework.authtoken.models import Token

from apps.accounts.audit import Actor
from apps.accounts.services import rotate_token, token_expires_at


class Command(BaseCommand):
    help = (
        "Create (or replace) a user's API token and print it. The previous token stops working; the new one "
        "expires after FLEETDECK_API_TOKEN_TTL_DAYS, and the date goes to stderr."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"No user named {username!r}.") from exc
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive; activate it before issuing a token.")
        key = rotate_token(Actor.system(via="cli"), user)
        self.stdout.write(key)
        # Not on stdout, which `TOKEN=$(make token USER=…)` takes whole as the token; and plain,
        # not in the error red Django gives stderr on a terminal: it is a note, not a failure.
        expires = timezone.localdate(token_expires_at(Token.objects.get(key=key)))
        self.stderr.write(
            f"This token expires on {expires:%Y-%m-%d}, {settings.FLEETDECK_API_TOKEN_TTL_DAYS} days after it was "
            "issued (FLEETDECK_API_TOKEN_TTL_DAYS).",
            style_func=str,
        )
