from django.core.management.base import BaseCommand, CommandError

from apps.accounts.audit import Actor, record
from apps.core import secrets


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored credential under the first key of FLEETDECK_ENCRYPTION_KEYS. Run it after putting "
        "a new key first; remove the old key only once this reports no unreadable secret."
    )

    def handle(self, *args, **options):
        counts = secrets.rotate()
        unreadable = counts.pop("unreadable")
        record(Actor.system(via="cli"), "secrets.rotate", changes={**counts, "unreadable": unreadable})
        for field, rewritten in counts.items():
            self.stdout.write(f"{field}: {rewritten} re-encrypted")
        if unreadable:
            raise CommandError(
                f"{unreadable} stored secret(s) open with none of the configured keys: they were left as they "
                "were. Add the key they were stored with to FLEETDECK_ENCRYPTION_KEYS and run this again."
            )
