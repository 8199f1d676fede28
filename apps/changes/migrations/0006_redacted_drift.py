import json
import re

from django.db import migrations

from apps.core.redaction import redact_config
from apps.fleet.configs import pretty, unified_diff

HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? ")
WITHHELD = [
    "The drift was recorded before Fleetdeck redacted secrets and could not be redone without them: "
    "re-plan to compare with the cluster's config."
]


def live_config(base: dict, drift: list[str]) -> dict:
    """The live config a drift was taken against: the drift is a unified diff of the pretty base
    config to the pretty live one, so applying it to the base gives the live config back."""
    old, new, at = pretty(base), [], 0
    for line in drift[2:]:
        if hunk := HUNK.match(line):
            start, length = int(hunk[1]), int(hunk[2] if hunk[2] is not None else 1)
            begin = start - 1 if length else start
            new += old[at:begin]
            at = begin
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith((" ", "-")):
            if old[at] != line[1:]:
                raise ValueError("the drift does not apply to the base config")
            if line.startswith(" "):
                new.append(old[at])
            at += 1
    return json.loads("\n".join(new + old[at:]))


def redact(apps, schema_editor):
    Change = apps.get_model("changes", "Change")
    for change in Change.objects.exclude(drift=[]).iterator():
        try:
            live = live_config(change.base_config, change.drift)
        except (ValueError, IndexError):
            drift = WITHHELD
        else:
            drift = unified_diff(
                redact_config(change.base_config),
                redact_config(live),
                old_label="planned against",
                new_label="live now",
            )
        if drift != change.drift:
            change.drift = drift
            change.save(update_fields=["drift"])


class Migration(migrations.Migration):
    """A drift shows what changed on the cluster outside a change, secrets among it: drifts
    recorded before are redone with placeholders, as every drift is recorded now."""

    dependencies = [
        ("changes", "0005_list_count_indexes"),
    ]

    operations = [migrations.RunPython(redact, migrations.RunPython.noop)]
