"""Switch the local demo cluster's reference application to one of its shipped configs
(deploy/reference_app/NAME.json) through Fleetdeck's change protocol, so the switch is planned
against the live config, audited, diffed and verified like any change, and shows on the Changes page.

    FLEETDECK_DEBUG=1 .venv/bin/python manage.py demo_config misbehaving
    FLEETDECK_DEBUG=1 .venv/bin/python manage.py demo_config reference
"""

from __future__ import annotations

import json
import time

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.audit import Actor
from apps.changes import protocol
from apps.changes.models import FINAL_STATES, Change, ChangeState
from apps.clusters.models import Cluster
from apps.demo.local_ray import REFERENCE_APP_DIR
from apps.demo.management.commands.runlocal import DEMO_CLUSTER

APPLICATION = "reference"
CONFIGS = ("misbehaving", "reference")


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument(
            "config", choices=CONFIGS, help="misbehaving: reproduces OOM kills under bursts; reference: as shipped."
        )
        parser.add_argument(
            "--cluster",
            default=DEMO_CLUSTER,
            help=f"The registered cluster (default {DEMO_CLUSTER}, as `make run` registers it).",
        )

    def handle(self, *args, config: str, cluster: str, **options):
        target = Cluster.objects.filter(name=cluster).first()
        if target is None:
            raise CommandError(f"No cluster named {cluster!r}: start `make run` first (it registers {DEMO_CLUSTER}).")
        path = REFERENCE_APP_DIR / f"{config}.json"
        app_config = next(app for app in json.loads(path.read_text())["applications"] if app["name"] == APPLICATION)
        actor = Actor.system(via="cli")
        try:
            change = protocol.plan_restore(
                actor,
                target,
                app_configs={APPLICATION: app_config},
                reason=f"Demo: switch {APPLICATION} to {path.relative_to(settings.BASE_DIR)}",
            )
            protocol.request_apply(actor, change)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        self.stdout.write(f"Change #{change.pk} on {target.name} (/changes/{change.pk}/ in Fleetdeck):")
        for op in change.json_patch:
            value = f" {json.dumps(op['value'])}" if "value" in op else ""
            self.stdout.write(f"  {op['op']} {op['path']}{value}")
        # Applied here rather than left to `make run`'s worker, which may be busy with a calibration;
        # when the worker claims it first, this run returns at once and the wait below follows it.
        protocol.run(change.pk)
        change = _wait_final(change, timeout_s=settings.FLEETDECK_CHANGE_VERIFY_TIMEOUT_S * 2 + 60)
        if change.state != ChangeState.SUCCEEDED:
            raise CommandError(
                f"Change #{change.pk} {change.get_state_display().lower()}: {change.error or 'see its step log'}"
            )
        self.stdout.write(
            self.style.SUCCESS(f"{APPLICATION} on {target.name} runs {path.name}: change #{change.pk} verified.")
        )


def _wait_final(change: Change, *, timeout_s: float) -> Change:
    deadline = time.monotonic() + timeout_s
    change.refresh_from_db()
    while change.state not in FINAL_STATES:
        if time.monotonic() > deadline:
            raise CommandError(
                f"Change #{change.pk} is still {change.get_state_display().lower()} after {timeout_s:.0f} s; "
                f"follow it at /changes/{change.pk}/."
            )
        time.sleep(1)
        change.refresh_from_db()
    return change
