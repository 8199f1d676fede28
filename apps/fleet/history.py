"""Reading config history: which revision precedes which, and their diff (secrets redacted)."""

from __future__ import annotations

from apps.core.redaction import redact_config
from apps.fleet.configs import unified_diff
from apps.fleet.models import ConfigRevision


def previous_revision(revision: ConfigRevision) -> ConfigRevision | None:
    return (
        ConfigRevision.objects.filter(application_id=revision.application_id, observed_at__lte=revision.observed_at)
        .exclude(pk=revision.pk)
        .filter(pk__lt=revision.pk)
        .order_by("-observed_at", "-pk")
        .first()
    )


def revision_diff(old: ConfigRevision | None, new: ConfigRevision) -> list[str]:
    old_label = f"{old.config_hash[:12]} ({old.observed_at:%Y-%m-%d %H:%M:%S})" if old else "nothing"
    new_label = f"{new.config_hash[:12]} ({new.observed_at:%Y-%m-%d %H:%M:%S})"
    # Placeholders carry a digest of the value: a rotated secret still shows as a changed line.
    return unified_diff(
        redact_config(old.config) if old else {}, redact_config(new.config), old_label=old_label, new_label=new_label
    )
