from django.core.management.base import BaseCommand, CommandError

from apps.accounts.audit import Actor, record
from apps.core import sealed, secrets


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored credential, and every secret sealed in a stored config, under the first key of "
        "FLEETDECK_ENCRYPTION_KEYS. Run it after putting a new key first; remove the old key only once this reports "
        "no unreadable secret."
    )

    def handle(self, *args, **options):
        counts = secrets.rotate()
        resealed = sealed.reseal()
        unreadable = counts.pop("unreadable") + resealed.pop("unreadable")
        counts.update(resealed)
        record(Actor.system(via="cli"), "secrets.rotate", changes={**counts, "unreadable": unreadable})
        for field, rewritten in counts.items():
            self.stdout.write(f"{field}: {rewritten} re-encrypted")
        if unreadable:
            raise CommandError(
                f"{unreadable} stored secret(s) open with none of the configured keys: they were left as they "
                "were. Add the key they were stored with to FLEETDECK_ENCRYPTION_KEYS and run this again."
            )
