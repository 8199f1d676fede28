"""Preset writes: built-ins installed from data, custom presets validated with Serve's schema."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

from apps.accounts.audit import Actor, record
from apps.accounts.models import Team
from apps.changes.builtin_presets import BUILTIN_PRESETS
from apps.changes.models import Preset
from apps.changes.validation import validate_options
from apps.core.redaction import PlaceholderUnmatched, redact_config, restore_placeholders, secret_values


def install_builtin_presets(**kwargs) -> None:
    """Idempotent upsert after every migrate, so editing the data file updates the presets."""
    for data in BUILTIN_PRESETS:
        Preset.objects.update_or_create(
            slug=data["slug"],
            defaults={
                "name": data["name"],
                "description": data["description"],
                "options": data["options"],
                "remedies": data["remedies"],
                "builtin": True,
                "team": None,
            },
        )


def _unique_slug(name: str) -> str:
    base = slugify(name)[:70] or "preset"
    slug, n = base, 2
    while Preset.objects.filter(slug=slug).exists():
        slug, n = f"{base}-{n}", n + 1
    return slug


def _with_values(options: dict, stored: dict) -> dict:
    """`options` with the values of the placeholders an edit form or a client copied from `stored`."""
    try:
        return restore_placeholders(options, secret_values(stored))
    except PlaceholderUnmatched as exc:
        raise ValidationError(str(exc)) from exc


def create_preset(actor: Actor, *, team: Team, name: str, description: str, options: dict, remedies=()) -> Preset:
    options = _with_values(options, {})
    validate_options(options)
    with transaction.atomic():
        preset = Preset.objects.create(
            slug=_unique_slug(name),
            name=name,
            description=description,
            options=options,
            remedies=list(remedies),
            team=team,
            created_by=actor.user,
        )
        record(actor, "preset.create", preset, team=team, changes={"options": options})
    return preset


def update_preset(actor: Actor, preset: Preset, **fields) -> Preset:
    if preset.builtin:
        raise ValidationError("Built-in presets are read-only; clone one to adapt it.")
    if "options" in fields:
        fields["options"] = _with_values(fields["options"], preset.options)
        validate_options(fields["options"])
    changes = {key: value for key, value in fields.items() if getattr(preset, key) != value}
    if not changes:
        return preset
    with transaction.atomic():
        for key, value in changes.items():
            setattr(preset, key, value)
        preset.save()
        # Written as text, where `record` could no longer find the secrets.
        shown = {key: redact_config(value) if key == "options" else value for key, value in changes.items()}
        record(actor, "preset.update", preset, team=preset.team, changes={k: str(v)[:500] for k, v in shown.items()})
    return preset


def clone_preset(actor: Actor, preset: Preset, *, team: Team, name: str | None = None) -> Preset:
    return create_preset(
        actor,
        team=team,
        name=name or f"{preset.name} (copy)",
        description=preset.description,
        options=dict(preset.options),
        remedies=preset.remedies,
    )


def delete_preset(actor: Actor, preset: Preset) -> None:
    if preset.builtin:
        raise ValidationError("Built-in presets cannot be deleted.")
    with transaction.atomic():
        record(actor, "preset.delete", preset, team=preset.team, changes={"options": preset.options})
        preset.delete()
