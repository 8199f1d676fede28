"""Secrets inside stored JSON, encrypted at rest.

A push sends the whole cluster's Serve config to Ray, so Fleetdeck keeps configs with their real
`env_vars`, vLLM credentials and request headers (apps.core.redaction says which values those are,
and replaces them on every read path). In the database each of those values is sealed: replaced by
`sealed:` and its ciphertext under FLEETDECK_ENCRYPTION_KEYS, so a database dump or backup holds no
credential. The field opens them as it reads a row, so every other module sees the real config.

Fernet ciphertexts differ at every write: a sealed column is never compared in SQL (configs are
compared by their hashes)."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.apps import apps
from django.db import migrations

from apps.core import redaction, secrets
from apps.core.fields import JSONField

logger = logging.getLogger(__name__)

PREFIX = "sealed:"
# What a stored value is: a Serve config (or anything holding env_vars/engine_kwargs/headers
# mappings), an RFC 6902 patch between configs, or a mapping of HTTP headers itself.
CONFIG, PATCH, HEADERS = "config", "patch", "headers"


def is_sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def _seal_value(value: Any) -> Any:
    if is_sealed(value) or redaction.is_placeholder(value):
        return value
    return PREFIX + secrets.encrypt(json.dumps(value))


def _open_value(value: Any) -> Any:
    if not is_sealed(value):
        return value
    try:
        return json.loads(secrets.decrypt(value.removeprefix(PREFIX)))
    except secrets.SecretUnreadable:
        # Left sealed, so a page still opens; rotate_secrets counts it, and a push of it fails at Ray.
        logger.warning("A sealed secret in a stored config cannot be decrypted with FLEETDECK_ENCRYPTION_KEYS.")
        return value


def _map(value: Any, kind: str, leaf) -> Any:
    if kind == HEADERS:
        return redaction.map_secrets({"headers": value}, leaf)["headers"] if isinstance(value, dict) else value
    if kind == PATCH:
        return redaction.map_patch_secrets(value, leaf)
    return redaction.map_secrets(value, leaf)


def seal(value: Any, kind: str = CONFIG) -> Any:
    return _map(value, kind, _seal_value)


def unseal(value: Any, kind: str = CONFIG) -> Any:
    return _map(value, kind, _open_value)


# Every sealed column: the migration that sealed what was stored, and `manage.py rotate_secrets`, walk these.
SEALED_FIELDS: list[tuple[str, str, str]] = [
    ("fleet.Application", "deployed_app_config", CONFIG),
    ("fleet.Deployment", "effective_config", CONFIG),
    ("fleet.Deployment", "submitted_config", CONFIG),
    ("fleet.ConfigRevision", "config", CONFIG),
    ("changes.Preset", "options", CONFIG),
    ("changes.Rollout", "options", CONFIG),
    ("changes.Change", "patch", CONFIG),
    ("changes.Change", "base_config", CONFIG),
    ("changes.Change", "new_config", CONFIG),
    ("changes.Change", "json_patch", PATCH),
    ("maintenance.WarmupProfile", "headers", HEADERS),
]


def seal_stored(model, field: str, kind: str, *, undo: bool = False) -> int:
    """Seal the secrets `model`'s rows hold in `field` as plain JSON (or open them, `undo`): a data
    migration's step, on the historical model (a plain JSONField). Returns the rows rewritten."""
    rewritten = 0
    for pk, value in model.objects.values_list("pk", field).iterator():
        sealed = (unseal if undo else seal)(value, kind)
        if sealed is not value:
            model.objects.filter(pk=pk).update(**{field: sealed})
            rewritten += 1
    return rewritten


def sealing(app_label: str) -> migrations.RunPython:
    """The data migration that seals the secrets of `app_label`'s sealed columns (and opens them
    again when it is undone), on the historical models."""

    def run(historical_apps, schema_editor, undo: bool = False) -> None:
        for label, field, kind in SEALED_FIELDS:
            owner, model_name = label.split(".")
            if owner == app_label:
                seal_stored(historical_apps.get_model(owner, model_name), field, kind, undo=undo)

    def undo(historical_apps, schema_editor) -> None:
        run(historical_apps, schema_editor, undo=True)

    return migrations.RunPython(run, undo)


def reseal() -> dict[str, int]:
    """Seal every stored secret again under the first key (they open with any listed key as they
    are read). Returns rows rewritten per field, and "unreadable": values no key opens."""
    counts: dict[str, int] = {"unreadable": 0}
    for label, field, kind in SEALED_FIELDS:
        model = apps.get_model(label)
        rewritten = 0
        for pk, value in model.objects.values_list("pk", field).iterator():
            held: list[Any] = []
            _map(value, kind, lambda secret: held.append(secret) or secret)  # noqa: B023 (called before the loop moves on)
            if not held:
                continue
            if any(is_sealed(secret) for secret in held):
                counts["unreadable"] += 1
                continue
            model.objects.filter(pk=pk).update(**{field: value})
            rewritten += 1
        counts[f"{label}.{field}"] = rewritten
    return counts


class SealedJSONField(JSONField):
    """A JSONField whose secrets are sealed in the database and open in Python. Its column and
    migrations are a plain JSONField's (`deconstruct` keeps `kind` out), so swapping it in writes
    no schema migration; a data migration seals what is already stored."""

    def __init__(self, *args, kind: str = CONFIG, **kwargs):
        self.kind = kind
        super().__init__(*args, **kwargs)

    def get_prep_value(self, value):
        return super().get_prep_value(seal(value, self.kind))

    def from_db_value(self, value, expression, connection):
        # Most stored configs hold no secret: a substring test keeps their decoding as it was.
        sealed = PREFIX in value if type(value) is str else value is not None
        value = super().from_db_value(value, expression, connection)
        return unseal(value, self.kind) if sealed else value
